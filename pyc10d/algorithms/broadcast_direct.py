"""broadcast, flat: the root sends the whole buffer to every other rank.

Cost: 1 step; the root sends (n-1)·S bytes, others receive S. Best for small S.
"""

from __future__ import annotations

import torch

from .comm import Comm


def broadcast_direct(comm: Comm, t: torch.Tensor, root: int) -> None:
    n, r = comm.size, comm.rank
    if r == root:
        for step in range(1, n):
            comm.send((root + step) % n, t)
    else:
        comm.recv(root, t)
