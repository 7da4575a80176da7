"""all_gather, pipelined ring: rank r starts with block r filled and ends with all n blocks.

Cost: n-1 steps; each rank sends and receives (n-1)·B bytes (B = one block), straight into
the output blocks (no staging copy). All receives are posted up front, and every segment
is forwarded as soon as it lands, so the ring runs as a pipeline.
"""

from __future__ import annotations

import torch

from .comm import Comm, PendingRecv
from .segments import segments


def post_allgather_ring(comm: Comm, blocks: list[torch.Tensor]) -> list[list[tuple[torch.Tensor, PendingRecv]]]:
    """Post every receive of the ring; step k lands block (r-k-1) mod n."""
    n, r = comm.size, comm.rank
    left = (r - 1) % n
    return [
        [(p, comm.irecv(left, p)) for p in segments(blocks[(r - k - 1) % n])] for k in range(n - 1)
    ]


def finish_allgather_ring(comm: Comm, posted: list[list[tuple[torch.Tensor, PendingRecv]]]) -> None:
    """Wait for each segment in order and forward it right, except at the last step."""
    right = (comm.rank + 1) % comm.size
    for k, step in enumerate(posted):
        forward = k < comm.size - 2
        for piece, pending in step:
            pending.wait()
            if forward:
                comm.send(right, piece)


def allgather_ring(comm: Comm, blocks: list[torch.Tensor]) -> None:
    n, r = comm.size, comm.rank
    if n == 1:
        return
    posted = post_allgather_ring(comm, blocks)
    right = (r + 1) % n
    for piece in segments(blocks[r]):
        comm.send(right, piece)
    finish_allgather_ring(comm, posted)
