"""all_gather, ring: rank r starts with block r filled and ends with all n blocks.

Cost: n-1 steps; each rank sends and receives (n-1)·B bytes (B = one block), straight into
the output blocks (no staging copy). Bandwidth-optimal for large blocks.
"""

from __future__ import annotations

import torch

from .comm import Comm


def allgather_ring(comm: Comm, blocks: list[torch.Tensor]) -> None:
    n, r = comm.size, comm.rank
    left, right = (r - 1) % n, (r + 1) % n
    for k in range(n - 1):
        pending = comm.irecv(left, blocks[(r - k - 1) % n])
        comm.send(right, blocks[(r - k) % n])
        pending.wait()
