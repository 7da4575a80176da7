"""all_reduce, Rabenseifner: recursive-halving reduce-scatter, then recursive-doubling
all-gather, over ``p`` blocks of the buffer.

Cost (``p`` the largest power of two <= n): 2·log2(p) steps; each rank sends and receives
2(p-1)/p·S and reduces (p-1)/p·S — the ring's bytes in logarithmic rather than 2(n-1)
steps, with 2·log2(p) peers. A world that is not a power of two folds first (``pow2``): the
extra ranks send S in and get S back, two more steps. For medium and large S at scale.

Each block is reduced once, along one tree, always (lower group) op (upper group), then
copied: all ranks end with the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..types import ReduceOp
from .comm import Comm
from .pow2 import floor_pow2, offset, real, virtual
from .reduce_ops import reduce_pair


def halving(comm: Comm, flat: torch.Tensor, v: int, p: int, rem: int, op: ReduceOp,
            scratch: torch.Tensor, rank_of: Callable[[int, int], int] = real) -> None:
    """Recursive halving over ``p`` blocks of ``flat`` among the virtual ranks: afterwards
    virtual rank ``v`` holds block ``v`` reduced over all of them (other blocks: partial).
    ``rank_of(v, rem)``: the rank playing virtual rank ``v``."""
    numel = flat.numel()
    lo, hi = 0, p  # the blocks this rank still reduces
    mask = p >> 1
    while mask:
        mid = lo + mask
        keep, give = ((lo, mid), (mid, hi)) if v < mid else ((mid, hi), (lo, mid))
        peer = rank_of(v ^ mask, rem)
        a, b = offset(numel, p, keep[0]), offset(numel, p, keep[1])
        tmp = scratch[: b - a]
        pending = comm.irecv(peer, tmp)
        comm.send(peer, flat[offset(numel, p, give[0]):offset(numel, p, give[1])])
        pending.wait()
        mine = flat[a:b]
        if v & mask:
            reduce_pair(mine, tmp, mine, op)
        else:
            reduce_pair(mine, mine, tmp, op)
        lo, hi = keep
        mask >>= 1


def doubling(comm: Comm, flat: torch.Tensor, v: int, p: int, rem: int) -> None:
    """Recursive-doubling all-gather of the ``p`` blocks of ``flat`` (virtual rank ``v``
    holds block ``v``)."""
    numel = flat.numel()
    mask = 1
    while mask < p:
        base = v & ~(mask - 1)
        other = base ^ mask
        peer = real(v ^ mask, rem)
        pending = comm.irecv(peer, flat[offset(numel, p, other):offset(numel, p, other + mask)])
        comm.send(peer, flat[offset(numel, p, base):offset(numel, p, base + mask)])
        pending.wait()
        mask <<= 1


def allreduce_rabenseifner(comm: Comm, t: torch.Tensor, op: ReduceOp) -> None:
    n, r = comm.size, comm.rank
    if n == 1:
        return
    flat = t.reshape(-1)
    p = floor_pow2(n)
    rem = n - p
    # the first half of the blocks is the largest piece received (earlier blocks are longer)
    scratch = comm.scratch(0, flat.numel() if r < 2 * rem else offset(flat.numel(), p, p // 2), flat.dtype)
    if r < 2 * rem:
        if r % 2 == 0:
            comm.send(r + 1, flat)
            comm.recv(r + 1, flat)
            return
        buf = scratch[: flat.numel()]
        comm.recv(r - 1, buf)
        reduce_pair(flat, buf, flat, op)
    v = virtual(r, rem)
    halving(comm, flat, v, p, rem, op, scratch)
    doubling(comm, flat, v, p, rem)
    if r < 2 * rem:
        comm.send(r - 1, flat)
