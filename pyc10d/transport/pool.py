"""Recycled buffers for messages that arrive before their receive is posted.

Such a message must be held somewhere until the receive comes. Allocating that buffer
fresh each time is what made large unexpected messages slow: glibc serves blocks of 32 MiB
and more with a new mmap, so every one costs a page fault per 4 KiB page on first touch
(about as long as copying the data twice), and a ``bytearray`` zero-fills on top. The pool
hands out uninitialised buffers and takes them back once the payload was copied out, so a
steady stream of same-sized messages (a broadcast loop, ring segments) touches warm pages.
"""

from __future__ import annotations

import threading

import torch

# Below this a fresh allocation is cheap (heap, warm pages) and pooling buys nothing.
POOL_MIN = 1 << 20
# Buffers kept per capacity and bytes kept in all; the rest goes back to the allocator.
_PER_SIZE = 4
_MAX_KEPT = 256 << 20
# From this size on, copies go through torch, which lets go of the GIL while copying.
GIL_FREE_COPY = 64 * 1024


def _capacity(nbytes: int) -> int:
    """Round up to a whole MiB, so near-equal sizes share buffers."""
    return -(-nbytes // POOL_MIN) * POOL_MIN


class PayloadPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[object]] = {}
        self._kept = 0
        self._lent: set[int] = set()  # ids of buffers out on loan: release takes only these

    def acquire(self, nbytes: int) -> memoryview:
        """A writable buffer of exactly ``nbytes`` (contents undefined)."""
        if nbytes < POOL_MIN:
            return memoryview(bytearray(nbytes))
        cap = _capacity(nbytes)
        with self._lock:
            free = self._free.get(cap)
            if free:
                backing = free.pop()
                self._kept -= cap
            else:
                backing = None
        if backing is None:
            backing = torch.empty(cap, dtype=torch.uint8).numpy()
        with self._lock:
            self._lent.add(id(backing))
        return memoryview(backing)[:nbytes]

    def release(self, view: memoryview | bytes | bytearray) -> None:
        """Take back a buffer from ``acquire`` once nothing reads it any more (others: ignored)."""
        if not isinstance(view, memoryview) or len(view) < POOL_MIN:
            return
        backing = view.obj
        cap = getattr(backing, "nbytes", 0)
        with self._lock:
            if id(backing) not in self._lent:
                return
            self._lent.discard(id(backing))
            free = self._free.setdefault(cap, [])
            if len(free) < _PER_SIZE and self._kept + cap <= _MAX_KEPT:
                free.append(backing)
                self._kept += cap


def copy_bytes(dst: memoryview, src: memoryview | bytes | bytearray) -> None:
    """``dst[:len(src)] = src``; large copies run without the GIL (other threads go on)."""
    n = len(src)
    if n < GIL_FREE_COPY or memoryview(src).readonly:  # torch.frombuffer needs writable memory
        dst[:n] = src
        return
    torch.frombuffer(dst, dtype=torch.uint8, count=n).copy_(torch.frombuffer(src, dtype=torch.uint8))
