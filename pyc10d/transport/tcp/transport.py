"""TCP transport: at most one connection per peer pair, opened on first use; a receiver
thread per connected peer.

Connection set-up goes through the store: every rank listens on an ephemeral port
(``listener``) and publishes ``host:port:nonce``; a rank dials a peer when it first
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
import os
import select
import socket
import struct
import threading
import time
from datetime import timedelta

from ... import auth, keepalive, settings, threads, tls
from ...errors import DistNetworkError, DistTimeoutError, with_message
from ...hostport import format_hostport
from ...store.base import Store, store_chain
from ..base import Mailbox, RecvHandle
from ..cpus import oversubscribed, usable_cpus
from ..framed import KIND_DATA, KIND_PING, STRIPES_SHIFT, BadFrame, FramedTransport
from . import heartbeat
from .direct import OVERSUBSCRIBED_DIRECT_MAX, DirectIO
from .lanes import STRIPE_MIN_BYTES, Lanes, recv_stripes, send_stripes
from .listener import ACCEPTED, HELLO, USE_OTHER, Listener
from .netif import advertised_addresses
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


def _advertised_hosts(store: Store, rank: int) -> list[str]:
    """The addresses peers dial for this rank (several: lanes, see ``lanes``): ``netif``
    decides, given the store's host (or, for a file store, that other hosts may share it)."""
    store_host, shared_file = None, False
    for s in store_chain(store):
        store_host = getattr(s, "host", None)
        shared_file = shared_file or bool(getattr(s, "shared_file", False))
        if store_host is not None:
            break
    return advertised_addresses(os.environ, store_host or None, rank, shared_file)


