"""Shared index arithmetic of the logarithmic algorithms: powers of two, the *fold* of a
world that is not one, and the runs of blocks a message carries.

Fold (as MPICH does for recursive doubling and halving): with ``p`` the largest power of two
``<= n`` and ``rem = n - p``, the first ``2·rem`` ranks pair up (``2i``, ``2i+1``); the even
one hands its data to the odd one and sits out, so ``p`` *virtual* ranks remain: virtual
``v < rem`` is rank ``2v+1`` (standing for ``2v`` and ``2v+1``), virtual ``v >= rem`` is
rank ``v + rem``. Every rank computes the same mapping, so no message says who is who.
"""

from __future__ import annotations

import torch


def floor_pow2(n: int) -> int:
    """The largest power of two ``<= n`` (``n >= 1``)."""
    return 1 << (n.bit_length() - 1)


def ceil_log2(n: int) -> int:
    return (n - 1).bit_length()


def virtual(rank: int, rem: int) -> int:
    """This rank's virtual rank after the fold, or -1 for an even rank that sits out."""
    if rank < 2 * rem:
        return rank // 2 if rank % 2 else -1
    return rank - rem


def real(v: int, rem: int) -> int:
    """The rank that plays virtual rank ``v``."""
    return 2 * v + 1 if v < rem else v + rem


def first_rank(v: int, rem: int) -> int:
    """The lowest rank virtual rank ``v`` stands for (its blocks start there)."""
    return 2 * v if v < rem else v + rem


def offset(numel: int, parts: int, i: int) -> int:
    """Start of part ``i`` when ``numel`` elements are cut into ``parts`` near-equal parts
    (the first ``numel % parts`` one element longer, as ``tensor_split``). Arithmetic, not a
    list: at thousands of ranks a list of every block per call costs more than the call."""
    q, r = divmod(numel, parts)
    return i * q + min(i, r)


def run(blocks: list[torch.Tensor], lo: int, hi: int) -> torch.Tensor | None:
    """One tensor over ``blocks[lo:hi]`` when they lie back to back in memory (the blocks of
    a contiguous output, as the backends pass them), else None (the caller packs them)."""
    first = blocks[lo]
    if hi - lo == 1:
        return first.reshape(-1)
    total = 0
    dtype = first.dtype
    ptr = first.data_ptr()
    for i in range(lo, hi):
        b = blocks[i]
        k = b.numel()
        if k and (b.dtype != dtype or b.data_ptr() != ptr or not b.is_contiguous()):
            return None
        total += k
        ptr += k * b.element_size()
    if not first.is_contiguous():
        return None
    try:  # adjacent addresses outside ``first``'s storage: as_strided refuses, so pack
        return first.as_strided((total,), (1,), first.storage_offset())
    except RuntimeError:
        return None
