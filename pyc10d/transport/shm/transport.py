"""Shared-memory transport: tagged messages between ranks of one host, through ring buffers.

Set-up goes through the store: rank 0 creates one segment holding a control line per rank
and a single-producer/single-consumer byte ring per ordered pair of ranks, publishes its
name, and every rank maps it, publishes its pid and confirms; then the name is unlinked
(see ``segment``). Ring positions are 32-bit byte counters in shared memory — ``tail``
written only by the sender, ``head`` only by the receiver — each on its own cache line and
doubling as the futex the other side sleeps on.

A message is a 32-byte header (channel, nbytes, meta, kind) then the payload, padded to
32 bytes so headers never wrap. Large payloads stream through the ring in pieces. As in the
TCP transport, a receiver thread per peer drains its ring all the time (``send`` never waits
for a posted receive, only for ring space) and copies straight into the destination when
the receive was posted first. Collectives of the shm backend do not use the rings: they
run on a group arena (``arena``) that the rings only help to set up.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from datetime import timedelta

from ... import threads
from ...errors import DistBackendError, DistNetworkError, DistTimeoutError, with_message
from ...store.base import Store
from ..base import Mailbox
from ..framed import FramedTransport
from . import futex
from .segment import PeerWatch, Segment, new_name, unlink
from .segment import available as segment_dir_usable

_HEADER = struct.Struct("<QQII8x")  # 32 bytes
_HDR = _HEADER.size
_CTRL = 4096  # per-rank control line: word 0 closed flag
_RING_HDR = 128
_SLICE = 0.1
_M = 0xFFFFFFFF


#: Ring capacity per ordered pair in bytes (a power of two >= 1 KiB); None picks
#: ``_ring_bytes``'s default. Tests set it tiny to force streaming of large messages.
RING_BYTES: int | None = None


def _ring_bytes(size: int) -> int:
    """Ring capacity per ordered pair: 1 MiB up to a few ranks, less as pairs multiply."""
    if RING_BYTES is not None:
        return RING_BYTES
    cap = 1 << 20
    while cap > (64 << 10) and cap * size * (size - 1) > (16 << 20):
        cap //= 2
    return cap


def _pad(n: int) -> int:
    return (n + _HDR - 1) // _HDR * _HDR


class _Ring:
    """One direction of one pair: positions ``tail`` (sender) and ``head`` (receiver)."""

    def __init__(self, seg: Segment, offset: int, capacity: int) -> None:
        self.words = seg.words
        self.tail_i, self.head_i = offset // 4, (offset + 64) // 4
        self.tail_addr, self.head_addr = seg.address + offset, seg.address + offset + 64
        self.data = memoryview(seg.mm)[offset + _RING_HDR:offset + _RING_HDR + capacity]
        self.capacity = capacity
        self.mask = capacity - 1

    def put(self, pos: int, src: memoryview) -> None:
        off, n = pos & self.mask, len(src)
        first = min(n, self.capacity - off)
        self.data[off:off + first] = src[:first]
        if first < n:
            self.data[:n - first] = src[first:]

    def get(self, pos: int, dst: memoryview) -> None:
        off, n = pos & self.mask, len(dst)
        first = min(n, self.capacity - off)
        dst[:first] = self.data[off:off + first]
        if first < n:
            dst[first:] = self.data[:n - first]


class ShmTransport(FramedTransport):
    """``size`` ranks of one host connected by shared-memory rings, set up through ``store``."""

    HEADER = _HEADER

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta) -> None:
        if not (futex.available() and segment_dir_usable()):
            raise DistBackendError(
                "the shm backend needs Linux on x86-64 with a writable /dev/shm; use backend='tcp'"
            )
        self.rank, self.size = rank, size
        self.mailbox = Mailbox(size)
        self._closing = False
        self._send_locks = [threading.Lock() for _ in range(size)]
        self._threads: list[threading.Thread] = []
        self._ring_cap = _ring_bytes(size)
        self.pids = [0] * size
        self.segment = self._attach(store, timeout.total_seconds())
        self.watch = PeerWatch(self.pids, rank)
        self._out = [self._ring(rank, p) if p != rank else None for p in range(size)]
        self._in = [self._ring(p, rank) if p != rank else None for p in range(size)]
        self._out_tail = [0] * size
        for peer in range(size):
            if peer != rank:
                t = threads.start(self._receive_loop, f"pyc10d-shm-recv-{rank}<-{peer}", (peer,))
                self._threads.append(t)

    # -- set-up ---------------------------------------------------------------------------
    def _layout(self) -> int:
        pairs = self.size * (self.size - 1)
        return _CTRL * self.size + pairs * (_RING_HDR + self._ring_cap)

    def _ring(self, src: int, dst: int) -> _Ring:
        n = self.size
        index = src * (n - 1) + (dst if dst < src else dst - 1)
        return _Ring(self.segment, _CTRL * n + index * (_RING_HDR + self._ring_cap), self._ring_cap)

    def _attach(self, store: Store, timeout: float) -> Segment:
        deadline = time.monotonic() + timeout
        name = None
        try:
            if self.rank == 0:
                name = new_name("t")
                seg = Segment(name, self._layout(), create=True)
                store.set("shm/segment", name)
            else:
                self._wait_keys(store, ["shm/segment"], deadline, "rank 0 to create the segment")
                name = store.get("shm/segment").decode()
                seg = Segment(name, self._layout(), create=False)
            store.set(f"shm/pid/{self.rank}", str(os.getpid()))
            keys = [f"shm/pid/{p}" for p in range(self.size)]
            self._wait_keys(store, keys, deadline, "every rank to map the segment")
            self.pids = [int(v) for v in store.multi_get(keys)]
        finally:
            if name is not None:
                unlink(name)  # mapped by all (or failed): no name may outlive set-up
        return seg

    def _wait_keys(self, store: Store, keys: list[str], deadline: float, what: str) -> None:
        try:
            store.wait(keys, timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except DistTimeoutError as e:
            raise with_message(e, f"shm transport: rank {self.rank} timed out waiting for {what} ({e})") from e

    # -- sending ----------------------------------------------------------------------------
    def _send(self, peer: int, kind: int, channel: int, data: memoryview, meta: int) -> None:
        ring = self._out[peer]
        if ring is None:
            raise DistNetworkError(f"shm transport: rank {self.rank} cannot send to itself")
        with self._send_locks[peer]:
            if not self.is_alive(peer):
                raise self.mailbox.explain_loss(peer, "it is gone")
            n = len(data)
            pos = self._out_tail[peer]
            self._wait_space(ring, peer, pos, _HDR)
            ring.put(pos, memoryview(_HEADER.pack(channel, n, meta, kind)))
            pos += _HDR
            done, total = 0, _pad(n)
            while done < total:
                free = ring.capacity - ((pos - ring.words[ring.head_i]) & _M)
                want = min(total - done, ring.capacity // 4)
                if free < want:
                    self._publish(ring, peer, pos)
                    self._wait_space(ring, peer, pos, want)
                    continue
                if done < n:
                    ring.put(pos, data[done:min(n, done + want)])
                pos += want
                done += want
                if done < total:
                    self._publish(ring, peer, pos)
            self._publish(ring, peer, pos)

    def _publish(self, ring: _Ring, peer: int, pos: int) -> None:
        self._out_tail[peer] = pos
        ring.words[ring.tail_i] = pos & _M
        futex.wake(ring.tail_addr)

    def _wait_space(self, ring: _Ring, peer: int, pos: int, need: int) -> None:
        """Wait until ``need`` bytes from ``pos`` are free (the receiver drained enough)."""
        words = ring.words
        while True:
            head = words[ring.head_i]
            if ring.capacity - ((pos - head) & _M) >= need:
                return
            if self._peer_gone(peer):
                raise self.mailbox.explain_loss(peer, "it died")
            futex.wait(ring.head_addr, head, _SLICE)

    # -- receiving --------------------------------------------------------------------------
    def _receive_loop(self, peer: int) -> None:
        ring = self._in[peer]
        head = 0

        def read(view: memoryview, payload: bool) -> None:
            nonlocal head  # payloads are padded to whole headers in the ring
            head = self._take(ring, peer, head, view, _pad(len(view)) if payload else -1)

        self._pump(peer, read)

    def _take(self, ring: _Ring, peer: int, head: int, dst: memoryview, span: int = -1) -> int:
        """Copy ``len(dst)`` bytes from ``head`` into ``dst``, consume ``span`` bytes; new head."""
        n = len(dst)
        span = n if span < 0 else span
        done = 0
        words = ring.words
        while done < span:
            tail = words[ring.tail_i]
            avail = (tail - head) & _M
            if not avail:
                if self._closing:
                    raise DistNetworkError(f"rank {self.rank}: transport closed")
                if self._peer_gone(peer):
                    raise self.mailbox.explain_loss(peer, "its process died")
                futex.wait(ring.tail_addr, tail, _SLICE)
                continue
            k = min(avail, span - done)
            if done < n:
                ring.get(head, dst[done:min(n, done + k)])
            head += k
            done += k
            words[ring.head_i] = head & _M
            futex.wake(ring.head_addr)
        return head

    def _peer_gone(self, peer: int) -> bool:
        return peer in self.mailbox.dead or bool(self.watch.dead([peer]))

    # -- failure and shutdown -----------------------------------------------------------
    def is_alive(self, peer: int) -> bool:
        return peer not in self.mailbox.dead and peer not in self.watch.gone

    @property
    def closed(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        for peer in range(self.size):
            if peer != self.rank and self.is_alive(peer):
                self._say_bye(peer)
        self._closing = True
        for ring in self._in:
            if ring is not None:
                futex.wake(ring.tail_addr)
        deadline = time.monotonic() + 1.0
        for t in self._threads:
            t.join(timeout=max(deadline - time.monotonic(), 0.0))
        self.mailbox.fail_all(DistNetworkError(f"rank {self.rank}: transport closed"))
        self._out = self._in = []  # type: ignore[assignment]
        self.watch.close()
        self.segment.close()
