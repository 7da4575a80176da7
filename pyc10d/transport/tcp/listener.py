"""A tcp rank's listening socket: open for the transport's lifetime, every connection vetted.

Connections are lazy (see ``tcp``): a peer may dial this rank at any time, not only during
set-up, so the listener stays up until the transport closes. Anyone can reach it, so every
connection is vetted before it becomes a peer's: authentication if ``PYC10D_AUTH_TOKEN`` is
set, then the hello (the dialer's rank and the nonce this rank published through the store),
within ``HELLO_TIMEOUT_S``, all inside TLS when ``PYC10D_TLS_*`` is set (TLS and the token are
``admission.Admission``, the way into TCPStore's server too, driven by the same loop). A connection that fails any of it is closed without a word and
the reason is logged; at most ``MAX_PENDING`` connections are vetted at once.

One thread does it all with ``selectors``, reading whatever each connection has sent: a
silent or slow connection never delays a real peer, and a peer's dial costs no thread
start on this side (a dial is on the critical path of a rank's first collective with that
peer, and on a busy host every thread hand-off is a scheduling delay).

A vetted hello is handed to ``admit(peer, sock)``, which answers the dialer with one byte (see
``tcp.TCPTransport._admit``): ``ACCEPTED`` (this socket is the pair's connection from now on)
or ``USE_OTHER`` (the pair has, or is about to have, the connection this rank dialled), or
returns a reason to refuse it.

A dialer's hello may name a link (``LINK_SHIFT``): an extra connection that carries only the
stripes of large messages (see ``tcp``), accepted only when this rank has that many
addresses. The socket listens on every address of the family of the rank's addresses (IPv6:
dual-stack, so IPv4 peers get in too), or on the one loopback address a single-host job uses.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable, Sequence

from ... import threads, tls
from ...admission import TIMEOUT_S, Admission, Refused
from ...hostport import family_of, format_hostport
from .netif import is_loopback

HELLO = struct.Struct("<Iq")  # the dialer's rank (and link), the nonce this rank published
# The hello's first field: the dialer's rank in the low bits, a link above (0: the pair's
# connection). Ranks stay below 2**24.
LINK_SHIFT = 24
RANK_MASK = (1 << LINK_SHIFT) - 1
ACCEPTED, USE_OTHER = b"\x01", b"\x00"
# A connection to a rank's listener has this long to authenticate and say hello.
HELLO_TIMEOUT_S = TIMEOUT_S
# Connections vetted at once; more are refused.
MAX_PENDING = 512
log = logging.getLogger("pyc10d")


class _Pending:
    """A connection being vetted: its way in (``Admission``) and its hello so far."""

    __slots__ = ("adm", "sock", "who", "got")

    def __init__(self, adm: Admission, who: str) -> None:
        self.adm, self.sock, self.who = adm, adm.sock, who
        self.got = bytearray()


class Listener:
    """Accepts and vets connections to rank ``rank`` of ``size`` until ``close``."""

    def __init__(self, rank: int, size: int, hosts: Sequence[str], secret: bytes | None,
                 admit: Callable[[int, socket.socket, int], str | None]) -> None:
        self.rank, self.size, self.links = rank, size, len(hosts)
        self._secret = secret
        self._tls = tls.context(server_side=True)
        self._admit = admit
        self.nonce = int.from_bytes(os.urandom(7), "little")
        family, where = _bind_address(hosts)
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and not is_loopback(where):
            self._sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self._sock.bind((where, 0))
        self._sock.listen(max(size, 128))  # room for stray connections beside the peers
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._pending: dict[socket.socket, _Pending] = {}
        self._closed = False
        # Accepts and answers hellos, never in torch: the exit need not wait for it.
        self._thread = threads.start(self._loop, f"pyc10d-tcp-accept-{rank}", join_at_exit=False)

    # -- the loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._closed:
                timeout = None
                if self._pending:
                    first = min(p.adm.deadline for p in self._pending.values())
                    timeout = max(first - time.monotonic(), 0.0)
                for key, _ in self._sel.select(timeout):
                    if key.data is not None:
                        self._readable(key.data)
                    elif key.fileobj is self._sock:
                        self._accept()
                now = time.monotonic()
                for p in [p for p in self._pending.values() if p.adm.deadline <= now]:
                    self._refuse(p, p.adm.ended(timed_out=True) or "it sent no hello in time")
        finally:
            for p in list(self._pending.values()):
                self._drop(p)
            self._sel.close()
            self._sock.close()
            self._wake_r.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of file descriptors: log, keep serving the rest
                log.warning("tcp transport: rank %d could not accept a connection: %s", self.rank, e)
                return
            p = _Pending(Admission(sock, self._tls, self._secret, HELLO_TIMEOUT_S),
                         format_hostport(addr[0], addr[1]))
            if len(self._pending) >= MAX_PENDING:
                self._refuse(p, f"{MAX_PENDING} connections are being vetted already")
                continue
            self._pending[p.sock] = p
            self._sel.register(p.sock, p.adm.events, p)

    def _readable(self, p: _Pending) -> None:
        if not p.adm.done:
            try:
                rest = p.adm.advance()
            except Refused as e:
                self._refuse(p, str(e))
                return
            self._sel.modify(p.sock, p.adm.events, p)
            if rest is None:
                return
            p.got += rest
        self._vet(p)
        while p.sock in self._pending and tls.buffered(p.sock):  # decrypted: no readiness event
            self._vet(p)

    def _vet(self, p: _Pending) -> None:
        if len(p.got) < HELLO.size:
            try:
                data = p.sock.recv(HELLO.size - len(p.got))
            except (*tls.WOULD_BLOCK, InterruptedError):
                return
            except OSError as e:
                self._refuse(p, str(e) or type(e).__name__)
                return
            if not data:
                self._refuse(p, "it closed the connection before its hello")
                return
            p.got += data
        if len(p.got) >= HELLO.size:
            self._hello(p)

    def _hello(self, p: _Pending) -> None:
        field, got_nonce = HELLO.unpack(p.got[:HELLO.size])
        peer, link = field & RANK_MASK, field >> LINK_SHIFT
        if len(p.got) > HELLO.size:
            self._refuse(p, "it sent more than a hello before its answer")
        elif got_nonce != self.nonce:
            self._refuse(p, "its hello does not carry the nonce this rank published")
        elif not (0 <= peer < self.size and peer != self.rank):
            self._refuse(p, f"it claims rank {peer}, not a peer of rank {self.rank} "
                            f"in a world of {self.size}")
        elif link >= self.links:
            self._refuse(p, f"rank {peer} asks for link {link}; rank {self.rank} has {self.links}")
        else:
            self._forget(p)
            p.sock.setblocking(True)
            try:
                reason = self._admit(peer, p.sock, link)
            except OSError as e:  # the dialer went away before hearing the answer
                reason = f"answering its hello failed: {e}"
            if reason is not None:
                self._refuse(p, f"rank {peer}: {reason}")

    # -- ending connections -----------------------------------------------------------------
    def _forget(self, p: _Pending) -> None:
        self._pending.pop(p.sock, None)
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, p: _Pending) -> None:
        self._forget(p)
        p.sock.close()

    def _refuse(self, p: _Pending, reason: str) -> None:
        if not self._closed:
            log.warning("tcp transport: rank %d refused the connection from %s: %s",
                        self.rank, p.who, reason)
        self._drop(p)  # (one not pending, or not registered, is just closed)

    def close(self) -> None:
        """Stop accepting; connections still being vetted are closed quietly."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=1.0)
        self._wake_w.close()


def _bind_address(hosts: Sequence[str]) -> tuple[socket.AddressFamily, str]:
    """Where the listener binds for a rank advertising ``hosts``: its one loopback address
    (a single-host job), else every address (IPv6 and dual-stack when any host is IPv6)."""
    if len(set(hosts)) == 1 and is_loopback(hosts[0]):
        return family_of(hosts[0]), hosts[0]
    if any(family_of(h) == socket.AF_INET6 for h in hosts):
        return socket.AF_INET6, "::"
    return socket.AF_INET, "0.0.0.0"
