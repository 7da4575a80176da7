"""all_to_all, pairwise exchange: at step k rank r sends to r+k and receives from r-k.

Cost: n-1 steps; each rank sends and receives the sum of its n-1 outgoing/incoming blocks.
All receives are posted first, so blocks land directly in the outputs.
"""

from __future__ import annotations

import torch

from .comm import Comm


def alltoall_pairwise(comm: Comm, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
    n, r = comm.size, comm.rank
    pending = [comm.irecv((r - k) % n, outputs[(r - k) % n]) for k in range(1, n)]
    outputs[r].copy_(inputs[r])
    for k in range(1, n):
        dst = (r + k) % n
        comm.send(dst, inputs[dst])
    for p in pending:
        p.wait()
