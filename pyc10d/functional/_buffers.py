"""Recycled memory for the eager functional collectives' outputs.

Every functional collective returns a fresh tensor. A fresh allocation of a megabyte or more
is fresh pages from the kernel (glibc maps large blocks and gives them back when freed):
the first write to each 4 KiB page faults, and for a 1 MiB output that costs 3-10x the copy
itself (measured on this project's 2-core machine: 170-500 us vs 40-60 us). Training loops
call the same collectives with the same sizes step after step, so outputs are carved from a
small cache of storages instead, as torch's CUDA caching allocator does for GPU memory.

A cached storage is handed out again only when nothing else refers to it (its use count is
the cache's own reference): a tensor, a view, a numpy array or autograd's saved tensors all
keep it out of reuse. Sizes under ``MIN_BYTES`` come from the allocator as usual (its free
lists serve them without faults). The cache holds at most ``PYC10D_FUNCOL_CACHE_BYTES``
(default 256 MiB; 0 turns it off); ``empty_cache()`` lets go of what is not in use.
"""

from __future__ import annotations

import threading

import torch

from .. import settings, threads

MIN_BYTES = 64 * 1024
_CAP = settings.FUNCOL_CACHE_BYTES.get()
_use_count = torch._C._storage_Use_Count

_lock = threading.Lock()
threads.renew_after_fork(globals(), _lock=threading.Lock)
_by_size: dict[int, list[torch.UntypedStorage]] = {}  # nbytes -> storages of that size
_total = 0  # bytes held


def _free(s: torch.UntypedStorage) -> bool:
    return _use_count(s._cdata) == 1


def _evict(need: int) -> None:
    """Drop unused storages (any size) until ``need`` more bytes fit under the cap."""
    global _total
    for size, lst in list(_by_size.items()):
        for s in [s for s in lst if _free(s)]:
            if _total + need <= _CAP:
                return
            lst.remove(s)
            _total -= size
        if not lst:
            del _by_size[size]


def _storage(nbytes: int) -> torch.UntypedStorage | None:
    global _total
    with _lock:
        lst = _by_size.setdefault(nbytes, [])
        for s in lst:
            if _free(s) and s.nbytes() == nbytes:
                return s
        if _total + nbytes > _CAP:
            _evict(nbytes)
            if _total + nbytes > _CAP:
                return None
            lst = _by_size.setdefault(nbytes, [])
        s = torch.UntypedStorage(nbytes)
        lst.append(s)
        _total += nbytes
        return s


def empty(shape: list[int] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous CPU tensor of ``shape`` and ``dtype`` whose contents are undefined."""
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * dtype.itemsize
    s = _storage(nbytes) if _CAP and nbytes >= MIN_BYTES else None
    if s is None:
        return torch.empty(shape, dtype=dtype)
    return torch.empty(0, dtype=dtype).set_(s, 0, shape)


def empty_like(t: torch.Tensor, shape: list[int] | torch.Size | None = None) -> torch.Tensor:
    """``empty`` with ``t``'s dtype (and shape unless given), contiguous; a device other than
    the CPU, or a small size, is allocated as usual."""
    if shape is None:
        if t.numel() * t.element_size() < MIN_BYTES or t.device.type != "cpu" or not _CAP:
            return torch.empty_like(t, memory_format=torch.contiguous_format)
        shape = t.shape
    elif t.device.type != "cpu":
        return t.new_empty(shape)
    return empty(shape, t.dtype)


def copy_of(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` (detached) in recycled memory."""
    if t.numel() * t.element_size() < MIN_BYTES or not _CAP:  # one call instead of two
        d = t.detach() if t.requires_grad else t
        return d.clone(memory_format=torch.contiguous_format)
    out = empty_like(t)
    out.copy_(t.detach())
    return out


def empty_cache() -> None:
    """Let go of every cached storage nothing refers to."""
    global _total
    with _lock:
        _evict(_CAP + 1)


def cached_bytes() -> int:
    return _total
