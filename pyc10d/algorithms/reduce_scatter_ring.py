"""reduce_scatter, ring: block j of the result ends on rank j.

Cost: n-1 steps; each rank sends and receives (n-1)/n·S bytes and reduces as many. At step k
rank r receives partial block (r-k-2) mod n from its left neighbour, adds its own input
block, and forwards the sum right in step k+1; the last step lands on block r. Inputs are
never written: partial sums live in two scratch blocks used in turn.
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .comm import Comm
from .reduce_ops import reduce_into


def reduce_scatter_ring(
    comm: Comm, inputs: list[torch.Tensor], output: torch.Tensor, op: ReduceOp
) -> None:
    """``inputs``: n contiguous blocks (same on every rank in size); ``output``: like block r."""
    n, r = comm.size, comm.rank
    if n == 1:
        if output.data_ptr() != inputs[0].data_ptr():
            output.copy_(inputs[0])
        return
    left, right = (r - 1) % n, (r + 1) % n
    biggest = max(b.numel() for b in inputs)
    dtype = inputs[0].dtype
    scratch = [torch.empty(biggest, dtype=dtype), torch.empty(biggest, dtype=dtype)]
    to_send = inputs[(r - 1) % n]
    for k in range(n - 1):
        j = (r - k - 2) % n
        tmp = scratch[k % 2][: inputs[j].numel()]
        pending = comm.irecv(left, tmp)
        comm.send(right, to_send)
        pending.wait()
        if k < n - 2:
            reduce_into(tmp, inputs[j].reshape(-1), op)
            to_send = tmp
    flat_out = output.reshape(-1)
    if output.data_ptr() != inputs[r].data_ptr():
        flat_out.copy_(inputs[r].reshape(-1))
    reduce_into(flat_out, tmp, op)
