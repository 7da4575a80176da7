"""How long a peer may stay silent before it is named: ``PYC10D_PEER_TIMEOUT_S``.

Over a network a failure is not always a closed connection: a cable pulled, a firewall rule
changed or a host frozen drops packets with no reset, and a rank waiting on such a peer would
learn of it only when its collective's timeout (30 minutes by default) expires. Three
mechanisms together bound that wait by ``peer_timeout()`` (default 15 s; 0 turns them off):

* the kernel's keepalive (``SO_KEEPALIVE``, ``TCP_KEEPIDLE`` = T/3, ``TCP_KEEPINTVL`` = T/6)
  probes a connection on which nothing moves, e.g. a rank blocked in a receive or a store
  ``get``, and gives up when the peer's host stops answering;
* ``TCP_USER_TIMEOUT`` = T fails a connection whose sent data stays unacknowledged that long
  (the kernel's own default retries for about 15 minutes), and also caps the keepalive;
* the tcp transport's heartbeat (``transport.tcp.heartbeat``): each rank sends an empty frame on
  every connection it has sent nothing on for T/3, and names a peer it has received nothing
  from for T. This is the only one that sees a frozen *process* (SIGSTOP, a debugger, a
  livelock outside Python's reach): its kernel keeps answering TCP, so the two above never
  fire.

Every socket of the store and the transport gets the first two here (``apply``); the
heartbeat lives with the transport. The error for a silent peer is ``PeerTimeoutError``, both
a ``DistNetworkError`` (the peer is lost, the group fails as for a closed connection) and a
``DistTimeoutError``, worded with torch's "Timed out": nothing was closed, pyc10d stopped
waiting.

A leaf module, like ``auth`` and ``tls``.
"""

from __future__ import annotations

import socket

from .errors import DistNetworkError, DistTimeoutError
from .settings import PEER_TIMEOUT_S

ENV = PEER_TIMEOUT_S.name
DEFAULT_S = 15.0


class PeerTimeoutError(DistNetworkError, DistTimeoutError):
    """A peer stopped answering without closing its connection (partition, frozen process)."""


def peer_timeout() -> float | None:
    """``PYC10D_PEER_TIMEOUT_S`` in seconds (default 15), or None when set to 0 (off)."""
    value = PEER_TIMEOUT_S.get()
    return value if value > 0 else None


def apply(sock: socket.socket, limit: float | None) -> None:
    """Keepalive and user timeout on ``sock`` for a bound of ``limit`` seconds (None: leave
    the kernel's defaults). Options a kernel lacks are skipped."""
    if limit is None:
        return
    idle, interval = max(1, round(limit / 3)), max(1, round(limit / 6))
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", int(limit * 1000))):
        opt = getattr(socket, name, None)
        if opt is not None:
            options.append((socket.IPPROTO_TCP, opt, value))
    for level, opt, value in options:
        try:
            sock.setsockopt(level, opt, value)
        except OSError:
            pass


def silent_error(peer: int, seconds: float, what: str, cause: object = None) -> PeerTimeoutError:
    """The error naming ``peer`` after ``seconds`` of silence; ``what`` says how it was seen,
    ``cause`` (the kernel's error) is quoted."""
    why = f"{ENV}; {cause}" if cause is not None else ENV
    return PeerTimeoutError(
        f"Timed out: rank {peer} {what} for {seconds:g}s ({why}): its host is unreachable or its "
        "process is frozen")
