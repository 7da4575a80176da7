"""Joining and connecting, the set-up half of ``TCPTransport``: publish this rank's address
through the store and wait for every rank's (``_join``); dial a peer on first use and
introduce itself (the client side of the hello, beside ``_admit``, which takes or refuses a
connection the listener vetted); settle a race when both ranks of a pair dial at once (the
higher rank's dial wins, see ``TCPTransport``); dial in the background to learn that a
peer which never connected is gone; tune each socket (``sockbuf_bytes``).

``Connections`` is a mixin of ``TCPTransport`` (``transport.py``), whose constructor makes the
state it uses (``socks``, ``send_locks``, ``owners``, ``_cond``, ``_dialing``, ``_probing``,
``_addrs``, ``_listener``, ``_links``) and whose ``_receive_loop`` each new connection starts.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

from ... import auth, keepalive, settings, threads, tls
from ...errors import DistNetworkError, DistTimeoutError, with_message
from ...hostport import format_hostport
from ...store.base import Store, store_chain
from ..cpus import oversubscribed
from .links import Links
from .listener import ACCEPTED, HELLO, USE_OTHER, Listener
from .netif import advertised_addresses
from .owner import Owner


def _advertised_hosts(store: Store, rank: int) -> list[str]:
    """The addresses peers dial for this rank (several: links, see ``links``): ``netif``
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


class Connections:
    """Set-up methods of ``TCPTransport`` (see the module's docstring)."""

    def _join(self, store: Store, timeout: float) -> None:
        """Listen, publish ``host:port:nonce``, and wait until every rank has published."""
        hosts = _advertised_hosts(store, self.rank)
        self._links = Links(self.rank, hosts, self._secret, enabled=not tls.enabled(), tune=self._tune_link)
        # A caller may read and write its peers' sockets itself (``direct``), except under TLS
        # and where large messages may be striped over several addresses (``links``).
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

    def _admit(self, peer: int, sock: socket.socket, link: int = 0) -> str | None:
        """The listener vetted a hello from ``peer``: take the connection, or tell the dialer
        to use the one this rank dialled. A reason string refuses it (the listener logs it).
        A link (``link`` > 0) is always taken (see ``links``)."""
        with self._cond:
            if self._closing:
                return "this rank is shutting down"
            if peer in self.mailbox.dead:
                return f"rank {peer} was dropped already ({self.mailbox.dead[peer]})"
            if link:
                assert self._links is not None
                self._links.admit(peer, link, sock)
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

    def _link_hosts(self, peer: int) -> list[str]:
        """Every address ``peer`` published (one per link; see ``links``)."""
        self._address(peer)
        return self._addrs[peer].rsplit(":", 2)[0].split(",")

    def _tune_link(self, sock: socket.socket) -> None:
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

    def probe(self, peer: int) -> None:
        self._probe(peer, 0.0)

    def _probe(self, peer: int, after: float) -> None:
        if (self.socks[peer] is None and not self._dialing[peer] and not self._probing[peer]
                and peer not in self.mailbox.dead):
            self._dial_in_background(peer, after)
