"""TCPStore: one rank runs a small key-value server, every rank talks to it over TCP.

Wire format (both directions): ``!BI`` (op or status, part count), then each part as
``!I`` length + raw bytes. Values travel as raw bytes, never pickled. The server runs one
daemon thread per connection over a dict guarded by a condition variable, so a blocking
get/wait parks its own thread on the condition (no spinning) while other clients are served.
Wait timeouts are enforced by the server, which answers TIMEOUT; the client's socket
timeout is only a backstop for a hung server. A dead server surfaces as DistStoreError.

The server trusts nothing it reads: an unknown op code, more than ``MAX_PARTS`` parts, a part
longer than ``PYC10D_STORE_MAX_BYTES`` (1 GiB) or a frame cut short closes that connection
alone, with the reason logged on the ``pyc10d`` logger; memory grows with the bytes that
actually arrive, never with a length that was merely announced. A well-framed request that
makes no sense (wrong number of parts, a non-integer where a number belongs) gets an error
reply and the connection stays. With ``PYC10D_AUTH_TOKEN`` set, each connection first passes
the handshake of ``pyc10d.auth``.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import BinaryIO

from .. import auth
from ..errors import DistNetworkError, DistStoreError
from .base import (
    Store,
    StoreTimeoutError,
    resolve_timeout,
    timeout_seconds,
    to_bytes,
    wait_timeout_error,
)

_HEAD, _LEN = struct.Struct("!BI"), struct.Struct("!I")
(_SET, _MGET, _ADD, _CAS, _WAIT, _CHECK, _DELETE, _NUMKEYS, _MSET, _APPEND, _WAITGE) = range(1, 12)
_OK, _TIMEOUT, _ERROR, _AUTH = 0, 1, 2, 3
_INIT_KEY = b"init/"  # counts joined workers; user keys are "/" + key, as in torch
_GRACE_S = 30.0  # extra client-side patience beyond a server-enforced timeout
# Parts per frame: a multi_get/multi_set of this many keys still fits (half as many for a set).
MAX_PARTS = 1 << 16
_DEFAULT_MAX_BYTES = 1 << 30
# Parts longer than this are read a piece at a time, so a length that is announced but never
# sent costs nothing; shorter ones in one call (BufferedReader allocates the whole size first).
_PIECE = 1 << 20
# How many parts each op takes: (fewest, most or None, parts must pair up).
_SHAPES: dict[int, tuple[int, int | None, bool]] = {
    _SET: (2, 2, False), _MGET: (1, None, False), _ADD: (2, 2, False), _CAS: (3, 3, False),
    _WAIT: (1, None, False), _CHECK: (0, None, False), _DELETE: (1, 1, False),
    _NUMKEYS: (0, 0, False), _MSET: (0, None, True), _APPEND: (2, 2, False),
    _WAITGE: (3, 3, False),
}
_STATUSES = frozenset((_OK, _TIMEOUT, _ERROR, _AUTH))

log = logging.getLogger("pyc10d")


class ConnectTimeoutError(DistNetworkError, StoreTimeoutError):
    """No server answered at host:port within the store timeout."""


class BadFrame(Exception):
    """Bytes that break the framing: the reader closes the connection."""


def max_part_bytes() -> int:
    """The longest part a frame may carry: ``PYC10D_STORE_MAX_BYTES``, else 1 GiB."""
    env = os.environ.get("PYC10D_STORE_MAX_BYTES", "").strip()
    return int(env) if env else _DEFAULT_MAX_BYTES


def _pack(code: int, parts: list[bytes]) -> bytes:
    out = [_HEAD.pack(code, len(parts))]
    for p in parts:
        out += (_LEN.pack(len(p)), p)
    return b"".join(out)


def _read_exact(rfile: BinaryIO, n: int) -> bytes:
    pieces, got = [], 0
    while got < n:
        piece = rfile.read(min(n - got, _PIECE))
        if not piece:
            raise BadFrame(f"frame cut short: {n} bytes announced, {got} came")
        pieces.append(piece)
        got += len(piece)
    return b"".join(pieces) if len(pieces) != 1 else pieces[0]


def _read_frame(
    rfile: BinaryIO, max_bytes: int, codes: frozenset[int] | dict[int, object]
) -> tuple[int, list[bytes]] | None:
    """One frame, checked against the limits before anything is read into; None at a clean
    end of stream (between frames). Raises ``BadFrame`` for a code not in ``codes``, too many
    parts, a part over ``max_bytes`` or a frame cut short."""
    head = rfile.read(_HEAD.size)
    if not head:
        return None
    if len(head) < _HEAD.size:
        raise BadFrame(f"frame cut short inside its header ({len(head)} of {_HEAD.size} bytes)")
    code, n = _HEAD.unpack(head)
    if code not in codes:
        raise BadFrame(f"unknown code {code}")
    if n > MAX_PARTS:
        raise BadFrame(f"{n} parts announced, at most {MAX_PARTS} allowed")
    parts = []
    for _ in range(n):
        (length,) = _LEN.unpack(_read_exact(rfile, _LEN.size))
        if length > max_bytes:
            raise BadFrame(
                f"a part of {length} bytes announced, at most {max_bytes} allowed "
                "(PYC10D_STORE_MAX_BYTES)"
            )
        parts.append(_read_exact(rfile, length))
    return code, parts


def _check_shape(code: int, parts: list[bytes]) -> None:
    fewest, most, paired = _SHAPES[code]
    n = len(parts)
    if n < fewest or (most is not None and n > most) or (paired and n % 2):
        want = f"{fewest}" if most == fewest else f"at least {fewest}" if most is None else (
            f"{fewest} to {most}")
        raise ValueError(f"op {code} takes {want}{' (in pairs)' if paired else ''} parts, got {n}")


class _Server:
    """The master's key-value server; outlives no TCPStore that uses it (refcounted)."""

    def __init__(self, listener: socket.socket) -> None:
        self._listener = listener
        self.port: int = listener.getsockname()[1]
        self.refs = 1
        self._data: dict[bytes, bytes] = {}
        self._cond = threading.Condition()
        self._conns: set[socket.socket] = set()
        self._stopped = False
        self._max_bytes = max_part_bytes()
        self._secret = auth.token()  # fixed for the server's life, read once like its limits
        threading.Thread(
            target=self._accept_loop, name=f"TCPStore-{self.port}", daemon=True
        ).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, addr = self._listener.accept()
            except OSError:
                return  # listener shut down by stop()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._cond:
                if self._stopped:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True).start()

    def _serve(self, conn: socket.socket, addr: object) -> None:
        """Answer one client until it leaves; anything malformed ends this connection only."""
        rfile: BinaryIO | None = None
        reason = None
        try:
            if self._secret is not None and not self._authenticate(conn, self._secret, addr):
                return
            rfile = conn.makefile("rb")
            while True:
                frame = _read_frame(rfile, self._max_bytes, _SHAPES)
                if frame is None:
                    return  # the client closed between requests
                code, parts = frame
                try:
                    _check_shape(code, parts)
                    reply = self._handle(code, parts)
                except (ValueError, IndexError) as e:  # malformed request or non-integer add
                    reply = _pack(_ERROR, [f"TCPStore server: bad request ({e})".encode()])
                conn.sendall(reply)
        except BadFrame as e:
            reason = str(e)
        except (OSError, struct.error):
            pass  # client went away (or we are stopping): drop the connection
        except Exception as e:  # noqa: BLE001 - one client's request must not end the server
            reason = f"internal error on its request: {type(e).__name__}: {e}"
        finally:
            with self._cond:
                self._conns.discard(conn)
                stopped = self._stopped
            if reason is not None and not stopped:
                log.warning("TCPStore server on port %d: closed the connection from %s: %s",
                            self.port, _addr(addr), reason)
            if rfile is not None:
                rfile.close()
            conn.close()

    def _authenticate(self, conn: socket.socket, secret: bytes, addr: object) -> bool:
        """Run the ``PYC10D_AUTH_TOKEN`` handshake; False (logged) if the client fails it."""
        conn.settimeout(auth.HANDSHAKE_TIMEOUT_S)
        try:
            auth.server_handshake(conn, secret)
        except (auth.AuthError, OSError) as e:
            with self._cond:
                stopped = self._stopped
            if not stopped:
                log.warning("TCPStore server on port %d: refused the connection from %s: "
                            "authentication failed: %s", self.port, _addr(addr), e)
            if isinstance(e, auth.NotAuthenticating):
                # A client without the token speaks the plain protocol: answer in it, so that
                # it raises an error saying why instead of "connection closed".
                self._refuse(conn)
            return False
        conn.settimeout(None)
        return True

    @staticmethod
    def _refuse(conn: socket.socket) -> None:
        msg = b"TCPStore server: authentication failed: this server requires PYC10D_AUTH_TOKEN"
        try:
            conn.sendall(_pack(_AUTH, [msg]))
            conn.shutdown(socket.SHUT_WR)
            # Read what the client already sent (closing with unread bytes would reset the
            # connection and could discard the answer before the client reads it); bounded.
            conn.settimeout(1.0)
            for _ in range(16):
                if not conn.recv(65536):
                    break
        except OSError:
            pass

    def _await(self, pred: Callable[[], bool], ms: bytes) -> bool:
        """Park this connection's thread until ``pred()`` holds; False on timeout."""
        limit = int(ms)
        wait_s = None if limit < 0 else min(limit / 1000, threading.TIMEOUT_MAX)
        ok = self._cond.wait_for(lambda: self._stopped or pred(), wait_s)
        if self._stopped:
            raise ConnectionAbortedError("server stopping")
        return ok

    def _handle(self, code: int, p: list[bytes]) -> bytes:
        data = self._data
        with self._cond:
            if code in (_MGET, _WAIT):
                keys = p[1:]
                if not self._await(lambda: all(k in data for k in keys), p[0]):
                    return _pack(_TIMEOUT, [])
                return _pack(_OK, [data[k] for k in keys] if code == _MGET else [])
            if code == _WAITGE:
                target = int(p[2])
                ok = self._await(lambda: int(data.get(p[1], b"0")) >= target, p[0])
                return _pack(_OK if ok else _TIMEOUT, [data.get(p[1], b"0")])
            if code == _CHECK:
                return _pack(_OK, [b"1" if all(k in data for k in p) else b"0"])
            if code == _NUMKEYS:
                return _pack(_OK, [str(len(data)).encode()])
            if code == _DELETE:
                return _pack(_OK, [b"1" if data.pop(p[0], None) is not None else b"0"])
            reply: list[bytes] = []
            if code == _SET:
                data[p[0]] = p[1]
            elif code == _MSET:
                data.update(zip(p[0::2], p[1::2]))
            elif code == _APPEND:
                data[p[0]] = data.get(p[0], b"") + p[1]
            elif code == _ADD:
                data[p[0]] = new = str(int(data.get(p[0], b"0")) + int(p[1])).encode()
                reply = [new]
            else:  # _CAS: _read_frame let no other code through
                cur = data.get(p[0])
                if (cur is None and p[1] != b"") or (cur is not None and cur != p[1]):
                    return _pack(_OK, [p[1] if cur is None else cur])
                data[p[0]] = p[2]
                reply = [p[2]]
            self._cond.notify_all()
            return _pack(_OK, reply)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            conns = list(self._conns)
            self._cond.notify_all()
        for s in (self._listener, *conns):
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes accept()/recv() in the server threads
            except OSError:
                pass
        self._listener.close()


