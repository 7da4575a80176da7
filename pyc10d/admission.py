"""The way into a pyc10d server: accept, then TLS, then the token, as one non-blocking machine.

Two servers take connections from anyone who can reach them: TCPStore's server
(``store/tcp_server``) and a tcp rank's listener (``transport/tcp/listener``). Both run one
event loop for every connection, so neither may block on one client, and both must refuse the
same clients with the same words. ``Admission`` is that shared way in: the TLS handshake when
``PYC10D_TLS_*`` is set (``tls.ServerHandshake``), then the ``PYC10D_AUTH_TOKEN`` handshake
when a token is set (``auth.ServerHandshake``), all within one deadline. Each server registers
``sock`` for ``events``, calls ``advance`` when it is ready, and speaks its own protocol once
``advance`` hands back the bytes that came after the handshakes.

A leaf module beside ``auth`` and ``tls``: the store (the lowest layer) and the transports
import it.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import time

from . import auth, tls

TIMEOUT_S = auth.HANDSHAKE_TIMEOUT_S


class Refused(Exception):
    """Why a connection was refused (to the server's loop, never to users); ``plain`` when the
    client has no token and speaks the server's plain protocol (the store answers it in it)."""

    def __init__(self, reason: str, plain: bool = False) -> None:
        super().__init__(reason)
        self.plain = plain


class Admission:
    """One accepted connection on its way in: non-blocking from here on."""

    __slots__ = ("sock", "deadline", "done", "_tls", "_token")

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext | None, secret: bytes | None,
                 timeout: float = TIMEOUT_S) -> None:
        sock.setblocking(False)
        self._tls = tls.server_handshake(sock, ctx)
        self.sock: socket.socket = sock if self._tls is None else self._tls.sock
        self._token = None if secret is None else auth.ServerHandshake(secret)
        self.deadline = time.monotonic() + timeout
        self.done = self._tls is None and self._token is None

    @property
    def events(self) -> int:
        """What to wait for before the next ``advance``."""
        return self._tls.events if self._tls is not None else selectors.EVENT_READ

    def advance(self) -> bytes | None:
        """Take the next step: None while the handshakes go on, then the bytes that came after
        them (maybe none). Raises ``Refused`` saying why the client is turned away."""
        if self._tls is not None:
            try:
                if not self._tls.step():
                    return None
            except tls.TLSError as e:
                raise Refused(str(e)) from e
            self._tls = None
        hs, rest = self._token, b""
        while hs is not None and not hs.done:
            try:
                data = self.sock.recv(hs.want())
            except (*tls.WOULD_BLOCK, InterruptedError):
                return None
            except OSError as e:
                raise Refused(str(e) or type(e).__name__) from e
            if not data:
                raise Refused(f"authentication failed: {hs.ended(timed_out=False)}")
            try:
                reply, rest = hs.feed(data)
                if reply:
                    self.sock.sendall(reply)  # 72 bytes to a fresh socket: the buffer takes them
            except auth.AuthError as e:
                raise Refused(f"authentication failed: {e}", isinstance(e, auth.NotAuthenticating)) from e
            except OSError as e:
                raise Refused(str(e) or type(e).__name__) from e
        self._token, self.done = None, True
        return rest

    def ended(self, timed_out: bool) -> str | None:
        """Why a client that closed (or, ``timed_out``, went silent) mid-way is refused; None
        once it is in (the server's own protocol says why then)."""
        if self._tls is not None:
            return f"TLS handshake failed: {tls.describe(TimeoutError() if timed_out else EOFError())}"
        if self._token is not None:
            return f"authentication failed: {self._token.ended(timed_out=timed_out)}"
        return None
