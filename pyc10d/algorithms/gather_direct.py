"""gather, flat: every rank sends its tensor to the root, straight into the root's outputs.

Cost: 1 step; the root receives (n-1)·S bytes.
"""

from __future__ import annotations

import torch

from .comm import Comm


def gather_direct(comm: Comm, t: torch.Tensor, outputs: list[torch.Tensor] | None, root: int) -> None:
    n, r = comm.size, comm.rank
    if r != root:
        comm.send(root, t)
        return
    assert outputs is not None
    pending = [comm.irecv(p, outputs[p]) for p in range(n) if p != r]
    outputs[r].copy_(t)
    for p in pending:
        p.wait()
