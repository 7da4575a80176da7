"""TCPStore: one rank runs a small key-value server, every rank talks to it over TCP.

This module is the client (``TCPStore``); the server is ``tcp_server`` (one event loop for
every connection) and the frames both speak are ``wire``. A blocking get/wait is parked by
the server, which also enforces its timeout and answers TIMEOUT; the client's socket timeout
is only a backstop for a hung server. A dead server surfaces as DistStoreError. With
``PYC10D_AUTH_TOKEN`` set, each connection first passes the handshake of ``pyc10d.auth``;
with ``PYC10D_TLS_*`` set, the connection is TLS (``pyc10d.tls``) from its first byte.
"""

from __future__ import annotations

import errno
import socket
import struct
import threading
import time
import weakref
from datetime import timedelta

from .. import auth, keepalive, tls
from ..errors import DistNetworkError, DistStoreError
from ..hostport import unbracket
from . import wire
from .base import (
    Store,
    StoreTimeoutError,
    queue_empty,
    resolve_timeout,
    timeout_seconds,
    to_bytes,
    wait_timeout_error,
)
from .tcp_server import Server, acquire_server, doom, drop_server

# The framing lives in ``wire``; these names stay here for callers (and tests) that read them.
BadFrame, MAX_PARTS, max_part_bytes = wire.BadFrame, wire.MAX_PARTS, wire.max_part_bytes
_read_frame, _STATUSES = wire.read_frame, wire.STATUSES
_INIT_KEY = b"init/"  # counts joined workers; user keys are "/" + key, as in torch
_GRACE_S = 30.0  # extra client-side patience beyond a server-enforced timeout
_RECV = 64 * 1024  # under malloc's mmap threshold: a small answer costs no mmap/munmap
_TIMEVAL = struct.Struct("@ll")


def _kernel_timeout(sock: socket.socket, seconds: float | None) -> None:
    """Bound every send and receive on ``sock`` by ``seconds`` (None: no bound) in the kernel
    (``SO_SNDTIMEO``/``SO_RCVTIMEO``), the socket staying blocking for Python: a Python
    socket timeout polls before each call, two system calls and two GIL hand-offs more per
    request, and the clients' CPU is what limits a busy store. A call that runs out fails
    with ``BlockingIOError`` (EAGAIN). A TLS socket takes Python's timeout instead
    (``TimeoutError``)."""
    if tls.is_tls(sock):  # ``ssl`` retries a blocking read that the kernel's bound ended
        sock.settimeout(seconds)
        return
    micros = 0 if seconds is None else max(1, int(seconds * 1e6))  # (0 means no bound)
    tv = _TIMEVAL.pack(*divmod(micros, 1_000_000))
    for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, opt, tv)


class ConnectTimeoutError(DistNetworkError, StoreTimeoutError):
    """No server answered at host:port within the store timeout."""


