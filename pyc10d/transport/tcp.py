"""TCP transport: one connection per peer pair, a receiver thread per peer.

Connection set-up goes through the store: every rank listens on an ephemeral port and
publishes ``host:port``; rank ``i`` connects to every rank ``j < i`` and introduces itself,
so each pair shares exactly one socket. Messages are framed by a 24-byte header
(channel, nbytes, meta, kind) followed by the raw payload: tensor bytes travel as
memoryviews of tensor storage, never pickled.

Why a receiver thread per peer: it drains the socket all the time, so ``send`` never
deadlocks when two ranks send to each other first, and when the matching receive was
posted before the data came, the payload is read straight into the destination buffer.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import struct
import threading
import time
from datetime import timedelta

from .. import auth
from ..errors import DistNetworkError, DistTimeoutError
from ..store.base import Store
from .base import Mailbox
from .framed import FramedTransport
from .netif import advertised_address

_HEADER = struct.Struct("<QQII")
_HELLO = struct.Struct("<Iq")
_SMALL = 64 * 1024
# A connection to a rank's listener has this long to authenticate and say hello.
HELLO_TIMEOUT_S = auth.HANDSHAKE_TIMEOUT_S
# Connections vetted at once; more are refused (each holds a thread until it passes or fails).
_MAX_PENDING = 512
log = logging.getLogger("pyc10d")
# Large payloads go into and out of the kernel this many bytes per system call. Measured on
# loopback (one 64 MiB message, 2 cores): 512 KiB calls on both sides took 11-15 ms where
# one call for the whole message took 24-27 ms; 1 MiB calls 20-22 ms. Small calls keep the
# kernel's buffers few and warm in cache, and let the receiver return window space early.
_CHUNK = 512 * 1024
# ...but only for messages larger than this (a ring segment is at most 1 MiB): between ranks
# of an oversubscribed host, splitting 1 MiB segments cost 20% more CPU per all_reduce.
_CHUNK_ABOVE = 1 << 20


def _advertised_host(store: Store, rank: int) -> str:
    """The address peers dial for this rank: ``netif`` decides, given the store's host."""
    store_host = getattr(store, "host", None)
    base = getattr(store, "underlying_store", None)
    while store_host is None and base is not None:
        store_host = getattr(base, "host", None)
        base = getattr(base, "underlying_store", None)
    return advertised_address(os.environ, store_host or None, rank)


# Socket buffer size on an oversubscribed host (more ranks on it than CPUs); the kernel
# doubles it. Measured (4 ranks, 2 cores, all_reduce 16-64 MiB): 1.2-1.5x faster than
# autotuning and less CPU per byte, since the sender never runs far ahead of the receiver and
# the receiver copies bytes out while they are still in cache. With a core per rank the
# same fixed size costs CPU (more wake-ups), so autotuning stays the default there.
_OVERSUBSCRIBED_SOCKBUF = 256 * 1024


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _is_local(sock: socket.socket) -> bool:
    try:
        return sock.getpeername()[0] == sock.getsockname()[0]
    except OSError:
        return False


def sockbuf_bytes(local: bool, ranks_on_host: int) -> int:
    """Fixed SO_SNDBUF/SO_RCVBUF for one connection, or 0 for the kernel's autotuning.

    ``PYC10D_TCP_SOCKBUF`` overrides the policy: a size in bytes for every connection, or 0
    for autotuning everywhere. Otherwise connections to a rank on the same host get
    ``_OVERSUBSCRIBED_SOCKBUF`` when that host runs more ranks than it has CPUs; everything
    else (a core per rank, or a real network with its bandwidth-delay product) autotunes.
    """
    env = os.environ.get("PYC10D_TCP_SOCKBUF")
    if env is not None and env.strip():
        return max(int(env), 0)
    if local and ranks_on_host > _usable_cpus():
        return _OVERSUBSCRIBED_SOCKBUF
    return 0


