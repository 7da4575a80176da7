"""Network helpers for tests: free ports, the loopback interface, gloo devices."""

from __future__ import annotations

import socket
import sys
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from pyc10d.testing._dist import get_dist

#: Name of the loopback network interface.
LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"


def find_free_port() -> int:
    """Return a TCP port on localhost that was free a moment ago.

    Someone else may grab it before it is used; pair with
    :func:`~pyc10d.testing.retry_on_connect_failures`.
    """
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Device:
    """Where a gloo-style backend should listen: a network interface or a hostname."""

    interface: str | None = None
    hostname: str | None = None
    lazy_init: bool = False


def create_device(interface: str | None = None, lazy_init: bool = False) -> Any:
    """A transport device bound to ``interface`` (or to 127.0.0.1 when ``None``).

    Delegates to ``ProcessGroupGloo.create_device`` of the module under test
    (pyc10d, or torch.distributed when cross-checking) so the result can go into
    ``ProcessGroupGloo._Options()._devices``. Falls back to a plain
    :class:`Device` descriptor when that module has no such factory.
    """
    factory = getattr(getattr(get_dist(), "ProcessGroupGloo", None), "create_device", None)
    if interface is None or sys.platform == "win32":
        if factory is None:
            return Device(hostname="127.0.0.1", lazy_init=lazy_init)
        return factory(hostname="127.0.0.1", lazy_init=lazy_init)
    if factory is None:
        return Device(interface=interface, lazy_init=lazy_init)
    return factory(interface=interface, lazy_init=lazy_init)