# Socket buffer size on an oversubscribed host (more ranks on it than CPUs); the kernel
# doubles it. Measured (4 ranks, 2 cores, all_reduce 16-64 MiB): 1.2-1.5x faster than
# autotuning and less CPU per byte, since the sender never runs far ahead of the receiver and
# the receiver copies bytes out while they are still in cache. With a core per rank the
# same fixed size costs CPU (more wake-ups), so autotuning stays the default there.
_OVERSUBSCRIBED_SOCKBUF = 256 * 1024


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
    fixed = settings.TCP_SOCKBUF.get()
    if fixed is not None:
        return fixed
    if local and oversubscribed(ranks_on_host):
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
        self._lanes: Lanes | None = None
        # Who reads each peer's socket: its receiver thread, or a synchronous caller
        # (``direct``); none under TLS, whose records a caller cannot read in part.
        self.owners: dict[int, Owner] = {}
        self._direct_ok = False
        self.peer_timeout = keepalive.peer_timeout()  # see ``heartbeat``; None: not watched
        if size > 1:
            self._join(store, self._timeout_s)
            if self.peer_timeout is not None:
                heartbeat.register(self)

    # -- set-up ---------------------------------------------------------------------------
    def _join(self, store: Store, timeout: float) -> None:
        """Listen, publish ``host:port:nonce``, and wait until every rank has published."""
        hosts = _advertised_hosts(store, self.rank)
        self._lanes = Lanes(self.rank, hosts, self._secret, enabled=not tls.enabled(), tune=self._tune_lane)
        # A caller may read and write its peers' sockets itself (``direct``), except under TLS
        # and where large messages may be striped over several addresses (``lanes``).
        self._direct_ok = not tls.enabled() and len(hosts) == 1
        self._listener = Listener(self.rank, self.size, hosts, self._secret, self._admit)
        store.set(f"tcp_addr/{self.rank}", f"{','.join(hosts)}:{self._listener.port}:{self._listener.nonce}")
        # The rank that completes the count says so; everybody waits for that one key (O(1)
        # store traffic per rank, where waiting for every address would be O(size)). The
        # count runs on if the same store serves a later group of the same name (destroy and
        # init again): each round of ``size`` joins is a generation with its own key, and a
        # rank publishes its address before it joins, so no address read after the join is
        # a previous generation's.
        joined = store.add("tcp_joined", 1)
        generation = (joined - 1) // self.size
        if joined % self.size == 0:
            store.set(f"tcp_all/{generation}", b"1")
        try:
            # Under the group's timeout, not the store's (an explicit store keeps its own,
            # e.g. FileStore's 300 s).
            store.wait([f"tcp_all/{generation}"], timedelta(seconds=max(timeout, 0.001)))
        except DistTimeoutError as e:
            missing = [r for r in range(self.size) if not store.check([f"tcp_addr/{r}"])]
            self.close()
            if missing:
                who = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {missing}"
                what = (f"{who} to publish their address "
                        f"({', '.join(f'tcp_addr/{r}' for r in missing[:4])}; {e})")
            else:  # addresses of an earlier group of this name in this store hide who it is
                short = (generation + 1) * self.size - store.add("tcp_joined", 0)
                what = f"{short} more rank(s) to join ({e})"
            raise with_message(e, f"tcp transport: rank {self.rank} timed out after {timeout:.0f}s "
                                  f"waiting for {what}") from e

    def _ranks_on_host(self) -> int:
        """Ranks on this host, for the socket-buffer policy: the launcher's
        ``LOCAL_WORLD_SIZE``, else every rank (the peers are not all connected to count)."""
        env = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
        return int(env) if env.isdigit() else self.size

    def _install(self, peer: int, sock: socket.socket, answer: bytes | None,
                 unanswered: bool = False) -> None:
        """Under ``_cond``: make ``sock`` the connection to ``peer`` and start its receiver.
        ``answer`` (the listener's reply to the dialer) goes out before any data frame can;
        ``unanswered``: this rank dialled and has not read the peer's answer yet."""
        _tune(sock, sockbuf_bytes(_is_local(sock), self._ranks_on_host()))
        keepalive.apply(sock, self.peer_timeout)
        own = None
        if self._direct_ok:
            own = self.owners[peer] = Owner()
            own.lock.acquire()  # the receiver thread's until it is between frames (``Owner.idle``)
        with self.send_locks[peer]:
            if answer is not None:
                sock.sendall(answer)
            self.socks[peer] = sock
        t = threads.start(self._receive_loop, f"pyc10d-tcp-recv-{self.rank}<-{peer}",
                          (peer, sock, unanswered, own))
        self._threads.append(t)
        self._cond.notify_all()

    def _admit(self, peer: int, sock: socket.socket, lane: int = 0) -> str | None:
        """The listener vetted a hello from ``peer``: take the connection, or tell the dialer
        to use the one this rank dialled. A reason string refuses it (the listener logs it).
        A lane (``lane`` > 0) is always taken (see ``lanes``)."""
        with self._cond:
            if self._closing:
                return "this rank is shutting down"
            if peer in self.mailbox.dead:
                return f"rank {peer} was dropped already ({self.mailbox.dead[peer]})"
            if lane:
                assert self._lanes is not None
                self._lanes.admit(peer, lane, sock)
                return None
            if self.socks[peer] is not None or (self._dialing[peer] and self.rank > peer):
                sock.sendall(USE_OTHER)
                sock.close()
                return None
            self._install(peer, sock, ACCEPTED)
            return None

    def _connection(self, peer: int) -> socket.socket:
        """The socket to ``peer``, dialling it first if there is none."""
        sock = self.socks[peer]
        if sock is not None:
            return sock
        deadline = time.monotonic() + self._timeout_s
        with self._cond:
            while self.socks[peer] is None:
                self._check_reachable(peer)
                if not self._dialing[peer]:
                    self._dialing[peer] = True
                    break
                self._wait_for_change(deadline, f"connecting to rank {peer}")
            else:
                return self.socks[peer]
        try:
            return self._dial(peer, deadline)
        finally:
            with self._cond:
                self._dialing[peer] = False
                self._cond.notify_all()

    def _address(self, peer: int) -> tuple[str, str, str]:
        """``peer``'s published address. The first dial reads every rank's in one store
        request: a rank's first collective often dials several peers one after another."""
        if not self._addrs:
            with self._addrs_lock:
                if not self._addrs:
                    keys = [f"tcp_addr/{r}" for r in range(self.size)]
                    self._addrs = [v.decode() for v in self._store.multi_get(keys)]
        hosts, port, nonce = self._addrs[peer].rsplit(":", 2)
        return hosts.split(",")[0], port, nonce

    def _lane_hosts(self, peer: int) -> list[str]:
        """Every address ``peer`` published (one per lane; see ``lanes``)."""
        self._address(peer)
        return self._addrs[peer].rsplit(":", 2)[0].split(",")

    def _tune_lane(self, sock: socket.socket) -> None:
        _tune(sock, sockbuf_bytes(_is_local(sock), self._ranks_on_host()))
        keepalive.apply(sock, self.peer_timeout)

    def _dial(self, peer: int, deadline: float) -> socket.socket:
        host, port, nonce = self._address(peer)
        sock = self._open(peer, host, int(port), deadline)
        try:
            sock = tls.wrap_client(sock, f"tcp transport: rank {self.rank} connecting to rank {peer} at "
                                         f"{format_hostport(host, port)}", min(tls.HANDSHAKE_TIMEOUT_S, max(deadline - time.monotonic(), 0.1)))
            if self._secret is not None:
                auth.authenticate(sock, self._secret, f"tcp transport: rank {self.rank} failed to "
                                                      f"authenticate with rank {peer} at {format_hostport(host, port)}")
            sock.settimeout(max(deadline - time.monotonic(), 0.1))
            sock.sendall(HELLO.pack(self.rank, int(nonce)))
            # The higher rank's dial wins every race (see the class docstring), so it needs no
            # answer before use: its receiver reads the answer ahead of the first frame. This
            # keeps the peer's scheduling off the critical path of half of all first contacts.
            answer = sock.recv(1) if self.rank < peer else None
            # create_connection's timeout would stay on the socket: the receive loop would then
            # take any idle spell longer than it for a lost peer. Block, as accepted sockets do.
            sock.settimeout(None)
        except OSError as e:
            sock.close()
            raise DistNetworkError(f"tcp transport: rank {self.rank} could not connect to rank "
                                   f"{peer} at {format_hostport(host, port)}: {e}") from e
        except BaseException:
            sock.close()
            raise
        with self._cond:
            if answer in (ACCEPTED, None) and self.socks[peer] is None and not self._closing:
                self._install(peer, sock, None, unanswered=answer is None)
                return sock
            sock.close()
            if answer != USE_OTHER:
                raise DistNetworkError(
                    f"tcp transport: rank {peer} at {format_hostport(host, port)} refused rank {self.rank}'s "
                    f"connection (answer {answer!r}; see rank {peer}'s log)")
            # Rank ``peer`` dialled this rank at the same time and its connection wins.
            while self.socks[peer] is None:
                self._check_reachable(peer)
                self._wait_for_change(deadline, f"waiting for rank {peer}'s connection")
            return self.socks[peer]

    def _check_reachable(self, peer: int) -> None:
        """Under ``_cond``: raise if no connection to ``peer`` can come any more."""
        if peer in self.mailbox.dead:
            raise self.mailbox.dead[peer]
        if self._closing:
            raise DistNetworkError(f"rank {self.rank}: transport closed")

    def _wait_for_change(self, deadline: float, what: str) -> None:
        """Under ``_cond``: wait for a change of connection state, until ``deadline``."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise DistTimeoutError(f"tcp transport: rank {self.rank} timed out after "
                                   f"{self._timeout_s:.0f}s {what}")
        self._cond.wait(left)

    def _open(self, peer: int, host: str, port: int, deadline: float) -> socket.socket:
        """Connect to ``peer``'s listener, retrying until ``deadline``. A refusal means the
        listener is gone (it lives as long as the rank's transport): that peer is lost."""
        delay = 0.01
        while True:
            try:
                return socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.1))
            except ConnectionRefusedError as e:
                self.mailbox.peer_lost(peer, f"its listener at {format_hostport(host, port)} refused a connection "
                                             f"from rank {self.rank} ({e.strerror}): it is gone")
                raise self.mailbox.dead[peer] from e
            except OSError as e:
                if time.monotonic() + delay > deadline:
                    raise DistNetworkError(
                        f"tcp transport: rank {self.rank} could not connect to rank {peer} at "
                        f"{format_hostport(host, port)}: {e}"
                    ) from e
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _dial_in_background(self, peer: int, after: float) -> None:
        """Dial ``peer`` on a thread, ``after`` seconds from now unless it is connected by
        then; a loss shows in ``is_alive`` and fails the receives from it.

        A dial that fails part-way (the peer closed the connection during the hello or the
        authentication: it was dying, or busy refusing) says nothing for sure, and giving
        up there left a receive from a dead peer waiting out the whole timeout. So it dials
        again, backing off, until the peer is connected, known lost (its listener refuses:
        ``_open``), the transport closes, or the timeout passes."""
        def dial() -> None:
            delay, end = 0.05, time.monotonic() + self._timeout_s
            try:
                with self._cond:
                    self._cond.wait_for(lambda: self.socks[peer] is not None or self._closing, after)
                while True:
                    try:
                        self._connection(peer)
                        return
                    except tls.CertificateRefused as e:  # definitive: fail the receives now
                        self.mailbox.peer_lost(peer, e)
                        return
                    except Exception:  # noqa: BLE001 - a loss fails the receive; see above
                        with self._cond:
                            if (self.socks[peer] is not None or self._closing or peer in self.mailbox.dead
                                    or time.monotonic() + delay > end):
                                return
                            self._cond.wait(delay)
                        delay = min(2 * delay, 1.0)
            finally:
                self._probing[peer] = False

        self._probing[peer] = True
        threads.start(dial, f"pyc10d-tcp-dial-{self.rank}->{peer}", join_at_exit=False)

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

    def probe(self, peer: int) -> None:
        self._probe(peer, 0.0)

    def _probe(self, peer: int, after: float) -> None:
        if (self.socks[peer] is None and not self._dialing[peer] and not self._probing[peer]
                and peer not in self.mailbox.dead):
            self._dial_in_background(peer, after)

    # -- data path ------------------------------------------------------------------------
    def _send(self, peer: int, kind: int, channel: int, data: memoryview, meta: int) -> None:
        sock = self.socks[peer]
        if sock is None:
            sock = self._connection(peer)
        lanes = self._lanes_to(peer) if kind == KIND_DATA and len(data) >= STRIPE_MIN_BYTES else None
        if lanes:
            kind |= (len(lanes) + 1) << STRIPES_SHIFT
        header = _HEADER.pack(channel, len(data), meta, kind)
        try:
            with self.send_locks[peer]:
                if lanes:
                    sock.sendall(header)
                    send_stripes([sock, *lanes], data, lambda: self._check_reachable(peer))
                elif len(data) <= _SMALL:
                    sock.sendall(header + data)
                else:
                    sock.sendall(header)
                    step = _CHUNK if len(data) > _CHUNK_ABOVE else len(data)
                    for start in range(0, len(data), step):
                        sock.sendall(data[start:start + step])
        except OSError as e:
            raise self.mailbox.explain_loss(peer, f"send failed: {e}") from e

    def _lanes_to(self, peer: int) -> list[socket.socket]:
        """This rank's lanes to ``peer`` ([] when either has one address, or under TLS)."""
        assert self._lanes is not None
        if not self._lanes.enabled:
            return []
        _, port, nonce = self._address(peer)
        return self._lanes.outgoing(peer, self._lane_hosts(peer), int(port), int(nonce),
                                    min(self._timeout_s, 30.0))

    def _read_stripes(self, peer: int, stripes: int, view: memoryview) -> None:
        sock = self.socks[peer]
        lanes = None if self._lanes is None else self._lanes.incoming(peer, stripes)
        if sock is None or lanes is None:
            raise BadFrame(f"it sent a message in {stripes} stripes over lanes it did not open")
        recv_stripes([sock, *lanes], view, lambda: self._check_reachable(peer))

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
        if self._lanes is not None:
            self._lanes.drop(peer)
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
        if self._lanes is not None:
            self._lanes.close()
        self.mailbox.fail_all(DistNetworkError(f"rank {self.rank}: transport closed"))
