"""In-process transport: ranks are threads of one process, messages are memory copies.

All ranks of one world share a ``Hub``: one ``Mailbox`` per rank, found in a process-wide
registry. ``send`` looks in the receiver's mailbox for a posted receive and copies the payload
straight into its buffer; when none is posted yet it copies the payload once into the
receiver's unexpected queue (``send`` may not keep the caller's buffer). Either way a message
is copied exactly once and ``send`` never waits for the receiver.

Rendezvous: the ranks agree on a hub through the store they were given. The n-th rank to
join (counter ``threaded/joined``) belongs to generation ``n // size``, so a store reused for a
second ``init_process_group`` gets a fresh hub; the first rank of a generation publishes a
random hub id under ``threaded/<gen>`` with ``compare_set`` and the others read it back. A rank
of another process would not find the id in its registry, and says so.

Failure: ``close`` tells the peers this rank is gone (their receives from it fail, as a closed
TCP connection would); ``terminate`` fails every pending and future receive of the world at
once, which is how the test harness releases the other ranks when one of them raised.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from datetime import timedelta

from .. import threads
from ..errors import DistBackendError, DistNetworkError
from ..store.base import Store, store_chain
from .base import Mailbox, RecvHandle, Transport, abort_error, deliver_copy, lost_error
from .pool import GIL_FREE_COPY, PayloadPool, copy_bytes


def _copy_of(pool: PayloadPool, data: memoryview) -> bytes | memoryview:
    """The sender's bytes, held for a receive not posted yet (large ones in a pooled buffer)."""
    if len(data) < GIL_FREE_COPY:  # small: a plain copy; large ones copy without the GIL
        return bytes(data)
    held = pool.acquire(len(data))
    copy_bytes(held, data)
    return held


class Hub:
    """The shared state of one threaded world: ``size`` mailboxes and who has left."""

    def __init__(self, hub_id: str, size: int, root_store: Store) -> None:
        self.id = hub_id
        self.size = size
        self.mailboxes = [Mailbox(size) for _ in range(size)]
        self.joined: set[int] = set()
        self.left: set[int] = set()
        self.terminated: BaseException | None = None
        self.root_store = weakref.ref(root_store) if _weakrefable(root_store) else lambda: root_store

    def terminate(self, error: BaseException) -> None:
        """Fail every pending and future receive of every rank with ``error``."""
        with _registry_lock:
            if self.terminated is not None:
                return
            self.terminated = error
        for box in self.mailboxes:
            box.fail_all(error)


_registry_lock = threading.Lock()
threads.renew_after_fork(globals(), _registry_lock=threading.Lock)
_hubs: dict[str, Hub] = {}


def _weakrefable(obj: object) -> bool:
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True


def root_store(store: Store) -> Store:
    """The store below any number of ``PrefixStore`` wrappers."""
    *_, root = store_chain(store)
    return root


def _join(store: Store, rank: int, size: int) -> Hub:
    gen = (store.add("threaded/joined", 1) - 1) // size
    mine = uuid.uuid4().hex
    with _registry_lock:  # the winner registers its hub before any other thread can look
        hub_id = store.compare_set(f"threaded/{gen}", "", mine).decode()
        if hub_id == mine:
            _hubs[hub_id] = Hub(hub_id, size, root_store(store))
        hub = _hubs.get(hub_id)
        if hub is None:
            raise DistBackendError(
                f"threaded backend: rank {rank} joined a world started in another process; "
                f"the ranks of a threaded world must be threads of one process"
            )
        if hub.size != size:
            raise DistBackendError(
                f"threaded backend: rank {rank} was given world_size {size}, but the ranks that "
                f"joined before it were given {hub.size}"
            )
        if rank in hub.joined:
            raise DistBackendError(
                f"threaded backend: two threads joined the same world as rank {rank}"
            )
        hub.joined.add(rank)
    return hub


def terminate(store: Store, error: BaseException) -> int:
    """Terminate every live hub whose ranks met through ``store`` (or a prefix of it).

    Returns how many hubs were terminated. Used by the test harness: once a rank-thread has
    raised, no other rank of its worlds can block on it any more.
    """
    base = root_store(store)
    with _registry_lock:
        hubs = [h for h in _hubs.values() if h.root_store() is base]
    for hub in hubs:
        hub.terminate(error)
    return len(hubs)


class ThreadedTransport(Transport):
    """Endpoint ``rank`` of a world whose ranks are threads of this process."""

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta | None = None) -> None:
        self.rank, self.size = rank, size
        self.hub = _join(store, rank, size)
        self.mailbox = self.hub.mailboxes[rank]
        self._closed = False

    def send(self, peer: int, channel: int, data: memoryview, meta: int = 0) -> None:
        hub = self.hub
        if hub.terminated is not None:
            raise hub.terminated
        if peer in hub.left:
            raise lost_error(peer, "it shut down its process group")
        box = hub.mailboxes[peer]
        handle = box.take_posted(self.rank, channel)
        if handle is None:
            box.arrived(self.rank, channel, _copy_of(box.pool, data), meta)
        else:
            deliver_copy(handle, data, meta)

    def irecv(self, peer: int, channel: int, buf: memoryview) -> RecvHandle:
        handle = RecvHandle(buf, peer, channel)
        self.mailbox.post(handle)
        return handle

    def abort(self, namespace: int, reason: str, peers: list[int]) -> None:
        for peer in peers:
            if peer != self.rank:
                self.hub.mailboxes[peer].abort(namespace, abort_error(self.rank, reason))

    def is_alive(self, peer: int) -> bool:
        return peer not in self.hub.left and self.hub.terminated is None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        hub = self.hub
        with _registry_lock:
            hub.left.add(self.rank)
            if hub.left >= set(range(hub.size)):
                _hubs.pop(hub.id, None)
        gone = lost_error(self.rank, "it shut down its process group")
        for peer, box in enumerate(hub.mailboxes):
            if peer != self.rank:
                box.peer_lost(self.rank, gone)
        self.mailbox.fail_all(DistNetworkError(f"rank {self.rank}: transport closed"))


__all__ = ["Hub", "ThreadedTransport", "root_store", "terminate"]