def dial(host: str, port: int, secs: float | None) -> socket.socket:
    """A TCP connection to host:port (TCP_NODELAY), retried with backoff for ``secs`` (None:
    for ever): the server may start after its clients. The socket is left blocking."""
    deadline = None if secs is None else time.monotonic() + secs
    delay, last = 0.01, None
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise ConnectTimeoutError(
                f"The client socket has timed out after {int((secs or 0) * 1000)}ms while "
                f"trying to connect to ({host}, {port}): {last}"
            ) from last
        try:
            sock = socket.create_connection((unbracket(host), port), timeout=left)
            break
        except OSError as e:  # refused (server not up yet), DNS failure, ...
            last = e
        time.sleep(delay if left is None else max(0.0, min(delay, left)))
        delay = min(delay * 2, 1.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    keepalive.apply(sock, keepalive.peer_timeout())
    sock.settimeout(None)
    return sock


def _finalize(server: Server | None, sock: socket.socket) -> None:
    """GC finalizer of a TCPStore: close its connection, hand its server to the reaper."""
    sock.close()
    if server is not None:
        doom(server)


class TCPStore(Store):
    """torch.distributed.TCPStore. The master hosts the server and is also a client of it."""

    def __init__(
        self,
        host_name: str,
        port: int,
        world_size: int | None = None,
        is_master: bool = False,
        timeout: timedelta = timedelta(seconds=300),
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        master_listen_fd: int | None = None,
        use_libuv: bool = True,
    ) -> None:
        super().__init__(timeout)
        if world_size is not None and world_size <= 0:
            raise ValueError(f"TCPStore world size cannot be {world_size}")
        self._host, self._world_size, self._use_libuv = host_name, world_size, use_libuv
        self._lock = threading.Lock()  # one request in flight per connection
        self._broken: str | None = None
        self._server = acquire_server(port, multi_tenant, master_listen_fd) if is_master else None
        self._port = self._server.port if self._server is not None else port
        self._sock: socket.socket | None = None
        self._max_bytes = wire.max_part_bytes()
        try:
            self._sock = self._connect(timeout_seconds(timeout))
            self._sock_timeout: float | None = None
            if world_size is not None and wait_for_workers:
                self._wait_for_workers(world_size)
        except BaseException:
            if self._sock is not None:
                _finalize(None, self._sock)
            if self._server is not None:
                drop_server(self._server)  # synchronously, so the port is free on return
            raise
        weakref.finalize(self, _finalize, self._server, self._sock)

    def _connect(self, secs: float | None) -> socket.socket:
        """Dial the server (``dial``), then pass the auth handshake if a token is set."""
        deadline = None if secs is None else time.monotonic() + secs
        sock = dial(self._host, self._port, secs)
        left = None if deadline is None else deadline - time.monotonic()
        sock = tls.wrap_client(sock, f"TCPStore: connecting to the server at {self._host}:{self._port}",
                               max(1.0, min(left or tls.HANDSHAKE_TIMEOUT_S, tls.HANDSHAKE_TIMEOUT_S)))
        secret = auth.token()
        if secret is not None:
            left = None if deadline is None else deadline - time.monotonic()
            sock.settimeout(max(1.0, min(left or auth.HANDSHAKE_TIMEOUT_S, auth.HANDSHAKE_TIMEOUT_S)))
            auth.authenticate(sock, secret, f"TCPStore: authentication with the server at "
                                            f"{self._host}:{self._port} failed")
        sock.settimeout(None)
        return sock

    def _wait_for_workers(self, world_size: int) -> None:
        self._ok(wire.ADD, [_INIT_KEY, b"1"])
        if self._server is None:
            return
        secs = timeout_seconds(self._timeout)
        status, out = self._call(wire.WAITGE, [_ms(secs), _INIT_KEY, str(world_size).encode()], secs)
        if status == wire.TIMEOUT:
            raise StoreTimeoutError(
                f"Timed out after {int(secs or 0)} seconds waiting for clients. "
                f"{int(out[0])}/{world_size} clients joined."
            )

    def _call(self, code: int, parts: list[bytes], wait_s: float | None) -> tuple[int, list[bytes]]:
        with self._lock:
            if self._broken is not None:
                raise DistStoreError(self._broken)
            assert self._sock is not None
            try:
                limit = None if wait_s is None else wait_s + _GRACE_S
                if limit != self._sock_timeout:
                    _kernel_timeout(self._sock, limit)
                    self._sock_timeout = limit
                self._sock.sendall(wire.pack(code, parts))
                status, out = self._reply()
                if status == wire.AUTH:
                    raise auth.AuthError(
                        f"TCPStore at {self._host}:{self._port}: "
                        f"{b''.join(out).decode(errors='replace')}"
                    )
            except auth.AuthError as e:
                self._give_up(str(e))
                raise
            except (TimeoutError, *tls.WOULD_BLOCK) as e:  # ``_kernel_timeout``'s deadline passed
                if e.errno == errno.ETIMEDOUT:  # the kernel's keepalive or user timeout gave up
                    self._give_up(
                        f"TCPStore: Timed out: the server at {self._host}:{self._port} stopped answering "
                        f"for {keepalive.peer_timeout() or 0:g}s ({keepalive.ENV}): unreachable ({e})")
                else:
                    self._give_up(
                        f"TCPStore got no answer from the server at {self._host}:{self._port} within "
                        f"{limit or 0:g} s; the server is stuck or unreachable"
                    )
                raise DistStoreError(self._broken) from e
            except (OSError, wire.BadFrame) as e:
                self._give_up(
                    f"TCPStore lost its connection to the server at {self._host}:{self._port} "
                    f"({type(e).__name__}: {e}); the server is gone or unreachable"
                )
                raise DistStoreError(self._broken) from e
        if status == wire.ERROR:
            raise DistStoreError(b"".join(out).decode(errors="replace"))
        return status, out

    def _reply(self) -> tuple[int, list[bytes]]:
        """Read one answer: usually one ``recv`` holds it whole; else a parser takes the
        pieces, with the same limits (memory grows with what arrives, not what is announced)."""
        assert self._sock is not None
        data = self._sock.recv(_RECV)
        if data:
            frame = wire.parse_whole(data, self._max_bytes, wire.STATUSES)
            if frame is not None:
                return frame
        parser = wire.FrameParser(self._max_bytes, wire.STATUSES)
        while True:
            if not data:
                if not parser.idle():
                    parser.check_clean_end()
                raise ConnectionResetError("connection closed by the server")
            parser.feed(data)
            frame = parser.next_frame()
            if frame is not None:
                if not parser.idle():
                    raise wire.BadFrame("the server sent more than one answer")
                return frame
            data = self._sock.recv(_RECV)

    def _give_up(self, why: str) -> None:
        """Under the lock: close the connection; every later call raises ``why``."""
        assert self._sock is not None
        self._broken = why
        self._sock.close()

    def _ok(self, code: int, parts: list[bytes]) -> list[bytes]:
        return self._call(code, parts, timeout_seconds(self._timeout))[1]

    def _blocking(self, code: int, keys: list[str], timeout: timedelta) -> list[bytes]:
        secs = timeout_seconds(timeout)
        status, out = self._call(code, [_ms(secs), *(_k(k) for k in keys)], secs)
        if status == wire.TIMEOUT:
            raise wait_timeout_error(["/" + k for k in keys], timeout)
        return out

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def libuvBackend(self) -> bool:  # noqa: N802 - torch's spelling
        return self._use_libuv

    def set(self, key: str, value: str | bytes) -> None:
        self._ok(wire.SET, [_k(key), to_bytes(value)])

    def get(self, key: str) -> bytes:
        return self._blocking(wire.MGET, [key], self._timeout)[0]

    def add(self, key: str, amount: int) -> int:
        return int(self._ok(wire.ADD, [_k(key), str(int(amount)).encode()])[0])

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        return self._ok(wire.CAS, [_k(key), to_bytes(expected_value), to_bytes(desired_value)])[0]

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._blocking(wire.WAIT, list(keys), resolve_timeout(self._timeout, timeout))

    def check(self, keys: list[str]) -> bool:
        return self._ok(wire.CHECK, [_k(k) for k in keys])[0] == b"1"

    def delete_key(self, key: str) -> bool:
        return self._ok(wire.DELETE, [_k(key)])[0] == b"1"

    def num_keys(self) -> int:
        """Counts the internal worker-count key too, as torch does."""
        return int(self._ok(wire.NUMKEYS, [])[0])

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._blocking(wire.MGET, list(keys), self._timeout)

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError("multi_set: keys and values differ in length")
        self._ok(wire.MSET, [b for k, v in zip(keys, values) for b in (_k(k), to_bytes(v))])

    def append(self, key: str, value: str | bytes) -> None:
        self._ok(wire.APPEND, [_k(key), to_bytes(value)])

    def has_extended_api(self) -> bool:
        return True

    def list_keys(self) -> list[str]:
        """The keys users set (not the server's own count of joined workers)."""
        listing = wire.unpack_list(self._ok(wire.LIST, [])[0])
        return [k[1:].decode(errors="replace") for k in listing if k.startswith(b"/")]

    def queue_push(self, key: str, value: str | bytes) -> None:
        self._ok(wire.QPUSH, [_k(key), to_bytes(value)])

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        secs = timeout_seconds(self._timeout)
        status, out = self._call(wire.QPOP, [_ms(secs) if block else b"0", _k(key)], secs)
        if status == wire.TIMEOUT:
            raise wait_timeout_error(["/" + key], self._timeout) if block else queue_empty()
        return out[0]

    def queue_len(self, key: str) -> int:
        return int(self._ok(wire.QLEN, [_k(key)])[0])

    def clone(self) -> TCPStore:
        """A new client connection to the same server."""
        return TCPStore(self._host, self._port, timeout=self._timeout, use_libuv=self._use_libuv)

    def __repr__(self) -> str:
        server = f"TCPServer(port={self._port})" if self._server is not None else "<nullptr>"
        return f"TCPStore(client=TCPClient({self._host}:{self._port}), server={server})"


def _k(key: str) -> bytes:
    return b"/" + key.encode()


def _ms(secs: float | None) -> bytes:
    """A wait limit on the wire: milliseconds, -1 for none."""
    return b"-1" if secs is None else str(max(1, int(secs * 1000))).encode()
