"""At scale a tcp rank connects only to the peers its algorithms talk to.

16 tcp ranks (processes): after an 8-byte all_reduce, a broadcast and a barrier, every rank
holds at most 2·ceil(log2 16) = 8 peer connections (the logarithmic algorithms chosen above
``SMALL_WORLD``), where the flat ones would have connected every rank to all 15 others.
"""

from __future__ import annotations

import pytest
import torch
from _multirank import run_ranks

import pyc10d as dist

WORLD = 16
BOUND = 2 * 4


def _connections(rank: int, ws: int) -> list[int]:
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)
    assert t.tolist() == [float(sum(range(ws)))] * 2, t
    b = torch.full((4,), float(rank))
    dist.broadcast(b, src=3)
    assert b.tolist() == [3.0] * 4, b
    dist.barrier()
    transport = dist.group.WORLD._get_backend().transport
    mine = [p for p in range(ws) if p != rank and transport.is_connected(p)]
    # No rank may leave (its goodbye closes connections) before every rank has counted; a
    # second barrier talks to the same peers as the first, so it opens none.
    dist.barrier()
    return mine


@pytest.mark.timeout(90)
def test_sixteen_ranks_hold_logarithmic_connections() -> None:
    peers = run_ranks("tcp", WORLD, _connections, timeout=60)
    most = max(len(p) for p in peers)
    assert most <= BOUND, f"a rank holds {most} connections (bound {BOUND}): {peers}"
    assert min(len(p) for p in peers) >= 4, peers  # it did talk: log2(16) partners at least
