"""broadcast, binomial scatter + logarithmic all-gather (van de Geijn).

Cost: 2·ceil(log2 n) steps; the root sends (n-1)/n·S in the scatter, every rank about
(n-1)/n·S in the all-gather: ~2S on the critical path against log2(n)·S for the binomial
tree, and log2 n steps where the flat scatter + ring needs n. For large S at scale.

Blocks are numbered from the root (virtual rank v = (r - root) mod n owns block v), so each
subtree of the scatter owns a contiguous run of the buffer and every message is a view.
"""

from __future__ import annotations

import torch

from .allgather_bruck import allgather_bruck
from .allgather_recursive_doubling import allgather_recursive_doubling
from .comm import Comm
from .pow2 import offset
from .rotated import RotatedComm


def broadcast_scatter_doubling(comm: Comm, t: torch.Tensor, root: int) -> None:
    n, r = comm.size, comm.rank
    if n == 1:
        return
    flat = t.reshape(-1)
    numel = flat.numel()
    v = (r - root) % n

    def span(lo: int, hi: int) -> torch.Tensor:
        return flat[offset(numel, n, lo):offset(numel, n, min(hi, n))]

    mask = 1
    while mask < n:
        if v & mask:
            comm.recv((r - mask) % n, span(v, v + mask))
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if v + mask < n:
            comm.send((r + mask) % n, span(v + mask, v + 2 * mask))
        mask >>= 1
    blocks = list(flat.tensor_split(n))
    gather = allgather_recursive_doubling if n & (n - 1) == 0 else allgather_bruck
    gather(RotatedComm(comm, root), blocks)
