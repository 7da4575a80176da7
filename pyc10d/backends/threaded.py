"""The threaded backend: the collective engine over a ``ThreadedTransport``.

Every rank is a thread of one process (each with its own ``World``, see
``world.set_thread_world``); the algorithms, ordering and failure handling are the same code
that runs over TCP, only the bytes move by memory copy. Sub-groups share the world's transport.
"""

from __future__ import annotations

from datetime import timedelta

from ..store.base import Store
from ..transport.threaded import ThreadedTransport
from .engine import Engine
from .options import Options


class ThreadedBackend(Engine):
    backend_name = "threaded"

    @classmethod
    def create(
        cls, store: Store, rank: int, size: int, timeout: timedelta, group_name: str
    ) -> ThreadedBackend:
        transport = ThreadedTransport(store, rank, size, timeout)
        options = Options(timeout)
        options.backend = cls.backend_name
        return cls(transport, list(range(size)), rank, group_name, options, owns_transport=True)
