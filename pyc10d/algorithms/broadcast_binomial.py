"""broadcast, binomial tree: ceil(log2 n) rounds, every rank sends to at most log2 n others.

Cost: ceil(log2 n) steps of S bytes; the root sends ceil(log2 n)·S, an inner rank up to
that, a leaf nothing. The latency optimum for small S; its log2(n)·S on the critical path
makes it lose to scatter + all-gather once S is large. Virtual rank v = (r - root) mod n
receives from v minus its lowest set bit and sends to v + 2^j for each 2^j below that bit,
the largest (deepest subtree) first.
"""

from __future__ import annotations

import torch

from .comm import Comm


def broadcast_binomial(comm: Comm, t: torch.Tensor, root: int) -> None:
    n, r = comm.size, comm.rank
    v = (r - root) % n
    mask = 1
    while mask < n:  # find the bit this rank receives on (the root: one past the top)
        if v & mask:
            comm.recv((r - mask) % n, t)
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if v + mask < n:
            comm.send((r + mask) % n, t)
        mask >>= 1