def _tune(sock: socket.socket, bufsize: int) -> None:
    """No Nagle delay; fixed socket buffers when ``bufsize`` > 0 (turns autotuning off)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF) if bufsize > 0 else ():
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, bufsize)
        except OSError:
            pass


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    # MSG_WAITALL: the kernel fills the buffer before returning, one system call and one GIL
    # round-trip per _CHUNK instead of one per arriving socket-buffer's worth.
    got, n = 0, len(view)
    step = _CHUNK if n > _CHUNK_ABOVE else n
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, step), socket.MSG_WAITALL)
        if k == 0:
            raise ConnectionResetError("connection closed by peer")
        got += k


class TCPTransport(FramedTransport):
    """Full mesh of TCP connections among ``size`` ranks, set up through ``store``."""

    HEADER = _HEADER

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta) -> None:
        self.rank, self.size = rank, size
        self.mailbox = Mailbox(size)
        self._socks: list[socket.socket | None] = [None] * size
        self._send_locks = [threading.Lock() for _ in range(size)]
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._secret = auth.token()
        if size > 1:
            self._connect(store, timeout.total_seconds())

    # -- set-up ---------------------------------------------------------------------------
    def _connect(self, store: Store, timeout: float) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        host = _advertised_host(store, self.rank)
        listener.bind(("127.0.0.1" if host == "127.0.0.1" else "0.0.0.0", 0))
        listener.listen(max(self.size, 128))  # room for stray connections beside the peers
        port = listener.getsockname()[1]
        nonce = int.from_bytes(os.urandom(7), "little")
        store.set(f"tcp_addr/{self.rank}", f"{host}:{port}:{nonce}")
        deadline = time.monotonic() + timeout
        secret = self._secret
        for peer in range(self.rank):
            key = f"tcp_addr/{peer}"
            # Wait under the group's timeout, not the store's (an explicit store keeps its own,
            # e.g. FileStore's 300 s): a rank that never arrives fails init like torch's Gloo.
            try:
                store.wait([key], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            except DistTimeoutError as e:
                raise type(e)(
                    f"tcp transport: rank {self.rank} timed out after {timeout:.0f}s waiting for "
                    f"rank {peer} to publish its address ({e})"
                ) from e
            h, p, peer_nonce = store.get(key).decode().rsplit(":", 2)
            sock = self._dial(h, int(p), deadline)
            if secret is not None:
                auth.authenticate(sock, secret, f"tcp transport: rank {self.rank} failed to "
                                                f"authenticate with rank {peer} at {h}:{p}")
            sock.sendall(_HELLO.pack(self.rank, int(peer_nonce)))
            # create_connection's timeout would stay on the socket: the receive loop would then
            # take any idle spell longer than it for a lost peer. Block, as accepted sockets do.
            sock.settimeout(None)
            self._socks[peer] = sock
        self._accept_peers(listener, nonce, deadline, timeout)
        local = [sock is not None and _is_local(sock) for sock in self._socks]
        ranks_on_host = 1 + sum(local)
        for peer, sock in enumerate(self._socks):
            if sock is None:
                continue
            _tune(sock, sockbuf_bytes(local[peer], ranks_on_host))
            t = threading.Thread(
                target=self._receive_loop, args=(peer, sock), daemon=True,
                name=f"pyc10d-tcp-recv-{self.rank}<-{peer}",
            )
            t.start()
            self._threads.append(t)

    def _accept_peers(self, listener: socket.socket, nonce: int, deadline: float,
                      timeout: float) -> None:
        """Take one vetted connection from each higher rank, then close the listener.

        Anyone can connect to the listener, so each connection is vetted on its own short-lived
        thread (authentication if a token is set, then the hello: the nonce this rank published
        and a rank that belongs here), bounded by ``HELLO_TIMEOUT_S``: a silent or garbage
        connection is closed with a logged reason and never delays the real peers. A second
        connection claiming a rank that already has one is refused the same way.
        """
        vetted: queue.SimpleQueue[tuple[int, socket.socket, str]] = queue.SimpleQueue()
        lock = threading.Lock()
        pending: set[socket.socket] = set()
        finished = False

        def refuse(sock: socket.socket, who: str, reason: str) -> None:
            with lock:
                pending.discard(sock)
                quiet = finished
            if not quiet:
                log.warning("tcp transport: rank %d refused the connection from %s: %s",
                            self.rank, who, reason)
            sock.close()

        def vet(sock: socket.socket, who: str) -> None:
            try:
                sock.settimeout(max(min(HELLO_TIMEOUT_S, deadline - time.monotonic()), 0.1))
                if self._secret is not None:
                    auth.server_handshake(sock, self._secret)
                buf = bytearray(_HELLO.size)
                _recv_exact(sock, memoryview(buf))
            except (OSError, auth.AuthError) as e:
                what = "authentication failed: " if isinstance(e, auth.AuthError) else ""
                refuse(sock, who, f"{what}{e or type(e).__name__}")
                return
            peer, got_nonce = _HELLO.unpack(buf)
            if got_nonce != nonce:
                refuse(sock, who, "its hello does not carry the nonce this rank published")
            elif not self.rank < peer < self.size:
                refuse(sock, who, f"it claims rank {peer}, expected one of "
                                  f"{self.rank + 1}..{self.size - 1}")
            else:
                sock.settimeout(None)
                with lock:
                    pending.discard(sock)
                    if not finished:
                        vetted.put((peer, sock, who))
                        return
                sock.close()

        def accept_loop() -> None:
            while True:
                try:
                    sock, addr = listener.accept()
                except OSError:
                    return  # the listener was shut down: every peer is in
                who = f"{addr[0]}:{addr[1]}"
                with lock:
                    crowded = len(pending) >= _MAX_PENDING
                    if not crowded:
                        pending.add(sock)
                if crowded:
                    refuse(sock, who, f"{_MAX_PENDING} connections are being vetted already")
                    continue
                threading.Thread(target=vet, args=(sock, who), daemon=True,
                                 name=f"pyc10d-tcp-vet-{self.rank}").start()

        acceptor = threading.Thread(target=accept_loop, daemon=True,
                                    name=f"pyc10d-tcp-accept-{self.rank}")
        acceptor.start()
        try:
            expected = self.size - 1 - self.rank
            while expected:
                try:
                    peer, sock, who = vetted.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    missing = [r for r in range(self.rank + 1, self.size) if self._socks[r] is None]
                    raise DistNetworkError(
                        f"tcp transport: rank {self.rank} timed out after {timeout:.0f}s waiting "
                        f"for connections from ranks {missing}"
                    ) from None
                if self._socks[peer] is not None:
                    refuse(sock, who, f"rank {peer} is connected already")
                    continue
                self._socks[peer] = sock
                expected -= 1
        finally:
            with lock:
                finished = True
                stragglers = list(pending)
            for sock in (listener, *stragglers):
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes accept() and the vetting threads
                except OSError:
                    pass
            listener.close()
            acceptor.join(timeout=1.0)
            while not vetted.empty():
                vetted.get()[1].close()

    def _dial(self, host: str, port: int, deadline: float) -> socket.socket:
        delay = 0.01
        while True:
            try:
                return socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.1))
            except OSError as e:
                if time.monotonic() + delay > deadline:
                    raise DistNetworkError(
                        f"tcp transport: rank {self.rank} could not connect to {host}:{port}: {e}"
                    ) from e
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    # -- data path ------------------------------------------------------------------------
    def _send(self, peer: int, kind: int, channel: int, data: memoryview, meta: int) -> None:
        sock = self._socks[peer]
        if sock is None:
            raise DistNetworkError(f"tcp transport: no connection from rank {self.rank} to rank {peer}")
        header = _HEADER.pack(channel, len(data), meta, kind)
        try:
            with self._send_locks[peer]:
                if len(data) <= _SMALL:
                    sock.sendall(header + data)
                else:
                    sock.sendall(header)
                    step = _CHUNK if len(data) > _CHUNK_ABOVE else len(data)
                    for start in range(0, len(data), step):
                        sock.sendall(data[start:start + step])
        except OSError as e:
            raise self.mailbox.explain_loss(peer, f"send failed: {e}") from e

    def _receive_loop(self, peer: int, sock: socket.socket) -> None:
        self._pump(peer, lambda view, _payload: _recv_exact(sock, view))

    def _drop(self, peer: int) -> None:
        sock = self._socks[peer]
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the peer sees the end; our sends fail at once
            except OSError:
                pass

    # -- failure and shutdown -----------------------------------------------------------
    def is_alive(self, peer: int) -> bool:
        return peer not in self.mailbox.dead and self._socks[peer] is not None

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        for peer, sock in enumerate(self._socks):
            if sock is None:
                continue
            self._say_bye(peer)
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        for t in self._threads:
            t.join(timeout=max(deadline - time.monotonic(), 0.0))
        for sock in self._socks:
            if sock is not None:
                sock.close()
        self.mailbox.fail_all(DistNetworkError(f"rank {self.rank}: transport closed"))
