"""TCPStore's server: one event-loop thread serves every client connection.

Why one loop and not a thread per connection: a job of thousands of ranks connects thousands
of clients at start-up, and threads cost a stack each and a GIL hand-off per request. The loop
(``selectors``: epoll on Linux) reads whatever each readable socket holds into that
connection's ``FrameParser``, answers every whole request at once, and parks a blocking
``get``/``wait`` as a ``_Waiter`` filed under the key it misses. A change to a key re-checks
only the waiters filed under it; a deadline sits in a heap that bounds the loop's next
``select``. Nothing polls: an idle server sleeps in ``select`` until a byte or a deadline
comes. Only this thread touches the data, so there is no lock.

Requests of one connection are answered in order: while one is parked (or its answer cannot
be sent yet), the connection's later requests wait in its parser, and the loop stops reading
from it once it holds ``_STALLED_CAP`` bytes unanswered. Malformed input closes that
connection alone, with a logged reason, after the answers it already earned are sent. With
``PYC10D_TLS_*`` and ``PYC10D_AUTH_TOKEN`` set each connection first comes in through
``admission.Admission`` (TLS, then the token, one deadline), driven by the loop like the rest,
the same way as into a tcp rank's listener; a client without a token is told so in the plain
protocol.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import queue
import selectors
import socket
import threading
import time
from collections import deque
from typing import Any

from .. import auth, keepalive, threads, tls
from ..admission import Admission, Refused
from ..errors import DistNetworkError
from ..hostport import format_hostport
from . import wire

_RECV = 64 * 1024  # under malloc's mmap threshold: a small answer costs no mmap/munmap
_STALLED_CAP = 1 << 20  # unanswered input a parked or write-blocked connection may hold
_FLUSH_S = 10.0  # a closing connection's last answers get this long to leave
_REFUSE_DRAIN = 16 * 65536  # bytes read from a refused client so its answer is not reset
_MAX_SELECT_S = 60.0
_ADMITTING, _SERVING, _REFUSING, _CLOSING = range(4)
log = logging.getLogger("pyc10d")


def _addr(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return format_hostport(str(addr[0]), addr[1])
    return str(addr)


class _Conn:
    """One client connection's state in the loop."""

    __slots__ = ("sock", "addr", "parser", "out", "state", "waiter", "adm", "events",
                 "timer", "drained", "eof")

    def __init__(self, adm: Admission, addr: object, max_bytes: int) -> None:
        self.sock, self.addr = adm.sock, addr
        self.parser = wire.FrameParser(max_bytes, wire.SHAPES)
        self.out = bytearray()  # answers the kernel did not take yet
        self.adm: Admission | None = None if adm.done else adm
        self.state = _SERVING if adm.done else _ADMITTING
        self.waiter: _Waiter | None = None
        self.events = adm.events
        self.timer = -1  # sequence number of this connection's live deadline, -1 for none
        self.drained = 0
        self.eof = False  # the client shut its side: answer what it sent, then close


class _Waiter:
    """A parked get/wait (``keys``) or wait-for-count (``target``): answered when its keys are
    there, or with TIMEOUT at ``deadline``."""

    __slots__ = ("conn", "code", "keys", "target", "timer")

    def __init__(self, conn: _Conn, code: int, keys: list[bytes], target: int) -> None:
        self.conn, self.code, self.keys, self.target = conn, code, keys, target
        self.timer = -1


