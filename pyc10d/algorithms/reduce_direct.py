"""reduce, flat: every rank sends its buffer to the root, which reduces in rank order.

Cost: 1 step; the root receives (n-1)·S bytes. For small S.
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .comm import Comm
from .reduce_ops import reduce_into


def reduce_direct(comm: Comm, t: torch.Tensor, root: int, op: ReduceOp) -> None:
    n, r = comm.size, comm.rank
    if r != root:
        comm.send(root, t)
        return
    bufs = [t if p == r else torch.empty_like(t) for p in range(n)]
    pending = [comm.irecv(p, bufs[p]) for p in range(n) if p != r]
    for p in pending:
        p.wait()
    mine = t.clone() if root != 0 else t
    bufs[root] = mine
    if root != 0:
        t.copy_(bufs[0])
    for p in range(1, n):
        reduce_into(t, bufs[p], op)
