"""all_gather, flat exchange: every rank sends its block to every other rank.

Cost: 1 step; (n-1)·B bytes sent and received per rank. Lowest latency for small blocks.
"""

from __future__ import annotations

import torch

from .comm import Comm


def allgather_direct(comm: Comm, blocks: list[torch.Tensor]) -> None:
    n, r = comm.size, comm.rank
    pending = [comm.irecv(p, blocks[p]) for p in range(n) if p != r]
    for step in range(1, n):
        comm.send((r + step) % n, blocks[r])
    for p in pending:
        p.wait()
