"""A tcp rank's listening socket: open for the transport's lifetime, every connection vetted.

Connections are lazy (see ``tcp``): a peer may dial this rank at any time, not only during
set-up, so the listener stays up until the transport closes. Anyone can reach it, so each
connection is vetted on its own short-lived thread, bounded by ``HELLO_TIMEOUT_S``:
authentication if ``PYC10D_AUTH_TOKEN`` is set, then the hello (the dialer's rank and the
nonce this rank published through the store). A connection that fails any of it is closed
without a word and the reason is logged; it never delays a real peer, and at most
``MAX_PENDING`` connections are vetted at once.

A vetted hello is handed to ``admit(peer, sock)``, which answers the dialer with one byte (see
``tcp.TCPTransport._admit``): ``ACCEPTED`` (this socket is the pair's connection from now on)
or ``USE_OTHER`` (the pair has, or is about to have, the connection this rank dialled), or
returns a reason to refuse it.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

from .. import auth

HELLO = struct.Struct("<Iq")  # the dialer's rank, the nonce this rank published
ACCEPTED, USE_OTHER = b"\x01", b"\x00"
# A connection to a rank's listener has this long to authenticate and say hello.
HELLO_TIMEOUT_S = auth.HANDSHAKE_TIMEOUT_S
# Connections vetted at once; more are refused (each holds a thread until it passes or fails).
MAX_PENDING = 512
log = logging.getLogger("pyc10d")


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        if k == 0:
            raise ConnectionResetError("connection closed by peer")
        got += k


class Listener:
    """Accepts and vets connections to rank ``rank`` of ``size`` until ``close``."""

    def __init__(self, rank: int, size: int, host: str, secret: bytes | None,
                 admit: Callable[[int, socket.socket], str | None]) -> None:
        self.rank, self.size = rank, size
        self._secret = secret
        self._admit = admit
        self.nonce = int.from_bytes(os.urandom(7), "little")
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1" if host == "127.0.0.1" else "0.0.0.0", 0))
        self._sock.listen(max(size, 128))  # room for stray connections beside the peers
        self.port = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._pending: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"pyc10d-tcp-accept-{rank}")
        self._thread.start()

    def _refuse(self, sock: socket.socket, who: str, reason: str) -> None:
        with self._lock:
            self._pending.discard(sock)
            quiet = self._closed
        if not quiet:
            log.warning("tcp transport: rank %d refused the connection from %s: %s",
                        self.rank, who, reason)
        sock.close()

    def _vet(self, sock: socket.socket, who: str) -> None:
        try:
            sock.settimeout(HELLO_TIMEOUT_S)
            if self._secret is not None:
                auth.server_handshake(sock, self._secret)
            buf = bytearray(HELLO.size)
            recv_exact(sock, memoryview(buf))
        except (OSError, auth.AuthError) as e:
            what = "authentication failed: " if isinstance(e, auth.AuthError) else ""
            self._refuse(sock, who, f"{what}{e or type(e).__name__}")
            return
        peer, got_nonce = HELLO.unpack(buf)
        if got_nonce != self.nonce:
            self._refuse(sock, who, "its hello does not carry the nonce this rank published")
            return
        if not (0 <= peer < self.size and peer != self.rank):
            self._refuse(sock, who, f"it claims rank {peer}, not a peer of rank {self.rank} "
                                    f"in a world of {self.size}")
            return
        sock.settimeout(None)
        with self._lock:
            self._pending.discard(sock)
            closed = self._closed
        if closed:
            sock.close()
            return
        try:
            reason = self._admit(peer, sock)
        except OSError as e:  # the dialer went away before hearing the answer
            reason = f"answering its hello failed: {e}"
        if reason is not None:
            self._refuse(sock, who, f"rank {peer}: {reason}")

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, addr = self._sock.accept()
            except OSError:
                return  # the listener was shut down
            who = f"{addr[0]}:{addr[1]}"
            with self._lock:
                crowded = len(self._pending) >= MAX_PENDING
                if not crowded:
                    self._pending.add(sock)
            if crowded:
                self._refuse(sock, who, f"{MAX_PENDING} connections are being vetted already")
                continue
            threading.Thread(target=self._vet, args=(sock, who), daemon=True,
                             name=f"pyc10d-tcp-vet-{self.rank}").start()

    def close(self) -> None:
        """Stop accepting; connections still being vetted are closed quietly."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            stragglers = list(self._pending)
        for sock in (self._sock, *stragglers):
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes accept() and the vetting threads
            except OSError:
                pass
        self._sock.close()
        deadline = time.monotonic() + 1.0
        self._thread.join(timeout=max(deadline - time.monotonic(), 0.0))
