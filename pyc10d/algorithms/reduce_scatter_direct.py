"""reduce_scatter, flat exchange: rank j receives block j from every rank and reduces.

Cost: 1 step; each rank sends and receives (n-1)·B bytes. Reduction in rank order.
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .comm import Comm
from .reduce_ops import reduce_into


def reduce_scatter_direct(
    comm: Comm, inputs: list[torch.Tensor], output: torch.Tensor, op: ReduceOp
) -> None:
    n, r = comm.size, comm.rank
    bufs = [inputs[r] if p == r else torch.empty_like(inputs[r]) for p in range(n)]
    pending = [comm.irecv(p, bufs[p]) for p in range(n) if p != r]
    for step in range(1, n):
        dst = (r + step) % n
        comm.send(dst, inputs[dst])
    for p in pending:
        p.wait()
    out = output.reshape(-1)
    first = bufs[0].reshape(-1)
    if out.data_ptr() != first.data_ptr():
        out.copy_(first)
    for p in range(1, n):
        reduce_into(out, bufs[p].reshape(-1), op)
