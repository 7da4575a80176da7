"""TCP transport: at most one connection per peer pair, opened on first use; a receiver
thread per connected peer.

Connection set-up goes through the store (``connect.py``): every rank listens on an ephemeral
port (``listener``) and publishes ``host:port:nonce``; a rank dials a peer when it first
needs it and introduces itself, and races are settled so that each pair shares exactly one
socket (see ``TCPTransport``). Messages are framed by a 24-byte header
(channel, nbytes, meta, kind) followed by the raw payload: tensor bytes travel as
memoryviews of tensor storage, never pickled.

Why a receiver thread per peer: it drains the socket all the time, so ``send`` never
deadlocks when two ranks send to each other first, and when the matching receive was
posted before the data came, the payload is read straight into the destination buffer.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from datetime import timedelta

from ... import auth, keepalive
from ...errors import DistNetworkError
from ...store.base import Store
from ..base import Mailbox, RecvHandle
from ..cpus import oversubscribed, usable_cpus
from ..framed import KIND_DATA, KIND_PING, STRIPES_SHIFT, BadFrame, FramedTransport
from . import heartbeat
from .connect import Connections
from .direct import OVERSUBSCRIBED_DIRECT_MAX, DirectIO
from .links import STRIPE_MIN_BYTES, Links, recv_stripes, send_stripes
from .listener import ACCEPTED, Listener
from .owner import Owner, spin_seconds, spin_yields

_HEADER = struct.Struct("<QQII")
_SMALL = 64 * 1024
_PING = _HEADER.pack(0, 0, 0, KIND_PING)
# A receive from a peer not connected yet dials it after this long (see ``irecv``).
PROBE_AFTER_S = 0.25
log = logging.getLogger("pyc10d")
# Large payloads go into and out of the kernel this many bytes per system call. Measured on
# loopback (one 64 MiB message, 2 cores): 512 KiB calls on both sides took 11-15 ms where
# one call for the whole message took 24-27 ms; 1 MiB calls 20-22 ms. Small calls keep the
# kernel's buffers few and warm in cache, and let the receiver return window space early.
_CHUNK = 512 * 1024
# ...but only for messages larger than this (a ring segment is at most 1 MiB): between ranks
# of an oversubscribed host, splitting 1 MiB segments cost 20% more CPU per all_reduce.
_CHUNK_ABOVE = 1 << 20


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


class TCPTransport(Connections, FramedTransport):
    """Lazily connected mesh of TCP connections among ``size`` ranks, set up through ``store``.

    Construction publishes this rank's address and waits until every rank has published
    (a rank that never arrives fails here, as torch's Gloo fails its init), but opens no
    connection: a pair connects on first use, so a ring algorithm opens two connections per
    rank rather than ``size - 1``. ``send`` dials the peer when there is no connection yet;
    ``irecv`` from a peer not yet connected dials it in the background, so that a peer that
    died before it ever sent is noticed (its listener refuses) rather than waited out.

    Both ranks of a pair may dial each other at once (each sends to the other): the listener
    answers every vetted hello with one byte, and when a rank's own dial to the same peer is
    under way, the dial of the *higher* rank wins on both sides — the lower rank's dial is
    told ``USE_OTHER`` and waits for the higher rank's connection to land. So the higher
    rank never waits for the answer; only a dial to a higher rank does.
    """

    HEADER = _HEADER

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta) -> None:
        self.rank, self.size = rank, size
        self.mailbox = Mailbox(size)
        # Per peer, public: the lane's ``direct.DirectIO`` reads and writes the sockets itself
        # (``direct.Sockets`` says what it uses), under the send locks and owners below.
        self.socks: list[socket.socket | None] = [None] * size
        self.send_locks = [threading.Lock() for _ in range(size)]
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._secret = auth.token()
        self._store = store
        self._timeout_s = timeout.total_seconds()
        # Guards connection state: ``socks`` (written only under it), ``_dialing``, closing.
        self._cond = threading.Condition()
        self._dialing = [False] * size
        self._probing = [False] * size
        self._addrs: list[str] = []  # every rank's ``host:port:nonce``, read at the first dial
        self._addrs_lock = threading.Lock()
        self._listener: Listener | None = None
        self._links: Links | None = None
        # Who reads each peer's socket: its receiver thread, or a synchronous caller
        # (``direct``); none under TLS, whose records a caller cannot read in part.
        self.owners: dict[int, Owner] = {}
        self._direct_ok = False
        self.peer_timeout = keepalive.peer_timeout()  # see ``heartbeat``; None: not watched
        if size > 1:
            self._join(store, self._timeout_s)
            if self.peer_timeout is not None:
                heartbeat.register(self)

    def irecv(self, peer: int, channel: int, buf: memoryview) -> RecvHandle:
        handle = super().irecv(peer, channel, buf)
        for own in (self.owners.values() if peer < 0 else (self.owners.get(peer),)):
            if own is not None and own.parked_until:
                own.unpark()  # this receive is the receiver thread's to serve
        # The data will come over the connection the sender dials; a receive dials only to
        # learn that a peer which never connected has gone. Give the sender a moment first,
        # so that the pair is not dialled from both ends.
        if peer >= 0:
            if self.socks[peer] is None:
                self._probe(peer, PROBE_AFTER_S)
        else:  # failed only once every peer is known lost, so it connects to all of them
            for p in range(self.size):  # (rare: object collectives, p2p with ``src=None``)
                if p != self.rank:
                    self._probe(p, PROBE_AFTER_S)
        return handle

    def direct(self) -> DirectIO | None:
        """A ``DirectIO`` for one thread's synchronous operations (None: not on this
        transport: TLS, several addresses, or one rank)."""
        if not self._direct_ok or self.size == 1:
            return None
        ranks, cpus = self._ranks_on_host(), usable_cpus()
        return DirectIO(self, spin_seconds(ranks, cpus), OVERSUBSCRIBED_DIRECT_MAX if oversubscribed(ranks, cpus) else None,
                        spin_yields(ranks, cpus))

    # -- data path ------------------------------------------------------------------------
    def _send(self, peer: int, kind: int, channel: int, data: memoryview, meta: int) -> None:
        sock = self.socks[peer]
        if sock is None:
            sock = self._connection(peer)
        links = self._links_to(peer) if kind == KIND_DATA and len(data) >= STRIPE_MIN_BYTES else None
        if links:
            kind |= (len(links) + 1) << STRIPES_SHIFT
        header = _HEADER.pack(channel, len(data), meta, kind)
        try:
            with self.send_locks[peer]:
                if links:
                    sock.sendall(header)
                    send_stripes([sock, *links], data, lambda: self._check_reachable(peer))
                elif len(data) <= _SMALL:
                    sock.sendall(header + data)
                else:
                    sock.sendall(header)
                    step = _CHUNK if len(data) > _CHUNK_ABOVE else len(data)
                    for start in range(0, len(data), step):
                        sock.sendall(data[start:start + step])
        except OSError as e:
            raise self.mailbox.explain_loss(peer, f"send failed: {e}") from e

    def _links_to(self, peer: int) -> list[socket.socket]:
        """This rank's links to ``peer`` ([] when either has one address, or under TLS)."""
        assert self._links is not None
        if not self._links.enabled:
            return []
        _, port, nonce = self._address(peer)
        return self._links.outgoing(peer, self._link_hosts(peer), int(port), int(nonce),
                                    min(self._timeout_s, 30.0))

    def _read_stripes(self, peer: int, stripes: int, view: memoryview) -> None:
        sock = self.socks[peer]
        links = None if self._links is None else self._links.incoming(peer, stripes)
        if sock is None or links is None:
            raise BadFrame(f"it sent a message in {stripes} stripes over links it did not open")
        recv_stripes([sock, *links], view, lambda: self._check_reachable(peer))

    def _receive_loop(self, peer: int, sock: socket.socket, unanswered: bool, own: Owner | None) -> None:
        if unanswered and not self._answered(peer, sock):
            return
        # Between messages the thread waits in poll() for data only. Blocked in recv()
        # instead, it would also wake (and go back to sleep) every time the kernel frees send
        # buffer space on this socket, which a sender blocked on it waits for: measured, 4
        # ranks on 2 cores, all_reduce 64 MiB, ~190 such wake-ups per call on the receiver of
        # each rank's right-hand connection, which carries nothing that way, and 3-4 ms of
        # system time per call in it.
        idle = select.poll()
        idle.register(sock, select.POLLIN)
        buffered = getattr(sock, "pending", None)  # TLS: decrypted bytes that poll() cannot see

        def read(view: memoryview, payload: bool) -> None:
            if not payload:
                if own is not None:
                    own.idle(idle)  # the socket may be a caller's meanwhile (``direct``)
                elif not (buffered and buffered()):
                    idle.poll()
            _recv_exact(sock, view)

        self._pump(peer, read)

    def _answered(self, peer: int, sock: socket.socket) -> bool:
        """Read the peer's answer to this rank's dial; anything but ``ACCEPTED`` loses it."""
        try:
            answer = sock.recv(1)
        except OSError as e:
            answer, why = b"", str(e)
        else:
            why = f"answer {answer!r}; see rank {peer}'s log"
        if answer == ACCEPTED:
            return True
        if not self._closing:
            self.mailbox.peer_lost(peer, f"it did not take rank {self.rank}'s connection ({why})")
        return False

    def _drop(self, peer: int) -> None:
        if self._links is not None:
            self._links.drop(peer)
        sock = self.socks[peer]
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the peer sees the end; our sends fail at once
            except OSError:
                pass

    # -- failure and shutdown -----------------------------------------------------------
    def heartbeat(self) -> None:
        """Called by the heartbeat thread every ``peer_timeout / 4`` s (see ``heartbeat``)."""
        limit = self.peer_timeout
        assert limit is not None
        for peer, sock in enumerate(self.socks):
            if sock is None or peer in self.mailbox.dead or self._closing:
                continue
            try:
                since_sent, since_received = heartbeat.idle_ms(sock)
                if since_received > limit * 1000:
                    self.mailbox.peer_lost(peer, keepalive.silent_error(peer, limit, "sent nothing"))
                    self._drop(peer)
                elif since_sent >= limit * 1000 / 3 and heartbeat.unsent(sock) == 0:
                    lock = self.send_locks[peer]
                    if lock.acquire(blocking=False):
                        try:
                            sock.sendall(_PING)
                        finally:
                            lock.release()
            except OSError:  # closed meanwhile: its receiver reports that
                pass

    def is_alive(self, peer: int) -> bool:
        """Not known to be lost (a peer never connected to counts as alive)."""
        return peer not in self.mailbox.dead

    def is_connected(self, peer: int) -> bool:
        return self.socks[peer] is not None and peer not in self.mailbox.dead

    def close(self) -> None:
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        heartbeat.unregister(self)
        for own in list(self.owners.values()):
            own.unpark()
        if self._listener is not None:
            self._listener.close()
        for peer, sock in enumerate(self.socks):
            if sock is None:
                continue
            self._say_bye(peer)
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        deadline = time.monotonic() + 1.0  # the receivers end at the peers' goodbyes
        with self._cond:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=max(deadline - time.monotonic(), 0.0))
        for sock in self.socks:
            if sock is not None:
                sock.close()
        if self._links is not None:
            self._links.close()
        self.mailbox.fail_all(DistNetworkError(f"rank {self.rank}: transport closed"))
