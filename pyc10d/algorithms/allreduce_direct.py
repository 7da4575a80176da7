"""all_reduce, flat exchange: every rank sends its whole buffer to every other rank.

Cost: 1 step; each rank sends and receives (n-1)·S bytes. Best for small S, where one
round-trip beats the 2(n-1) steps of a ring. Every rank reduces the n contributions in
rank order, so all ranks get bit-identical results.
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .comm import Comm
from .reduce_ops import reduce_into


def allreduce_direct(comm: Comm, t: torch.Tensor, op: ReduceOp) -> None:
    n, r = comm.size, comm.rank
    if n == 1:
        return
    bufs: list[torch.Tensor | None] = [None] * n
    pending = []
    for p in range(n):
        if p != r:
            bufs[p] = torch.empty_like(t)
            pending.append(comm.irecv(p, bufs[p]))
    for step in range(1, n):
        comm.send((r + step) % n, t)
    for p in pending:
        p.wait()
    mine = t if r == 0 else t.clone()
    bufs[r] = mine
    if r != 0:
        t.copy_(bufs[0])
    for p in range(1, n):
        reduce_into(t, bufs[p], op)