_SERVERS: dict[int, _Server] = {}  # multi-tenant servers of this process, by port
_SERVERS_LOCK = threading.Lock()
# Finalizers run wherever the GC fires, possibly while another thread holds _SERVERS_LOCK and
# waits on this one, so they take no locks: they queue the server for this reaper thread.
_DOOMED: queue.SimpleQueue[_Server] = queue.SimpleQueue()
_REAPER: threading.Thread | None = None


def _reap() -> None:
    while True:
        _drop_server(_DOOMED.get())


def _reset_after_fork() -> None:
    """A forked child has none of the parent's threads: forget their servers and reaper."""
    global _SERVERS_LOCK, _DOOMED, _REAPER
    _SERVERS.clear()
    _SERVERS_LOCK, _DOOMED, _REAPER = threading.Lock(), queue.SimpleQueue(), None


os.register_at_fork(after_in_child=_reset_after_fork)


def _acquire_server(port: int, multi_tenant: bool, listen_fd: int | None) -> _Server:
    global _REAPER
    with _SERVERS_LOCK:
        if _REAPER is None:
            _REAPER = threading.Thread(target=_reap, name="TCPStore-reaper", daemon=True)
            _REAPER.start()
        if multi_tenant and port in _SERVERS:
            srv = _SERVERS[port]
            srv.refs += 1
            return srv
        try:
            if listen_fd is not None:
                listener = socket.socket(fileno=listen_fd)
                listener.listen(1024)
            elif socket.has_dualstack_ipv6():
                listener = socket.create_server(
                    ("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024
                )
            else:
                listener = socket.create_server(("", port), backlog=1024)
        except OSError as e:
            raise DistNetworkError(
                "The server socket has failed to listen on any local network address. "
                f"port: {port}, error: {e}"
            ) from e
        srv = _Server(listener)
        if multi_tenant:
            _SERVERS[srv.port] = srv
        return srv


def _drop_server(server: _Server) -> None:
    """Release one user of ``server``; the last one stops it."""
    with _SERVERS_LOCK:
        server.refs -= 1
        if server.refs > 0:
            return
        if _SERVERS.get(server.port) is server:
            del _SERVERS[server.port]
    server.stop()


def _finalize(server: _Server | None, sock: socket.socket, rfile: BinaryIO | None) -> None:
    """GC finalizer of a TCPStore: close its connection, hand its server to the reaper."""
    if rfile is not None:
        rfile.close()  # the fd only really closes once the reader is closed too
    sock.close()
    if server is not None:
        _DOOMED.put(server)


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
        self._server = _acquire_server(port, multi_tenant, master_listen_fd) if is_master else None
        self._port = self._server.port if self._server is not None else port
        self._sock: socket.socket | None = None
        self._rfile: BinaryIO | None = None
        try:
            self._sock = self._connect(timeout_seconds(timeout))
            self._rfile = self._sock.makefile("rb")
            self._sock_timeout: float | None = None
            if world_size is not None and wait_for_workers:
                self._wait_for_workers(world_size)
        except BaseException:
            if self._sock is not None:
                _finalize(None, self._sock, self._rfile)
            if self._server is not None:
                _drop_server(self._server)  # synchronously, so the port is free on return
            raise
        weakref.finalize(self, _finalize, self._server, self._sock, self._rfile)

    def _connect(self, secs: float | None) -> socket.socket:
        """Connect, retrying with backoff until the timeout: the server may start later."""
        deadline = None if secs is None else time.monotonic() + secs
        delay, last = 0.01, None
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ConnectTimeoutError(
                    f"The client socket has timed out after {int((secs or 0) * 1000)}ms while "
                    f"trying to connect to ({self._host}, {self._port}): {last}"
                ) from last
            try:
                sock = socket.create_connection((self._host, self._port), timeout=left)
                break
            except OSError as e:  # refused (server not up yet), DNS failure, ...
                last = e
            time.sleep(delay if left is None else max(0.0, min(delay, left)))
            delay = min(delay * 2, 1.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        secret = auth.token()
        if secret is not None:
            left = None if deadline is None else deadline - time.monotonic()
            sock.settimeout(max(1.0, min(left or auth.HANDSHAKE_TIMEOUT_S, auth.HANDSHAKE_TIMEOUT_S)))
            try:
                auth.client_handshake(sock, secret)
            except (auth.AuthError, OSError) as e:
                sock.close()
                raise auth.AuthError(
                    f"TCPStore: authentication with the server at {self._host}:{self._port} "
                    f"failed: {e}"
                ) from e
        sock.settimeout(None)
        return sock

    def _wait_for_workers(self, world_size: int) -> None:
        self._ok(_ADD, [_INIT_KEY, b"1"])
        if self._server is None:
            return
        secs = timeout_seconds(self._timeout)
        status, out = self._call(_WAITGE, [_ms(secs), _INIT_KEY, str(world_size).encode()], secs)
        if status == _TIMEOUT:
            raise StoreTimeoutError(
                f"Timed out after {int(secs or 0)} seconds waiting for clients. "
                f"{int(out[0])}/{world_size} clients joined."
            )

    def _call(self, code: int, parts: list[bytes], wait_s: float | None) -> tuple[int, list[bytes]]:
        with self._lock:
            if self._broken is not None:
                raise DistStoreError(self._broken)
            assert self._sock is not None and self._rfile is not None
            try:
                limit = None if wait_s is None else wait_s + _GRACE_S
                if limit != self._sock_timeout:
                    self._sock.settimeout(limit)
                    self._sock_timeout = limit
                self._sock.sendall(_pack(code, parts))
                frame = _read_frame(self._rfile, max_part_bytes(), _STATUSES)
                if frame is None:
                    raise ConnectionResetError("connection closed by the server")
                status, out = frame
                if status == _AUTH:
                    raise auth.AuthError(
                        f"TCPStore at {self._host}:{self._port}: "
                        f"{b''.join(out).decode(errors='replace')}"
                    )
            except auth.AuthError as e:
                self._give_up(str(e))
                raise
            except (OSError, BadFrame) as e:
                self._give_up(
                    f"TCPStore lost its connection to the server at {self._host}:{self._port} "
                    f"({type(e).__name__}: {e}); the server is gone or unreachable"
                )
                raise DistStoreError(self._broken) from e
        if status == _ERROR:
            raise DistStoreError(b"".join(out).decode(errors="replace"))
        return status, out

    def _give_up(self, why: str) -> None:
        """Under the lock: close the connection; every later call raises ``why``."""
        assert self._sock is not None and self._rfile is not None
        self._broken = why
        self._rfile.close()
        self._sock.close()

    def _ok(self, code: int, parts: list[bytes]) -> list[bytes]:
        return self._call(code, parts, timeout_seconds(self._timeout))[1]

    def _blocking(self, code: int, keys: list[str], timeout: timedelta) -> list[bytes]:
        secs = timeout_seconds(timeout)
        status, out = self._call(code, [_ms(secs), *(_k(k) for k in keys)], secs)
        if status == _TIMEOUT:
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
        self._ok(_SET, [_k(key), to_bytes(value)])

    def get(self, key: str) -> bytes:
        return self._blocking(_MGET, [key], self._timeout)[0]

    def add(self, key: str, amount: int) -> int:
        return int(self._ok(_ADD, [_k(key), str(int(amount)).encode()])[0])

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        return self._ok(_CAS, [_k(key), to_bytes(expected_value), to_bytes(desired_value)])[0]

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._blocking(_WAIT, list(keys), resolve_timeout(self._timeout, timeout))

    def check(self, keys: list[str]) -> bool:
        return self._ok(_CHECK, [_k(k) for k in keys])[0] == b"1"

    def delete_key(self, key: str) -> bool:
        return self._ok(_DELETE, [_k(key)])[0] == b"1"

    def num_keys(self) -> int:
        """Counts the internal worker-count key too, as torch does."""
        return int(self._ok(_NUMKEYS, [])[0])

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._blocking(_MGET, list(keys), self._timeout)

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError("multi_set: keys and values differ in length")
        self._ok(_MSET, [b for k, v in zip(keys, values) for b in (_k(k), to_bytes(v))])

    def append(self, key: str, value: str | bytes) -> None:
        self._ok(_APPEND, [_k(key), to_bytes(value)])

    def has_extended_api(self) -> bool:
        return True

    def clone(self) -> TCPStore:
        """A new client connection to the same server."""
        return TCPStore(self._host, self._port, timeout=self._timeout, use_libuv=self._use_libuv)

    def __repr__(self) -> str:
        server = f"TCPServer(port={self._port})" if self._server is not None else "<nullptr>"
        return f"TCPStore(client=TCPClient({self._host}:{self._port}), server={server})"


def _addr(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


def _k(key: str) -> bytes:
    return b"/" + key.encode()


def _ms(secs: float | None) -> bytes:
    """A wait limit on the wire: milliseconds, -1 for none."""
    return b"-1" if secs is None else str(max(1, int(secs * 1000))).encode()
