"""``SymmetricMemory``: one rank's handle on an allocation that every rank of a group maps.

What a caller may rely on:

* ``get_buffer(r, ...)`` views rank ``r``'s memory directly: a write to it is a write into
  rank ``r``'s tensor, visible to ``r`` without any copy or message.
* ``put_signal(d)`` / ``wait_signal(s)`` count: every ``put_signal`` from ``s`` to ``d`` on a
  channel releases exactly one ``wait_signal(s)`` on ``d``, however far apart they run, so a
  rank may signal before its peer waits. Data written before ``put_signal`` is visible after
  the matching ``wait_signal`` (x86-64 keeps stores in order; see ``transport.shm.futex``).
* A wait spins for a few microseconds only when the host has a CPU per rank, then sleeps on a
  futex; it fails with the group's timeout naming the rank it waited for, and within a
  fraction of a second if that rank's process has died.

``put``/``get`` are the one-sided operations on top: a copy into (out of) a peer's memory at
an element offset, ``put`` optionally followed by a signal that says the data has landed.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..errors import DistNetworkError, DistTimeoutError
from . import _seam
from .alloc import (
    BARRIER_CHANNEL,
    REDUCE_CHANNEL,
    USER_CHANNELS,
    Mapping,
    exchange,
    get_state,
    lease,
    needed_bytes,
    pin_of,
)

SLICE = 0.1
_M = 0xFFFFFFFF


def _reached(value: int, target: int) -> bool:
    return ((value - target) & _M) < 0x80000000


class SymmetricMemory:
    """This rank's view of every rank's memory of one symmetric allocation.

    Not thread-safe: the signal counts it keeps assume one thread signals and waits at a time.
    """

    def __init__(self, mapping: Mapping) -> None:
        self._m = mapping

    def __repr__(self) -> str:
        m = self._m
        return (f"SymmetricMemory(group={m.group_name!r}, rank={m.rank}, world_size={m.world_size}, "
                f"buffer_size={m.data_bytes})")

    @property
    def rank(self) -> int:
        return self._m.rank

    @property
    def world_size(self) -> int:
        return self._m.world_size

    @property
    def group_name(self) -> str:
        return self._m.group_name

    @property
    def buffer_size(self) -> int:
        """Bytes of every rank's buffer (the allocation rounded up to whole pages)."""
        return self._m.data_bytes

    @property
    def buffer_ptrs(self) -> list[int]:
        """Address of each rank's buffer in this process."""
        return [seg.address for seg in self._m.segs]

    # -- memory ----------------------------------------------------------------------------------
    def get_buffer(self, rank: int, sizes: Any, dtype: torch.dtype, storage_offset: int = 0) -> torch.Tensor:
        """A contiguous tensor of ``sizes`` over rank ``rank``'s buffer, from element
        ``storage_offset`` (in elements of ``dtype``)."""
        m = self._m
        if not 0 <= rank < m.world_size:
            raise RuntimeError(f"get_buffer: rank {rank} is not in [0, {m.world_size})")
        sizes = tuple(int(s) for s in (sizes if isinstance(sizes, (tuple, list, torch.Size)) else (sizes,)))
        item = torch.empty((), dtype=dtype).element_size()
        start = int(storage_offset) * item
        end = start + math.prod(sizes) * item
        if storage_offset < 0 or end > m.data_bytes:
            raise RuntimeError(
                f"get_buffer: {sizes} of {dtype} at offset {storage_offset} needs bytes "
                f"[{start}, {end}) but the buffer has {m.data_bytes}")
        return m.data(rank)[start:end].view(dtype).view(sizes)

    def put(self, tensor: torch.Tensor, dst_rank: int, offset: int = 0, signal: bool = False,
            channel: int = 0) -> None:
        """Copy ``tensor`` into rank ``dst_rank``'s buffer at element ``offset``; with ``signal``,
        then ``put_signal(dst_rank, channel)`` so the peer can wait for it to land."""
        self.get_buffer(dst_rank, tensor.shape, tensor.dtype, offset).copy_(tensor)
        if signal:
            self.put_signal(dst_rank, channel)

    def get(self, src_rank: int, offset: int, out: torch.Tensor) -> torch.Tensor:
        """Copy ``out.numel()`` elements of rank ``src_rank``'s buffer from element ``offset``
        into ``out``; returns ``out``. The caller decides when the data is ready (a signal
        or barrier from ``src_rank``)."""
        out.copy_(self.get_buffer(src_rank, out.shape, out.dtype, offset))
        return out

    # -- signals -------------------------------------------------------------------------------
    def put_signal(self, dst_rank: int, channel: int = 0, timeout_ms: int = 0) -> None:
        """Release one ``wait_signal(src_rank=self.rank, channel)`` on ``dst_rank``. Never
        blocks (signals are counted, not flags a peer must clear first), so ``timeout_ms`` is
        there for torch's signature only."""
        self._signal(dst_rank, _user(channel))

    def wait_signal(self, src_rank: int, channel: int = 0, timeout_ms: int = 0) -> None:
        """Block until ``src_rank`` has sent one more signal on ``channel`` than consumed so far."""
        self._wait_for(src_rank, _user(channel), timeout_ms, f"wait_signal(src_rank={src_rank})")

    def poll_signal(self, src_rank: int, channel: int = 0) -> bool:
        """Take one signal from ``src_rank`` on ``channel`` if one is there, without waiting."""
        m, channel = self._m, _user(channel)
        if not 0 <= src_rank < m.world_size:
            raise RuntimeError(f"poll_signal: rank {src_rank} is not in [0, {m.world_size})")
        target = (m.consumed[channel][src_rank] + 1) & _M
        seg, i = m.word(m.rank, channel, src_rank)
        if not _reached(seg.words[i], target):
            return False
        m.consumed[channel][src_rank] = target
        return True

    def barrier(self, channel: int = 0, timeout_ms: int = 0) -> None:
        """Return once every rank of the group has entered this barrier. Barriers count on a
        channel of their own, apart from user signals; ``channel`` is accepted for torch's
        signature."""
        m = self._m
        for p in range(m.world_size):
            if p != m.rank:
                self._signal(p, BARRIER_CHANNEL)
        order = [(m.rank + k) % m.world_size for k in range(1, m.world_size)]
        for i, p in enumerate(order):  # a rank dying later in the order fails the wait too
            self._wait_for(p, BARRIER_CHANNEL, timeout_ms, "barrier", order[i:])

    def chunk_reduced(self) -> None:
        """Tell every peer that this rank's slice of the next chunk is reduced (see
        ``collectives.two_shot_all_reduce_``)."""
        for p in range(self._m.world_size):
            if p != self._m.rank:
                self._signal(p, REDUCE_CHANNEL)

    def chunks_reduced(self, src: int, most: int, block: bool) -> int:
        """How many more chunks ``src`` has reduced since the last call, at most ``most``
        (their signals are consumed); with ``block``, wait until there is at least one.

        Polling (``block=False``) is what lets a rank keep reducing while a peer is not
        running — on a host with fewer free cores than ranks — and sleep once at the end,
        instead of once per chunk."""
        m = self._m
        got = 0
        if block and most > 0:
            self._wait_for(src, REDUCE_CHANNEL, 0, "all_reduce")
            got = 1
        seg, i = m.word(m.rank, REDUCE_CHANNEL, src)
        consumed = m.consumed[REDUCE_CHANNEL][src]
        more = min((seg.words[i] - consumed) & _M, most - got)
        if more > 0:
            m.consumed[REDUCE_CHANNEL][src] = (consumed + more) & _M
            got += more
        return got

    def _signal(self, dst: int, channel: int) -> None:
        m = self._m
        if not 0 <= dst < m.world_size:
            raise RuntimeError(f"put_signal: rank {dst} is not in [0, {m.world_size})")
        value = m.posted[channel][dst] = (m.posted[channel][dst] + 1) & _M
        seg, i = m.word(dst, channel, m.rank)
        seg.words[i] = value
        _seam.futex_wake(seg.address + 4 * i)

    def _wait_for(self, src: int, channel: int, timeout_ms: int, what: str,
                  needed: list[int] | None = None) -> None:
        m = self._m
        if not 0 <= src < m.world_size:
            raise RuntimeError(f"{what}: rank {src} is not in [0, {m.world_size})")
        target = (m.consumed[channel][src] + 1) & _M
        seg, i = m.word(m.rank, channel, src)
        if not _reached(seg.words[i], target):
            timeout = timeout_ms / 1000 if timeout_ms > 0 else m.timeout
            self._block(seg, i, target, src, timeout, what, needed or [src])
        m.consumed[channel][src] = target

    def _block(self, seg: _seam.Segment, i: int, target: int, src: int, timeout: float, what: str,
               needed: list[int]) -> None:
        """Spin briefly (only with a CPU per rank), then sleep on the word's futex in slices,
        checking between slices whether the processes of ``needed`` are still alive."""
        m, words = self._m, seg.words
        if not m.oversubscribed:
            end = time.perf_counter() + m.spin_s
            while time.perf_counter() < end:
                if _reached(words[i], target):
                    return
        addr = seg.address + 4 * i
        deadline = time.monotonic() + timeout
        checked = 0.0
        while True:
            v = words[i]
            if _reached(v, target):
                return
            now = time.monotonic()
            if now - checked >= SLICE:
                checked = now
                dead = m.watch.dead(needed) if m.watch is not None else []
                if dead:
                    who = ", ".join(f"rank {m.members[q]} (pid {m.watch.pids[q]})" for q in dead)
                    raise DistNetworkError(
                        f"symmetric memory {what} in group {m.group_name!r}: rank "
                        f"{m.members[m.rank]}: {who} died while this rank waited for rank {m.members[src]}")
            if now >= deadline:
                raise DistTimeoutError(
                    f"symmetric memory {what} in group {m.group_name!r}: rank {m.members[m.rank]} "
                    f"timed out after {timeout:.1f}s waiting for rank {m.members[src]}")
            _seam.futex_wait(addr, v, min(SLICE, deadline - now))

    # -- torch's static entry points (``_SymmetricMemory.rendezvous(t)`` ...) --------------------
    @staticmethod
    def empty_strided_p2p(size: Any, stride: Any, dtype: torch.dtype, device: Any, group_name: str,
                          alloc_id: int | None = None) -> torch.Tensor:
        return empty_strided_p2p(size, stride, dtype, device, group_name, alloc_id)

    @staticmethod
    def rendezvous(tensor: torch.Tensor, group_name: str | None = None) -> SymmetricMemory:
        return rendezvous(tensor, group_name)

    @staticmethod
    def get_symmetric_memory(tensor: torch.Tensor) -> SymmetricMemory:
        return get_symmetric_memory(tensor)


