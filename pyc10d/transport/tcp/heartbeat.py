"""The tcp transport's heartbeat: names a peer that stopped sending without closing.

One daemon thread per process looks at every connection of every live ``TCPTransport``
each T/4 seconds (T: ``keepalive.peer_timeout()``, read when the transport was made). It asks
the kernel, not the data path, how long ago the connection last carried data each way
(``TCP_INFO``: ``tcpi_last_data_sent``, ``tcpi_last_data_recv``), so sending and receiving
cost nothing more:

* sent nothing for T/3: send an empty ``KIND_PING`` frame — only when the send lock is free
  and the kernel's send queue is empty, so the heartbeat never blocks or waits behind a
  message (a queued message is data the peer will see, or ``TCP_USER_TIMEOUT`` fails it);
* received nothing for T: the peer is lost (``keepalive.silent_error``, "Timed out"), its
  receives fail and its socket is shut down, so a send blocked on it fails too.

A live peer's thread sends at least every T/3 + T/4 = 7T/12, which leaves 5T/12 for
scheduling delays before a false alarm. A peer is named within T + T/4 of its last byte.
The thread ends when the last transport closes (no pyc10d thread outlives the last group).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import termios
import threading
import weakref
from typing import Any

from ... import threads

_TCP_INFO = struct.Struct("8B13I")  # struct tcp_info up to tcpi_last_ack_recv
_LAST_DATA_SENT, _LAST_DATA_RECV = 8 + 9, 8 + 11
_OUTQ = struct.Struct("i")


def idle_ms(sock: socket.socket) -> tuple[int, int]:
    """Milliseconds since ``sock`` last sent data and since it last received data."""
    fields = _TCP_INFO.unpack(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size))
    return fields[_LAST_DATA_SENT], fields[_LAST_DATA_RECV]


def unsent(sock: socket.socket) -> int:
    """Bytes in ``sock``'s send queue not yet acknowledged (``SIOCOUTQ``)."""
    return _OUTQ.unpack(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * _OUTQ.size))[0]


class Heartbeat:
    """The process's heartbeat thread over every registered transport."""

    def __init__(self) -> None:
        self._transports: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def register(self, transport: Any) -> None:
        """``transport`` has ``peer_timeout`` (seconds) and ``heartbeat()``."""
        with self._lock:
            self._transports.add(transport)
            if self._thread is None or not self._thread.is_alive():
                # Sockets only, never torch: the exit need not wait for it.
                self._thread = threads.start(self._run, "pyc10d-heartbeat", join_at_exit=False)
            self._wake.set()  # a shorter period may apply now

    def unregister(self, transport: Any) -> None:
        with self._lock:
            self._transports.discard(transport)
            if not self._transports:
                self._wake.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wake.clear()
                transports = list(self._transports)
                if not transports:
                    self._thread = None
                    return
            period = min(t.peer_timeout for t in transports) / 4
            for t in transports:
                try:
                    t.heartbeat()
                except Exception:  # noqa: BLE001 - one transport must not stop the others' watch
                    pass
            del transports, t  # hold no transport while asleep: a dropped group must be collectable
            self._wake.wait(period)


_HEARTBEAT = Heartbeat()


def _reset_after_fork() -> None:
    """A forked child has no heartbeat thread, and the lock may have been held at the fork."""
    global _HEARTBEAT
    _HEARTBEAT = Heartbeat()


os.register_at_fork(after_in_child=_reset_after_fork)


def register(transport: Any) -> None:
    _HEARTBEAT.register(transport)


def unregister(transport: Any) -> None:
    _HEARTBEAT.unregister(transport)
