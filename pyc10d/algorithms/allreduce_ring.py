"""all_reduce, pipelined ring: reduce-scatter then all-gather over n blocks of the buffer.

Cost: 2(n-1) steps; each rank sends and receives 2(n-1)/n·S bytes — the bandwidth optimum —
and reduces (n-1)/n·S. Used for large S. The two phases form one pipeline: a segment of
block r is sent into the all-gather the moment its reduction finishes. All ranks end with
identical bytes because each block is reduced once, on its owner, then copied around.
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .allgather_ring import finish_allgather_ring, post_allgather_ring
from .comm import Comm
from .reduce_scatter_ring import reduce_scatter_ring


def allreduce_ring(comm: Comm, t: torch.Tensor, op: ReduceOp) -> None:
    n, r = comm.size, comm.rank
    if n == 1:
        return
    blocks = list(t.reshape(-1).tensor_split(n))
    right = (r + 1) % n
    posted: list = []

    def post_gather() -> None:
        posted.extend(post_allgather_ring(comm, blocks))

    def forward(segment: torch.Tensor) -> None:
        comm.send(right, segment)

    reduce_scatter_ring(comm, blocks, blocks[r], op, post_gather, forward)
    finish_allgather_ring(comm, posted)