class Server:
    """The master's key-value server; outlives no TCPStore that uses it (refcounted)."""

    def __init__(self, listener: socket.socket) -> None:
        self._listener = listener
        self.port: int = listener.getsockname()[1]
        self.refs = 1
        self._data: dict[bytes, bytes] = {}
        self._queues: dict[bytes, deque[bytes]] = {}  # beside the keys: see Store.queue_push
        self._waiting: dict[bytes, dict[_Waiter, None]] = {}  # key -> waiters missing it
        self._timers: list[tuple[float, int, Any]] = []  # (deadline, seq, _Conn | _Waiter)
        self._compact_at = 4096  # heap size at which answered waits' entries are swept out
        self._conns: set[_Conn] = set()
        self._seq = itertools.count()
        self._runnable: list[_Conn] = []  # connections whose parked request was answered
        self._max_bytes = wire.max_part_bytes()
        self._secret = auth.token()  # fixed for the server's life, read once like its limits
        self._tls = tls.context(server_side=True)
        self._peer_timeout = keepalive.peer_timeout()
        self._stopping = False
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        listener.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        # Parked in ``select`` between requests and never in torch: the exit need not wait for it.
        self._thread = threads.start(self._loop, f"pyc10d-TCPStore-{self.port}", join_at_exit=False)

    # -- the loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stopping:
                for key, events in self._sel.select(self._next_timeout()):
                    conn = key.data
                    if conn is not None and conn.state < 0:
                        continue  # closed earlier in this round
                    if conn is None:
                        if key.fileobj is self._listener:
                            self._accept()
                        else:
                            self._drain_wake()
                        continue
                    try:
                        if conn.state == _ADMITTING:
                            self._admit(conn)
                            continue
                        if events & selectors.EVENT_WRITE:
                            self._flush(conn)
                        if events & selectors.EVENT_READ and conn.state >= 0:
                            self._on_readable(conn)
                    except Exception as e:  # noqa: BLE001 - one client must not end the server
                        self._close(conn, f"internal error on its request: {type(e).__name__}: {e}")
                self._run_timers()
                self._run_parked()
        finally:
            for conn in list(self._conns):
                self._close(conn, None)
            self._sel.close()
            self._listener.close()
            self._wake_r.close()
            self._wake_w.close()

    def _next_timeout(self) -> float | None:
        if self._runnable:
            return 0.0
        if not self._timers:
            return None
        return min(max(self._timers[0][0] - time.monotonic(), 0.0), _MAX_SELECT_S)

    def _accept(self) -> None:
        for _ in range(64):  # bounded: the others get their turn, the rest come next round
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors, ...: keep serving the others
                log.warning("TCPStore server on port %d: accept failed: %s", self.port, e)
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keepalive.apply(sock, self._peer_timeout)  # a client's vanished host frees its slot
            conn = _Conn(Admission(sock, self._tls, self._secret), addr, self._max_bytes)
            self._conns.add(conn)
            self._sel.register(conn.sock, conn.events, conn)
            if conn.adm is not None:
                self._set_timer(conn, conn.adm.deadline - time.monotonic())

    def _admit(self, conn: _Conn) -> None:
        """Take ``conn``'s next step in (TLS, token); once in, it is served as any."""
        assert conn.adm is not None
        try:
            rest = conn.adm.advance()
        except Refused as e:
            self._refused(conn, e)
            return
        if rest is None:
            if conn.adm.events != conn.events:
                self._sel.modify(conn.sock, conn.adm.events, conn)
                conn.events = conn.adm.events
            return
        conn.state, conn.adm, conn.timer = _SERVING, None, -1
        self._update_events(conn)
        if rest:  # requests that came with the handshake's last bytes
            conn.parser.feed(rest)
            self._serve(conn)
        if conn.state == _SERVING and tls.buffered(conn.sock):
            self._on_readable(conn)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_RECV)
            while data and tls.buffered(conn.sock):  # decrypted already: no readiness event
                data += conn.sock.recv(_RECV)
        except (*tls.WOULD_BLOCK, InterruptedError):
            return
        except OSError:
            data = b""  # reset by the client: the same as its leaving
        if conn.state == _REFUSING:
            conn.drained += len(data)
            if not data or conn.drained > _REFUSE_DRAIN:
                self._close(conn, None)
            return
        if not data:
            if conn.waiter is not None:
                self._close(conn, None)  # gone while its request was parked
            else:
                conn.eof = True
                self._serve(conn)
            return
        if conn.parser.idle() and conn.waiter is None and not conn.out:
            try:  # the common case: the bytes are exactly one request
                frame = wire.parse_whole(data, self._max_bytes, wire.SHAPES)
            except wire.BadFrame:
                frame = None  # the parser says why, with the same words
            if frame is not None:
                self._request(conn, *frame)
                return
        conn.parser.feed(data)
        self._serve(conn)

    def _request(self, conn: _Conn, code: int, parts: list[bytes]) -> None:
        try:
            wire.check_shape(code, parts)
            reply = self._handle(conn, code, parts)
        except (ValueError, IndexError) as e:  # malformed request or non-integer add
            reply = wire.pack(wire.ERROR, [f"TCPStore server: bad request ({e})".encode()])
        if reply is not None:
            self._send(conn, reply)

    def _serve(self, conn: _Conn) -> None:
        """Answer this connection's whole requests in order, up to one that must wait."""
        try:
            while conn.waiter is None and not conn.out and conn.state == _SERVING:
                frame = conn.parser.next_frame()
                if frame is None:
                    if conn.eof:
                        conn.parser.check_clean_end()
                        self._close(conn, None)  # the client left between requests
                        return
                    break
                self._request(conn, *frame)
        except wire.BadFrame as e:
            self._close(conn, str(e))
            return
        self._update_events(conn)

    # -- requests -------------------------------------------------------------------------
    def _handle(self, conn: _Conn, code: int, p: list[bytes]) -> bytes | None:
        """The answer to one request, or None when it was parked."""
        data = self._data
        if code in (wire.MGET, wire.WAIT, wire.WAITGE, wire.QPOP):
            limit = int(p[0])
            if code == wire.WAITGE:
                waiter = _Waiter(conn, code, [p[1]], int(p[2]))
            else:
                waiter = _Waiter(conn, code, p[1:], 0)
            missing = self._missing(waiter)
            if missing is None:
                return self._answer(waiter, wire.OK)
            if limit == 0:
                return self._answer(waiter, wire.TIMEOUT)
            conn.waiter = waiter
            self._waiting.setdefault(missing, {})[waiter] = None
            if limit > 0:
                self._set_timer(waiter, min(limit / 1000, threading.TIMEOUT_MAX))
            return None
        if code == wire.CHECK:
            queues = self._queues
            return wire.pack(wire.OK, [b"1" if all(k in data or queues.get(k) for k in p) else b"0"])
        if code == wire.NUMKEYS:
            return wire.pack(wire.OK, [str(len(data)).encode()])
        if code == wire.LIST:
            return wire.pack(wire.OK, [wire.pack_list(list(data))])
        if code == wire.QLEN:
            return wire.pack(wire.OK, [str(len(self._queues.get(p[0], ()))).encode()])
        if code == wire.QPUSH:
            self._queues.setdefault(p[0], deque()).append(p[1])
            self._changed(p[0])  # the first parked pop takes it; waits see the queue
            return wire.pack(wire.OK, [])
        if code == wire.DELETE:
            return wire.pack(wire.OK, [b"1" if data.pop(p[0], None) is not None else b"0"])
        reply: list[bytes] = []
        if code == wire.SET:
            data[p[0]] = p[1]
            self._changed(p[0])
        elif code == wire.MSET:
            data.update(zip(p[0::2], p[1::2]))
            for k in p[0::2]:
                self._changed(k)
        elif code == wire.APPEND:
            data[p[0]] = data.get(p[0], b"") + p[1]
            self._changed(p[0])
        elif code == wire.ADD:
            data[p[0]] = new = str(int(data.get(p[0], b"0")) + int(p[1])).encode()
            self._changed(p[0])
            reply = [new]
        else:  # CAS: the parser let no other code through
            cur = data.get(p[0])
            if (cur is None and p[1] != b"") or (cur is not None and cur != p[1]):
                return wire.pack(wire.OK, [p[1] if cur is None else cur])
            data[p[0]] = p[2]
            self._changed(p[0])
            reply = [p[2]]
        return wire.pack(wire.OK, reply)

    def _missing(self, w: _Waiter) -> bytes | None:
        """A key ``w`` still waits for, or None when it can be answered."""
        if w.code == wire.WAITGE:
            return None if int(self._data.get(w.keys[0], b"0")) >= w.target else w.keys[0]
        if w.code == wire.QPOP:
            return None if self._queues.get(w.keys[0]) else w.keys[0]
        data, queues = self._data, self._queues
        for k in w.keys:
            if k not in data and (w.code == wire.MGET or not queues.get(k)):
                return k
        return None

    def _answer(self, w: _Waiter, status: int) -> bytes:
        if w.code == wire.WAITGE:
            return wire.pack(status, [self._data.get(w.keys[0], b"0")])
        if status == wire.OK and w.code == wire.MGET:
            return wire.pack(status, [self._data[k] for k in w.keys])
        if status == wire.OK and w.code == wire.QPOP:
            values = self._queues[w.keys[0]]
            value = values.popleft()
            if not values:
                del self._queues[w.keys[0]]
            return wire.pack(status, [value])
        return wire.pack(status, [])

    def _changed(self, key: bytes) -> None:
        """Re-check the waiters filed under ``key``; answer the ones it completes."""
        waiters = self._waiting.pop(key, None)
        if not waiters:
            return
        for w in waiters:
            try:
                missing = self._missing(w)
                if missing is not None:
                    self._waiting.setdefault(missing, {})[w] = None
                    continue
                reply = self._answer(w, wire.OK)
            except ValueError as e:  # a wait-for-count on a key that was set to a non-number
                reply = wire.pack(wire.ERROR, [f"TCPStore server: bad request ({e})".encode()])
            self._unpark(w)
            self._send(w.conn, reply)
            self._runnable.append(w.conn)  # its next requests, after this one's answer

    def _unpark(self, w: _Waiter) -> None:
        w.conn.waiter = None
        w.timer = -1
        for k in (w.keys if w.code != wire.WAITGE else w.keys[:1]):
            filed = self._waiting.get(k)
            if filed is not None and filed.pop(w, 0) is None and not filed:
                del self._waiting[k]

    def _run_parked(self) -> None:
        while self._runnable:
            ready, self._runnable = self._runnable, []
            for conn in ready:
                if conn.state == _SERVING:
                    self._serve(conn)

    # -- deadlines ------------------------------------------------------------------------
    def _set_timer(self, obj: _Conn | _Waiter, secs: float) -> None:
        obj.timer = seq = next(self._seq)
        heapq.heappush(self._timers, (time.monotonic() + secs, seq, obj))
        if len(self._timers) >= self._compact_at:
            # Answered waits leave their entry behind until its deadline; sweep them out
            # when they are the majority, so the heap stays within twice the live ones.
            self._timers = [t for t in self._timers if t[2].timer == t[1]]
            heapq.heapify(self._timers)
            self._compact_at = max(4096, 2 * len(self._timers))

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, seq, obj = heapq.heappop(self._timers)
            if obj.timer != seq:
                continue  # answered, authenticated or closed meanwhile
            if isinstance(obj, _Waiter):
                self._unpark(obj)
                self._send(obj.conn, self._answer(obj, wire.TIMEOUT))
                self._runnable.append(obj.conn)
            elif obj.adm is not None:
                self._refused(obj, Refused(obj.adm.ended(timed_out=True) or "it timed out"))
            else:  # a refused or closing connection that would not finish
                self._close(obj, None)

    # -- output and closing ---------------------------------------------------------------
    def _send(self, conn: _Conn, data: bytes) -> None:
        if conn.state < 0:
            return
        if not conn.out:
            try:
                sent = conn.sock.send(data)
            except (*tls.WOULD_BLOCK, InterruptedError):
                sent = 0
            except OSError:
                return  # the client is gone; its read side will tell the loop
            if sent == len(data):
                return
            data = data[sent:]
        conn.out += data
        self._update_events(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (*tls.WOULD_BLOCK, InterruptedError):
            return
        except OSError:
            self._close(conn, None)
            return
        del conn.out[:sent]
        if conn.out:
            return
        if conn.state == _CLOSING:
            self._close(conn, None)
        elif conn.state == _SERVING:
            self._serve(conn)  # requests that waited for the answer to go
        else:
            self._update_events(conn)

    def _update_events(self, conn: _Conn) -> None:
        if conn.state < 0:
            return
        stalled = conn.waiter is not None or bool(conn.out)
        reading = conn.state != _CLOSING and not conn.eof and not (
            stalled and conn.parser.unparsed() > _STALLED_CAP)
        events = (selectors.EVENT_READ if reading else 0) | (
            selectors.EVENT_WRITE if conn.out else 0)
        if events != conn.events:
            if conn.events == 0:
                self._sel.register(conn.sock, events, conn)
            elif events == 0:
                self._sel.unregister(conn.sock)
            else:
                self._sel.modify(conn.sock, events, conn)
            conn.events = events

    def _refused(self, conn: _Conn, e: Refused) -> None:
        if not self._stopping:
            log.warning("TCPStore server on port %d: refused the connection from %s: %s",
                        self.port, _addr(conn.addr), e)
        if not e.plain:
            self._close(conn, None)
            return
        # A client without the token speaks the plain protocol: answer in it, so that it
        # raises an error saying why instead of "connection closed". Then read what it sent
        # already (closing with unread bytes would reset the connection and could discard
        # the answer before the client reads it), bounded in bytes and time.
        msg = b"TCPStore server: authentication failed: this server requires PYC10D_AUTH_TOKEN"
        conn.state, conn.adm = _REFUSING, None
        self._send(conn, wire.pack(wire.AUTH, [msg]))
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._set_timer(conn, 1.0)

    def _close(self, conn: _Conn, reason: str | None) -> None:
        """Close ``conn``; with a reason (logged) after its earned answers are sent."""
        if conn.state < 0:
            return
        if reason is not None and not self._stopping:
            log.warning("TCPStore server on port %d: closed the connection from %s: %s",
                        self.port, _addr(conn.addr), reason)
        if reason is not None and conn.out and not self._stopping:
            conn.state = _CLOSING
            self._update_events(conn)
            self._set_timer(conn, _FLUSH_S)
            return
        if conn.waiter is not None:
            self._unpark(conn.waiter)
        if conn.events:
            self._sel.unregister(conn.sock)
        conn.state, conn.timer, conn.events = -1, -1, 0
        self._conns.discard(conn)
        conn.sock.close()

    def stop(self) -> None:
        """Close the listener and every connection; returns once the port is free."""
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10.0)


