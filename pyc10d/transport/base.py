"""The interface every transport implements: tagged point-to-point byte messages.

A transport connects ``size`` endpoints (ranks of one world) and moves raw bytes between
them. It knows nothing about collectives: algorithms and backends give each message a
64-bit *channel* (upper 32 bits: a namespace, e.g. one per process group; lower 32 bits:
one per operation) and a 32-bit *meta* word (the backends put a dtype code there), and a
receive matches the next message from that peer on that channel (FIFO per peer+channel).

Rules every implementation keeps, so algorithms can be written once:
- ``send`` never waits for the receiver to post a receive (no deadlock when two ranks send
  to each other first); it returns once ``data`` may be reused.
- ``irecv`` may be posted before or after the message arrives; when posted first, the
  payload lands directly in ``buf`` (zero-copy).
- A lost peer fails every pending and future receive from it with ``DistNetworkError``
  naming it; ``abort(namespace, reason)`` fails receives of that namespace on every peer.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

from ..errors import DistBackendError, DistNetworkError, DistTimeoutError
from .pool import PayloadPool, copy_bytes

NAMESPACE_SHIFT = 32
# ``irecv`` peer meaning "whichever peer sends first on this channel".
ANY_SOURCE = -1


def channel_namespace(channel: int) -> int:
    return channel >> NAMESPACE_SHIFT


class RecvHandle:
    """A posted receive. ``wait`` blocks (never spins) until the message is in ``buf``."""

    __slots__ = ("buf", "peer", "channel", "nbytes", "meta", "error", "_done", "truncated")

    def __init__(self, buf: memoryview, peer: int, channel: int) -> None:
        self.buf = buf
        self.peer = peer
        self.channel = channel
        self.nbytes = -1
        self.meta = 0
        self.truncated = False
        self.error: BaseException | None = None
        self._done = threading.Lock()
        self._done.acquire()

    def complete(self, nbytes: int, meta: int, truncated: bool = False) -> None:
        self.nbytes, self.meta, self.truncated = nbytes, meta, truncated
        self._done.release()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._done.release()

    def done(self) -> bool:
        return self.nbytes >= 0 or self.error is not None

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the message (or a failure); True once settled."""
        if not self._done.acquire(timeout=max(timeout, 0.0)):
            return False
        self._done.release()
        return True

    def wait(self, timeout: float | None) -> tuple[int, int]:
        """Return ``(nbytes, meta)`` of the message; raise on loss, abort or timeout.

        ``nbytes`` may differ from ``len(buf)`` (the caller checks): a larger message is
        dropped (``truncated``), a smaller one fills the front of ``buf``.
        """
        if not self._done.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            source = "any rank" if self.peer == ANY_SOURCE else f"rank {self.peer}"
            raise DistTimeoutError(
                f"timed out after {timeout:.1f}s waiting for {len(self.buf)} bytes from {source}"
            )
        self._done.release()
        if self.error is not None:
            raise self.error
        return self.nbytes, self.meta


class Transport(ABC):
    """``size`` connected endpoints; this one is ``rank``."""

    rank: int
    size: int

    @abstractmethod
    def send(self, peer: int, channel: int, data: memoryview, meta: int = 0) -> None: ...

    @abstractmethod
    def irecv(self, peer: int, channel: int, buf: memoryview) -> RecvHandle: ...

    @abstractmethod
    def abort(self, namespace: int, reason: str, peers: list[int]) -> None:
        """Tell ``peers`` that operations in ``namespace`` failed here, with ``reason``."""

    @abstractmethod
    def close(self) -> None: ...

    def is_alive(self, peer: int) -> bool:
        return True

    def probe(self, peer: int) -> None:
        """Start finding out whether ``peer`` is still there, without waiting (a transport
        that connects lazily connects; a loss then shows in ``is_alive``)."""
        return None  # connected up front: a loss shows by itself

    def cancel(self, namespace: int, error: BaseException) -> None:
        """Fail this endpoint's pending receives in ``namespace`` (no message to peers)."""
        mailbox = getattr(self, "mailbox", None)
        if mailbox is not None:
            mailbox.abort(namespace, error)

    def watch_unexpected(self, namespace: int, callback: Callable[[int, int, int], None] | None) -> None:
        """Call ``callback(peer, channel, meta)`` for each message of ``namespace`` that
        arrives before any receive asked for it (None stops); lets a backend look at messages
        it may never receive (a peer running another operation)."""
        mailbox = getattr(self, "mailbox", None)
        if mailbox is not None:
            mailbox.watch(namespace, callback)

    def unexpected_on(self, channel: int) -> list[tuple[int, int]]:
        """``(peer, meta)`` of the first waiting, not yet received message of each peer on
        ``channel``."""
        mailbox = getattr(self, "mailbox", None)
        return mailbox.unexpected_on(channel) if mailbox is not None else []

    def unexpected_from(self, peer: int, namespace: int) -> list[int]:
        """Channels of ``namespace`` on which messages from ``peer`` wait for a receive."""
        mailbox = getattr(self, "mailbox", None)
        return mailbox.unexpected_from(peer, namespace) if mailbox is not None else []


