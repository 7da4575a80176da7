"""Windows over a transport's messages (tcp, and the threaded backend): a put is one message
that the target's receiving thread writes into the registered tensor itself.

Each window has two namespaces of its own on the transport. Puts travel in the first, where
the window installs a ``Sink`` (``transport/base.py``): the thread that reads a peer's stream
(its receiver thread, or a caller on the tcp lane) reads a put's payload straight into the
registered tensor at the offset the message carries, with no receive posted and nothing
called on the target. A put's channel is ``(namespace << 32) | (offset >> 32)`` and its meta
word the low 32 bits of the element offset. Nothing is pickled: a put's payload is the
source tensor's bytes.

Signals are empty messages in the second namespace, and ``wait_signal`` is an ordinary
receive of one: messages on a channel are matched first in, first out, so they count, and
a receive wakes the thread that reads that peer (the tcp lane parks it between synchronous
calls), fails when the peer is lost, and takes its timeout. A peer's stream is read in
order, so the puts it sent before a signal are in the tensor when the signal is received.
``tensor_deregister`` sends every peer a fence on the same streams and receives every
peer's: after it, nothing is in flight toward the tensor.

``map_remote_tensor`` maps only the caller's own rank: a peer's memory is reached only
through messages.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

import torch

from ..backends.base import group_key
from ..errors import DistInputError, DistNetworkError, DistTimeoutError
from .base import Shape, Window

SIGNAL, FENCE = 0, 1  # the low word of a signal's or a fence's channel
_EMPTY = memoryview(b"")
log = logging.getLogger("pyc10d")


def _bytes_of(t: torch.Tensor) -> memoryview:
    """A contiguous tensor's memory as writable bytes (any dtype: through a uint8 view)."""
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


class Landing:
    """The window's ``Sink``: where puts land."""

    def __init__(self, ranks: list[int], rank: int, group_name: str) -> None:
        self.group_of = {t: g for g, t in enumerate(ranks)}  # transport rank -> group rank
        self.rank, self.group_name = rank, group_name
        self.memory: memoryview | None = None
        self.item = 1

    def attach(self, tensor: torch.Tensor | None) -> None:
        self.memory = None if tensor is None else _bytes_of(tensor)
        self.item = 1 if tensor is None else tensor.element_size()

    def landing(self, peer: int, channel: int, nbytes: int, meta: int) -> memoryview | None:
        start = (((channel & 0xFFFFFFFF) << 32) | meta) * self.item
        memory = self.memory
        if memory is None or start + nbytes > len(memory):  # (the sender checked: not a pyc10d peer)
            log.warning("window of group %r, rank %d: dropped a put of %d bytes at byte %d from rank %d: "
                        "%s", self.group_name, self.rank, nbytes, start, self.group_of.get(peer, peer),
                        "no tensor registered" if memory is None else f"the tensor has {len(memory)} bytes")
            return None
        return memory[start:start + nbytes]


class MessageWindow(Window):
    kind = "messages"

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self._transport = engine.transport
        self._ranks = list(engine.ranks)
        name = f"{self.group_name}/window/{self.number}"
        self._puts, self._signals = group_key(f"{name}/put"), group_key(f"{name}/signal")
        self._landing = Landing(self._ranks, self.rank, self.group_name)
        self._own = {SIGNAL: 0, FENCE: 0}  # signals and fences this rank sent itself, not yet taken
        self._own_lock = threading.Lock()
        sinks = self._transport.mailbox.sinks
        if self._puts in sinks:
            raise RuntimeError(f"new_window: window #{self.number} of group {self.group_name!r} shares its "
                               "namespace with another window of this process; make it again")
        sinks[self._puts] = self._landing
        weakref.finalize(self, sinks.pop, self._puts, None)

    def _register(self, tensor: torch.Tensor) -> list[Shape]:
        self._landing.attach(tensor)  # before the exchange: a peer may put once it has it
        try:
            return self.shape_exchange(tensor)
        except BaseException:
            self._landing.attach(None)
            raise

    def _deregister(self) -> None:
        for dst in range(self.size):
            self._send_mark(dst, FENCE)
        for src in range(self.size):
            self._take(src, FENCE, float(self.engine.timeout_s), "tensor_deregister")
        self._landing.attach(None)

    def _put(self, flat: torch.Tensor, dst: int, offset: int) -> None:
        if dst == self.rank:
            tensor = self.tensor
            if tensor is not None:
                tensor.view(-1)[offset:offset + flat.numel()].copy_(flat)
            return
        channel = (self._puts << 32) | (offset >> 32)
        self._transport.send(self._ranks[dst], channel, _bytes_of(flat.contiguous()), offset & 0xFFFFFFFF)

    def _send_mark(self, dst: int, kind: int) -> None:
        if dst == self.rank:
            with self._own_lock:
                self._own[kind] += 1
            return
        self._transport.send(self._ranks[dst], (self._signals << 32) | kind, _EMPTY, 0)

    def _signal(self, dst: int) -> None:
        self._send_mark(dst, SIGNAL)

    def _take(self, src: int, kind: int, timeout: float, op: str) -> None:
        """Receive one ``kind`` from ``src`` (a signal: ``wait_signal``; a fence)."""
        if src == self.rank:
            deadline = time.monotonic() + timeout
            while not self._poll(src, kind):
                if time.monotonic() > deadline:
                    raise self.timed_out(src, timeout) if kind == SIGNAL else DistTimeoutError(
                        f"Window.{op}: rank {self.rank}: Timed out waiting for itself")
                time.sleep(0.001)
            return
        handle = self._transport.irecv(self._ranks[src], (self._signals << 32) | kind, memoryview(bytearray(0)))
        try:
            handle.wait(timeout)
        except DistTimeoutError:
            if self._transport.mailbox.withdraw(handle) or not handle.settle(timeout):
                what = "a signal" if kind == SIGNAL else "its fence (tensor_deregister)"
                raise DistTimeoutError(f"Window.{op}: rank {self.rank} of group {self.group_name!r}: Timed out "
                                       f"after {timeout:.1f}s waiting for {what} from rank {src}") from None
            handle.wait(0)  # a message took it as the wait gave up: that is the signal
        except DistNetworkError as e:
            raise DistNetworkError(f"Window.{op}: rank {self.rank} of group {self.group_name!r}: rank {src} "
                                   f"was lost while this rank waited for it ({e})") from None

    def _poll(self, src: int, kind: int = SIGNAL) -> bool:
        if src == self.rank:
            with self._own_lock:
                if self._own[kind]:
                    self._own[kind] -= 1
                    return True
            return False
        got = self._transport.mailbox.take_unexpected(self._ranks[src], (self._signals << 32) | kind,
                                                      memoryview(bytearray(0)))
        return got is not None

    def _wait_signal(self, src: int, timeout: float) -> None:
        self._take(src, SIGNAL, timeout, "wait_signal")

    def _poll_signal(self, src: int) -> bool:
        return self._poll(src)

    def _map(self, rank: int) -> torch.Tensor:
        if rank == self.rank:
            tensor = self.tensor
            if tensor is not None:
                return tensor
        raise DistInputError(
            f"Window.map_remote_tensor: rank {self.rank} cannot map rank {rank}'s tensor: this window of "
            f"group {self.group_name!r} moves bytes as messages ({self.engine.backend_name} backend), where "
            "only a rank's own tensor maps; use put and signal, or a group on backend 'shm' (one host), "
            "whose windows map every rank's tensor")