_SERVERS: dict[int, Server] = {}  # multi-tenant servers of this process, by port
_SERVERS_LOCK = threading.Lock()
# Finalizers run wherever the GC fires, possibly while another thread holds _SERVERS_LOCK and
# waits on this one, so they take no locks: they queue the server for this reaper thread.
_DOOMED: queue.SimpleQueue[Server] = queue.SimpleQueue()
_REAPER: threading.Thread | None = None


def _reap() -> None:
    while True:
        drop_server(_DOOMED.get())


def _reset_after_fork() -> None:
    """A forked child has none of the parent's threads: forget their servers and reaper."""
    global _SERVERS_LOCK, _DOOMED, _REAPER
    _SERVERS.clear()
    _SERVERS_LOCK, _DOOMED, _REAPER = threading.Lock(), queue.SimpleQueue(), None


os.register_at_fork(after_in_child=_reset_after_fork)


def acquire_server(port: int, multi_tenant: bool, listen_fd: int | None) -> Server:
    """A server on ``port`` (0: a free one): this process's, if ``multi_tenant`` and it has one."""
    global _REAPER
    with _SERVERS_LOCK:
        if _REAPER is None:
            _REAPER = threads.start(_reap, "pyc10d-TCPStore-reaper", join_at_exit=False)
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
        srv = Server(listener)
        if multi_tenant:
            _SERVERS[srv.port] = srv
        return srv


def drop_server(server: Server) -> None:
    """Release one user of ``server``; the last one stops it."""
    with _SERVERS_LOCK:
        server.refs -= 1
        if server.refs > 0:
            return
        if _SERVERS.get(server.port) is server:
            del _SERVERS[server.port]
    server.stop()


def doom(server: Server) -> None:
    """Release one user of ``server`` later, from the reaper thread (safe in a finalizer)."""
    _DOOMED.put(server)
