"""The TCP backend: the collective engine over a ``TCPTransport`` (multi-host capable)."""

from __future__ import annotations

from datetime import timedelta

from ..store.base import Store
from ..transport.tcp import TCPTransport
from .base import Options
from .lane import LaneOps
from .ops import CollectiveOps
from .ops_gather import GatherOps
from .p2p import P2POps


class Backend(CollectiveOps, GatherOps, P2POps, LaneOps):
    """Every collective of a group, over any transport."""


class TCPBackend(Backend):
    backend_name = "tcp"

    @classmethod
    def create(cls, store: Store, rank: int, size: int, timeout: timedelta, group_name: str) -> TCPBackend:
        transport = TCPTransport(store, rank, size, timeout)
        return cls(transport, list(range(size)), rank, group_name, Options(timeout), owns_transport=True)