class Sink(Protocol):
    """Where the messages of one namespace land with no receive posted: a one-sided window
    (``window/messages.py``). The thread that reads a peer's stream (its receiver thread, or a
    caller on the tcp lane) puts each message's payload straight into ``landing``'s buffer, one
    message at a time in the order that peer sent them: a put is in place before the thread
    reads the peer's next message (its signal, say)."""

    def landing(self, peer: int, channel: int, nbytes: int, meta: int) -> memoryview | None:
        """The ``nbytes`` of memory the message goes into; None drops it (the sink says why)."""


class Mailbox:
    """Matching of arrived messages with posted receives, shared by transports.

    Per peer: ``posted[channel]`` holds receives waiting for data, ``unexpected[channel]``
    holds messages that came first. Both are FIFO, which keeps per-channel order. A receive
    from ``ANY_SOURCE`` waits in ``any_posted[channel]``; a message takes a receive posted
    for its own peer before an any-source one, and an any-source receive takes the earliest
    arrived message of its channel from whichever peer (its ``peer`` is then set to it).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.new_post = threading.Condition(self.lock)  # notified when a receive is queued
        self.posted: list[dict[int, list[RecvHandle]]] = [{} for _ in range(size)]
        self.any_posted: dict[int, list[RecvHandle]] = {}
        # (payload, meta, arrival number): the number orders messages of different peers.
        self.unexpected: list[dict[int, list[tuple[bytes | bytearray | memoryview, int, int]]]] = [
            {} for _ in range(size)
        ]
        self._arrivals = 0
        self.dead: dict[int, BaseException] = {}
        # Root cause (see ``explain_loss``): when each peer was lost, which peers said goodbye
        # (a clean shutdown is never the root cause), and what each peer gave as its reason
        # when it aborted a group.
        self.dead_at: dict[int, float] = {}
        self.said_bye: set[int] = set()
        self.abort_reasons: dict[int, str] = {}
        self.aborted: dict[int, BaseException] = {}
        # Buffers for messages that come before their receive (see ``pool``).
        self.pool = PayloadPool()
        self.watchers: dict[int, Callable[[int, int, int], None]] = {}
        self.waiting_unexpected = 0  # messages in ``unexpected``, for a lock-free "none" check
        self.sinks: dict[int, Sink] = {}  # namespace -> where its messages land (``Sink``)

    def watch(self, namespace: int, callback: Callable[[int, int, int], None] | None) -> None:
        if callback is None:
            self.watchers.pop(namespace, None)
        else:
            self.watchers[namespace] = callback

    def unexpected_on(self, channel: int) -> list[tuple[int, int]]:
        if not self.waiting_unexpected:  # the common case, without taking the lock
            return []
        with self.lock:
            return [(peer, q[channel][0][1]) for peer, q in enumerate(self.unexpected) if q.get(channel)]

    def unexpected_from(self, peer: int, namespace: int) -> list[int]:
        if not self.waiting_unexpected:
            return []
        with self.lock:
            return [c for c, q in self.unexpected[peer].items() if q and channel_namespace(c) == namespace]

    def post(self, handle: RecvHandle) -> None:
        peer, channel = handle.peer, handle.channel
        with self.lock:
            if peer == ANY_SOURCE:
                peer = self._earliest_unexpected(channel)
            got = self._pop_unexpected(peer, channel) if peer != ANY_SOURCE else None
            if got is not None:
                data, meta = got
                handle.peer = peer
            else:
                err = self.aborted.get(channel_namespace(channel)) or self._lost(peer)
                if err is None:
                    waiting = self.any_posted if peer == ANY_SOURCE else self.posted[peer]
                    waiting.setdefault(channel, []).append(handle)
                    self.new_post.notify_all()
                    return
                handle.fail(err)
                return
        deliver_copy(handle, data, meta)
        self.pool.release(data)

    def _pop_unexpected(self, peer: int, channel: int) -> tuple[bytes | bytearray | memoryview, int] | None:
        """Under the lock: the first message from ``peer`` on ``channel`` that no receive took
        yet, out of the queue (``(payload, meta)``), or None."""
        queue = self.unexpected[peer].get(channel)
        if not queue:
            return None
        data, meta, _ = queue.pop(0)
        self.waiting_unexpected -= 1
        if not queue:
            del self.unexpected[peer][channel]
        return data, meta

    def _earliest_unexpected(self, channel: int) -> int:
        best, first = ANY_SOURCE, None
        for peer, per_peer in enumerate(self.unexpected):
            queue = per_peer.get(channel)
            if queue and (first is None or queue[0][2] < first):
                best, first = peer, queue[0][2]
        return best

    def _lost(self, peer: int) -> BaseException | None:
        """Why a receive from ``peer`` can never complete (any source: every peer is gone)."""
        if peer != ANY_SOURCE:
            return self.dead.get(peer)
        if self.dead and len(self.dead) >= self.size - 1:
            return next(iter(self.dead.values()))
        return None

    def _pop_posted(self, peer: int, channel: int) -> RecvHandle | None:
        """Under the lock: the receive a message from ``peer`` on ``channel`` fills, if any."""
        for waiting in (self.posted[peer], self.any_posted):
            queue = waiting.get(channel)
            if queue:
                handle = queue.pop(0)
                if not queue:
                    del waiting[channel]
                handle.peer = peer
                return handle
        return None

    def take_unexpected(self, peer: int, channel: int, buf: memoryview) -> tuple[int, int] | None:
        """The first message from ``peer`` on ``channel`` that came before any receive, copied
        into ``buf`` (``(nbytes, meta)``; a longer one is dropped, its length says so), or
        None if there is none. For a receiver that reads the socket itself (``direct``)."""
        with self.lock:
            got = self._pop_unexpected(peer, channel)
        if got is None:
            return None
        data, meta = got
        n = len(data)
        if n and n <= len(buf):
            copy_bytes(buf, data)
        self.pool.release(data)
        return n, meta

    def withdraw(self, handle: RecvHandle) -> bool:
        """Take back a posted receive no message has taken (its waiter gave up, and a later
        message must wait for the next receive); False if a message took it meanwhile."""
        with self.lock:
            waiting = self.any_posted if handle.peer == ANY_SOURCE else self.posted[handle.peer]
            queue = waiting.get(handle.channel)
            if not queue or handle not in queue:
                return False
            queue.remove(handle)
            if not queue:
                del waiting[handle.channel]
            return True

    def take_posted(self, peer: int, channel: int, wait: float = 0.0) -> RecvHandle | None:
        """The receive for a message from ``peer`` on ``channel``; if none is posted yet,
        give the receiver up to ``wait`` seconds to post one (``None`` if it does not)."""
        with self.lock:
            handle = self._pop_posted(peer, channel)
            if handle is not None or wait <= 0:
                return handle
            deadline = time.monotonic() + wait
            while handle is None:
                left = deadline - time.monotonic()
                if left <= 0 or not self.new_post.wait(left):
                    return self._pop_posted(peer, channel)
                handle = self._pop_posted(peer, channel)
            return handle

    def sink_of(self, channel: int) -> Sink | None:
        """The sink of ``channel``'s namespace, if a window has one there."""
        return self.sinks.get(channel >> NAMESPACE_SHIFT) if self.sinks else None

    def arrived(self, peer: int, channel: int, data: bytes | bytearray | memoryview, meta: int) -> None:
        """A whole message arrived with no receive posted when it started; match or queue it
        (or, in a sink's namespace, copy it where the sink says)."""
        if self.sinks:
            sink = self.sink_of(channel)
            if sink is not None:
                n = len(data)
                view = sink.landing(peer, channel, n, meta)
                if view is not None and n:
                    copy_bytes(view, data)
                self.pool.release(data)
                return
        with self.lock:
            handle = self._pop_posted(peer, channel)
            if handle is None:
                self._arrivals += 1
                self.unexpected[peer].setdefault(channel, []).append((data, meta, self._arrivals))
                self.waiting_unexpected += 1
        if handle is None:
            watcher = self.watchers.get(channel_namespace(channel))
            if watcher is not None:
                watcher(peer, channel, meta)
            return
        deliver_copy(handle, data, meta)
        self.pool.release(data)

    def explain_loss(self, peer: int, detail: str) -> BaseException:
        """The error for losing ``peer``, naming the root cause when it is another rank.

        A rank that fails tells its peers why (an abort frame) and exits; its peers then see
        its connection close. Blaming it would hide the rank that failed first, so: a peer
        that aborted is reported with its reason, and a peer lost after another peer died
        (without a goodbye) is reported after that earlier death.
        """
        with self.lock:
            known = self.dead.get(peer)
            if known is not None:
                return known
            return self._explain(peer, detail)

    def _explain(self, peer: int, detail: str) -> BaseException:
        reason = self.abort_reasons.get(peer)
        if reason is not None:
            return lost_error(peer, f"after it aborted: {reason}")
        earlier = [(t, p) for p, t in self.dead_at.items() if p != peer and p not in self.said_bye]
        if earlier:
            first = min(earlier)[1]
            return lost_error(peer, f"{detail}), after rank {first} was lost ({self.dead[first]}")
        return lost_error(peer, detail)

    def peer_said_bye(self, peer: int) -> None:
        with self.lock:
            self.said_bye.add(peer)

    def peer_aborted(self, peer: int, reason: str) -> None:
        with self.lock:
            self.abort_reasons[peer] = reason

    def peer_lost(self, peer: int, error: BaseException | str) -> None:
        """``peer`` is gone: fail its receives; ``error`` as a string is the detail of an
        unexplained loss (``explain_loss`` words it)."""
        with self.lock:
            if isinstance(error, str):
                error = self.dead.get(peer) or self._explain(peer, error)
            if peer not in self.dead:
                self.dead[peer] = error
                self.dead_at[peer] = time.monotonic()
            pending = [h for q in self.posted[peer].values() for h in q]
            self.posted[peer].clear()
            if self._lost(ANY_SOURCE) is not None:
                pending.extend(h for q in self.any_posted.values() for h in q)
                self.any_posted.clear()
        for h in pending:
            h.fail(error)

    def abort(self, namespace: int, error: BaseException) -> None:
        with self.lock:
            self.aborted.setdefault(namespace, error)
            pending = []
            for waiting in (*self.posted, self.any_posted):
                for channel in [c for c in waiting if channel_namespace(c) == namespace]:
                    pending.extend(waiting.pop(channel))
        for h in pending:
            h.fail(error)

    def fail_all(self, error: BaseException) -> None:
        for peer in range(len(self.posted)):
            self.peer_lost(peer, error)


def deliver_copy(handle: RecvHandle, data: bytes | bytearray | memoryview, meta: int) -> None:
    n = len(data)
    if n > len(handle.buf):
        handle.complete(n, meta, truncated=True)
        return
    if n:
        copy_bytes(handle.buf, data)
    handle.complete(n, meta)


def abort_error(peer: int, reason: str) -> DistBackendError:
    return DistBackendError(f"aborted by rank {peer}: {reason}")


def lost_error(peer: int, detail: str) -> DistNetworkError:
    return DistNetworkError(f"rank {peer} closed its connection ({detail})")