def _user(channel: int) -> int:
    if not 0 <= channel < USER_CHANNELS:
        raise RuntimeError(f"signal channel {channel} is not in [0, {USER_CHANNELS})")
    return channel


def empty_strided_p2p(size: Any, stride: Any, dtype: torch.dtype, device: Any, group_name: str,
                      alloc_id: int | None = None) -> torch.Tensor:
    """A tensor in memory that every rank of ``group_name`` maps (collective: every rank calls
    it with the same sizes, in the same order). With ``alloc_id`` the memory is kept when the
    tensor goes and handed back (same ``data_ptr``, no collective) by the next call with that
    id; a second call while the first tensor is alive raises."""
    if torch.device(device).type != "cpu":
        raise RuntimeError(f"empty_strided_p2p: pyc10d's symmetric memory is CPU shared memory, got {device}")
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    state = get_state(group_name)
    nbytes = needed_bytes(size, stride, dtype)
    if alloc_id is not None and alloc_id in state.persistent:
        mapping = state.persistent[alloc_id]
        if mapping.lease is not None and mapping.lease() is not None:
            raise RuntimeError(
                f"empty_strided_p2p: persistent allocation {alloc_id} of group {group_name!r} is "
                f"still in use; free its tensor first")
        if nbytes > mapping.data_bytes:
            raise RuntimeError(
                f"empty_strided_p2p: persistent allocation {alloc_id} has {mapping.data_bytes} bytes, "
                f"{nbytes} requested")
        return lease(mapping, size, stride, dtype)
    mapping = exchange(state, nbytes)
    if alloc_id is not None:
        state.persistent[alloc_id] = mapping
    return lease(mapping, size, stride, dtype)


