"""scatter, flat: the root sends block j to rank j.

Cost: 1 step; the root sends (n-1)·S bytes, every other rank receives S.
"""

from __future__ import annotations

import torch

from .comm import Comm


def scatter_direct(comm: Comm, inputs: list[torch.Tensor] | None, out: torch.Tensor, root: int) -> None:
    n, r = comm.size, comm.rank
    if r != root:
        comm.recv(root, out)
        return
    assert inputs is not None
    for step in range(1, n):
        p = (root + step) % n
        comm.send(p, inputs[p])
    out.copy_(inputs[r])
