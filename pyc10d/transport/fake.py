"""A transport that connects nobody, for the fake backend (which never sends a byte).

Any use is a bug in the caller, so every data call fails loudly instead of hanging.
"""

from __future__ import annotations

from ..errors import DistBackendError
from .base import RecvHandle, Transport


class FakeTransport(Transport):
    """Endpoint ``rank`` of a pretend world of ``size`` ranks."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def send(self, peer: int, channel: int, data: memoryview, meta: int = 0) -> None:
        raise DistBackendError("fake transport: the fake backend moves no data")

    def irecv(self, peer: int, channel: int, buf: memoryview) -> RecvHandle:
        raise DistBackendError("fake transport: the fake backend moves no data")

    def abort(self, namespace: int, reason: str, peers: list[int]) -> None:
        pass

    def close(self) -> None:
        pass
