"""all_reduce, ring: reduce-scatter then all-gather over n blocks of the buffer.

Cost: 2(n-1) steps; each rank sends and receives 2(n-1)/n·S bytes — the bandwidth optimum —
and reduces (n-1)/n·S. Used for large S. All ranks end with identical bytes because each
block is reduced once, on its owner, then copied around.
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .allgather_ring import allgather_ring
from .comm import Comm
from .reduce_scatter_ring import reduce_scatter_ring


def allreduce_ring(comm: Comm, t: torch.Tensor, op: ReduceOp) -> None:
    if comm.size == 1:
        return
    blocks = list(t.reshape(-1).tensor_split(comm.size))
    reduce_scatter_ring(comm, blocks, blocks[comm.rank], op)
    allgather_ring(comm, blocks)
