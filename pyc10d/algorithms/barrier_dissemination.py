"""barrier, dissemination: ceil(log2 n) rounds of one byte.

Cost: ceil(log2 n) steps; at round k rank r sends a byte to r + 2^k and waits for one from
r - 2^k (mod n), so 2·ceil(log2 n) peers per rank where the flat barrier talks to n-1.
After round k a rank has heard, directly or not, from the 2^(k+1) - 1 ranks before it; after
the last, from all: nobody leaves before everybody arrived.
"""

from __future__ import annotations

import torch

from .comm import Comm


def barrier_dissemination(comm: Comm) -> None:
    n, r = comm.size, comm.rank
    token = torch.zeros(1, dtype=torch.uint8)
    inbox = torch.empty(1, dtype=torch.uint8)
    d = 1
    while d < n:
        pending = comm.irecv((r - d) % n, inbox)
        comm.send((r + d) % n, token)
        pending.wait()
        d <<= 1