def rendezvous(tensor: torch.Tensor, group: Any = None) -> SymmetricMemory:
    """The handle of the allocation ``tensor`` lives in (made once, then the same object)."""
    pin = pin_of(tensor)
    if pin is None:
        raise RuntimeError(
            "rendezvous: the tensor is not in symmetric memory (allocate it with empty_strided_p2p)")
    name = getattr(group, "group_name", group)
    if name is not None and name != pin.mapping.group_name:
        raise RuntimeError(
            f"rendezvous: the tensor was allocated for group {pin.mapping.group_name!r}, not {name!r}")
    if pin.handle is None:
        pin.handle = SymmetricMemory(pin.mapping)
    return pin.handle


def get_symmetric_memory(tensor: torch.Tensor) -> SymmetricMemory:
    """The handle ``rendezvous(tensor)`` returned; RuntimeError before the rendezvous."""
    pin = pin_of(tensor)
    if pin is None or pin.handle is None:
        raise RuntimeError("get_symmetric_memory: no rendezvous has been done for this tensor")
    return pin.handle


def workspace(group_name: str, nbytes: int) -> SymmetricMemory:
    """The group's scratch allocation of at least ``nbytes`` (collective when it must grow)."""
    state = get_state(group_name)
    handle = state.workspace
    if handle is None or handle.buffer_size < nbytes:
        handle = state.workspace = SymmetricMemory(exchange(state, max(nbytes, 1 << 20)))
    return handle
