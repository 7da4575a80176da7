"""The fake backend: one process plays rank ``r`` of ``n``; collectives move no data.

Every operation validates its arguments exactly as the real backends do, then completes at
once, leaving its output tensors as the caller passed them (their shapes and dtypes are the
ones a real run would produce, their values are not). Model code, shape checks and tracing
can so run in one process for any world size (torch's ``FakeProcessGroup``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..algorithms.comm import Comm
from ..store.base import Store
from ..transport.fake import FakeTransport
from . import checks as ck
from .base import Options
from .tcp import Backend
from .work import CompletedWork, Work


class FakeBackend(Backend):
    backend_name = "fake"

    @classmethod
    def create(
        cls, store: Store, rank: int, size: int, timeout: timedelta, group_name: str
    ) -> FakeBackend:
        options = Options(timeout)
        options.backend = cls.backend_name
        return cls(FakeTransport(rank, size), list(range(size)), rank, group_name, options)

    def _submit(
        self, opname: str, fn: Callable[[Comm], Any], outputs: Any, opts: Any = None, sync: bool = False
    ) -> Work:
        with self._lock:
            self._seq += 1
        return CompletedWork(opname, outputs)

    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> Work:  # noqa: N803 - torch's name
        t = ck.as_list(tensors)
        ck.check_single("send", t)
        return CompletedWork("send", t)

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> Work:  # noqa: N803 - torch's name
        t = ck.as_list(tensors)
        ck.check_single("recv", t)
        work = CompletedWork("recv", t)
        work._source_rank = srcRank
        return work

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Work:
        t = ck.as_list(tensors)
        ck.check_single("recv", t)
        return CompletedWork("recv", t)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        pass
