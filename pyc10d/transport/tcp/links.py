"""Links: extra TCP connections per peer pair, one per further network interface, that carry
the stripes of large messages (``PYC10D_SOCKET_IFNAME=eth0,eth1``).

One TCP connection goes over one interface, so a rank with two network interfaces would
use one of them. A rank that advertises several addresses (see ``netif``) dials, on its first
large message to a peer that advertises several too, one connection per further address
pair of the same index — link ``i`` from its ``i``-th address to the peer's ``i``-th — and
from then on splits every data frame of at least ``STRIPE_MIN_BYTES`` into as many
contiguous stripes as there are links plus the pair's connection.

The pair's connection keeps the order: the frame's header goes there, as for any message,
with the number of stripes in the kind's upper bits (``framed.STRIPES_SHIFT``), followed by the
first stripe; stripe ``i`` goes on link ``i``. Links are one-way (each sender dials its own),
so they need none of the pair's race settling, and a link carries nothing but stripes, in
the order of their headers on the pair's connection: the peer's receiver, having read a
striped header, reads the stripes from all its connections at once (``recv_stripes``: one
thread polling them, straight into the destination buffer), as the sender writes them at
once (``send_stripes``). The many-connection I/O stays on the threads that already do it.

A link that cannot be dialled (an address the peer's host cannot reach) leaves that peer
without links, with a warning: its messages go whole over the pair's connection. Links are
not used with TLS (one handshake per link and ``ssl`` sockets take no flags).
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable, Sequence

from ... import auth
from ...hostport import format_hostport
from ..framed import MAX_STRIPES
from .listener import ACCEPTED, HELLO, LINK_SHIFT

# Data frames at least this large are striped: a ring segment (1 MiB at most) too, since a
# job that lists several interfaces wants its collectives spread over them.
STRIPE_MIN_BYTES = 1 << 20
_ALIGN = 64 * 1024
_CHUNK = 512 * 1024  # bytes per system call, as for the pair's connection
_POLL_MS = 500  # a stripe loop checks this often whether the peer is still there
log = logging.getLogger("pyc10d")


def stripes(nbytes: int, count: int) -> list[tuple[int, int]]:
    """``count`` contiguous ``(start, end)`` byte ranges covering ``nbytes`` (the last ones
    may be empty); both ends of a connection compute the same split."""
    step = -(-nbytes // count)
    step = -(-step // _ALIGN) * _ALIGN
    return [(min(i * step, nbytes), min((i + 1) * step, nbytes)) for i in range(count)]


def _pump(socks: Sequence[socket.socket], views: Sequence[memoryview], event: int,
          move: Callable[[socket.socket, memoryview], int], check: Callable[[], None]) -> None:
    """Move every ``views[i]`` over ``socks[i]``, all at once, with non-blocking calls."""
    done = [0] * len(views)
    left = {s.fileno(): i for i, (s, v) in enumerate(zip(socks, views)) if len(v)}
    poller = select.poll()
    for fd in left:
        poller.register(fd, event)
    while left:
        ready = poller.poll(_POLL_MS)
        if not ready:
            check()
        for fd, _ in ready:
            i = left[fd]
            view = views[i]
            try:
                k = move(socks[i], view[done[i]:done[i] + _CHUNK])
            except (BlockingIOError, InterruptedError):
                continue
            if k == 0:
                raise ConnectionResetError("connection closed by peer")
            done[i] += k
            if done[i] == len(view):
                poller.unregister(fd)
                del left[fd]


def send_stripes(socks: Sequence[socket.socket], data: memoryview, check: Callable[[], None]) -> None:
    """Write ``data``'s stripes, stripe ``i`` on ``socks[i]`` (``socks[0]``: the pair's
    connection, its header written already)."""
    views = [data[a:b] for a, b in stripes(len(data), len(socks))]
    _pump(socks, views, select.POLLOUT, lambda s, v: s.send(v, socket.MSG_DONTWAIT), check)


def recv_stripes(socks: Sequence[socket.socket], view: memoryview, check: Callable[[], None]) -> None:
    """Read a striped payload into ``view``: stripe ``i`` from ``socks[i]``."""
    views = [view[a:b] for a, b in stripes(len(view), len(socks))]
    _pump(socks, views, select.POLLIN, lambda s, v: s.recv_into(v, len(v), socket.MSG_DONTWAIT), check)


class Links:
    """A rank's links: those it dialled (``outgoing``, per peer) and those peers dialled to it
    (``admit``). ``hosts``: the rank's advertised addresses (link ``i`` leaves from ``hosts[i]``)."""

    def __init__(self, rank: int, hosts: Sequence[str], secret: bytes | None, enabled: bool,
                 tune: Callable[[socket.socket], None]) -> None:
        self.rank, self.hosts, self._secret, self._tune = rank, list(hosts), secret, tune
        self.enabled = enabled and len(self.hosts) > 1
        self._out: dict[int, list[socket.socket]] = {}
        self._in: dict[int, dict[int, socket.socket]] = {}
        self._lock = threading.Lock()
        self._dialing: dict[int, threading.Lock] = {}

    def admit(self, peer: int, link: int, sock: socket.socket) -> None:
        """Take link ``link`` from ``peer`` (the listener vetted its hello) and answer it."""
        self._tune(sock)
        # Registered before the answer: the dialer stripes its next message as soon as it reads
        # it, and this rank's receiver must find the link then (answered first, a loaded host
        # read a striped header before the link was in ``_in`` and dropped the peer).
        with self._lock:
            old = self._in.setdefault(peer, {}).get(link)
            self._in[peer][link] = sock
        if old is not None:
            old.close()
        try:
            sock.sendall(ACCEPTED)
        except OSError:
            with self._lock:
                if self._in.get(peer, {}).get(link) is sock:
                    del self._in[peer][link]
            raise

    def incoming(self, peer: int, count: int) -> list[socket.socket] | None:
        """``peer``'s links 1..count-1 to this rank, or None if one is missing."""
        with self._lock:
            have = self._in.get(peer, {})
            socks = [have.get(i) for i in range(1, count)]
        return None if any(s is None for s in socks) else socks  # type: ignore[return-value]

    def outgoing(self, peer: int, peer_hosts: Sequence[str], port: int, nonce: int,
                 timeout: float) -> list[socket.socket]:
        """This rank's links to ``peer`` (dialled on first use; [] when the pair has none)."""
        got = self._out.get(peer)
        if got is not None or not self.enabled:
            return got or []
        with self._lock:
            dialing = self._dialing.setdefault(peer, threading.Lock())
        with dialing:
            if peer not in self._out:
                self._out[peer] = self._dial_all(peer, peer_hosts, port, nonce, timeout)
        return self._out[peer]

    def _dial_all(self, peer: int, peer_hosts: Sequence[str], port: int, nonce: int,
                  timeout: float) -> list[socket.socket]:
        count = min(len(self.hosts), len(peer_hosts), MAX_STRIPES)
        socks: list[socket.socket] = []
        for link in range(1, count):
            try:
                socks.append(self._dial(peer, link, peer_hosts[link], port, nonce, timeout))
            except (OSError, auth.AuthError) as e:
                log.warning("tcp transport: rank %d could not open link %d (%s -> %s) to rank %d: "
                            "%s; its messages to rank %d go over one connection",
                            self.rank, link, self.hosts[link], format_hostport(peer_hosts[link], port),
                            peer, e, peer)
                for s in socks:
                    s.close()
                return []
        return socks

    def _dial(self, peer: int, link: int, host: str, port: int, nonce: int, timeout: float) -> socket.socket:
        sock = socket.create_connection((host, port), timeout=timeout, source_address=(self.hosts[link], 0))
        try:
            if self._secret is not None:
                auth.authenticate(sock, self._secret, f"tcp transport: rank {self.rank} failed to "
                                                      f"authenticate link {link} with rank {peer}")
            sock.sendall(HELLO.pack(self.rank | link << LINK_SHIFT, nonce))
            answer = sock.recv(1)
            if answer != ACCEPTED:
                raise ConnectionRefusedError(f"rank {peer} refused the link (answer {answer!r}; see its log)")
            sock.settimeout(None)
            self._tune(sock)
            return sock
        except BaseException:
            sock.close()
            raise

    def drop(self, peer: int) -> None:
        """Shut ``peer``'s links down (it is lost): a stripe loop on them ends at once."""
        with self._lock:
            socks = list(self._out.get(peer, [])) + list(self._in.get(peer, {}).values())
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            socks = [s for v in self._out.values() for s in v]
            socks += [s for v in self._in.values() for s in v.values()]
            self._out.clear()
            self._in.clear()
        for s in socks:
            s.close()
