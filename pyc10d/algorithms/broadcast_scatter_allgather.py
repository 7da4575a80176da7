"""broadcast, scatter + ring all-gather: the root sends block j to rank j, then a ring.

Cost: 1 + (n-1) steps; the root sends (n-1)/n·S bytes in the scatter and every rank moves
(n-1)/n·S in the ring — no rank sends (n-1)·S as in the flat broadcast. For large S.
"""

from __future__ import annotations

import torch

from .allgather_ring import allgather_ring
from .comm import Comm


def broadcast_scatter_allgather(comm: Comm, t: torch.Tensor, root: int) -> None:
    n, r = comm.size, comm.rank
    if n == 1:
        return
    blocks = list(t.reshape(-1).tensor_split(n))
    if r == root:
        for p in range(n):
            if p != root:
                comm.send(p, blocks[p])
    else:
        comm.recv(root, blocks[r])
    allgather_ring(comm, blocks)
