"""Optional shared-secret authentication of every pyc10d socket: TCPStore and tcp transport.

When ``PYC10D_AUTH_TOKEN`` is set, each new connection proves, in both directions, that its
ends hold the same token before either reads anything else from the other::

    client -> server   MAGIC, client nonce                                     40 bytes
    server -> client   MAGIC, server nonce, HMAC(token, "server" nc ns)        72 bytes
    client -> server   HMAC(token, "client" ns nc)                             32 bytes

The token never crosses the wire, fresh ``os.urandom`` nonces on both sides make a recorded
handshake useless on another connection, and the role labels keep a proof from being
reflected back at the side that sent the challenge. Every read is of a fixed size, so an
unauthenticated peer cannot make either side allocate anything.

Why the client speaks first: a server without a token takes the magic for a malformed
request and closes at once, so a misconfigured client fails fast instead of waiting for a
challenge that never comes. When the variable is unset nothing here runs and the wire is
exactly what it was without authentication (no extra round trip).

A leaf module, like ``errors``: the store (the lowest layer) and the transports import it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket

from .errors import DistNetworkError
from .settings import AUTH_TOKEN

ENV = AUTH_TOKEN.name
MAGIC = b"PYC10DA1"
_NONCE = 32
_MAC = hashlib.sha256().digest_size
# How long a server gives a new connection to finish the handshake: a peer that connects and
# stays silent must not hold its slot (and thread) for the whole rendezvous timeout.
HANDSHAKE_TIMEOUT_S = 10.0


class AuthError(DistNetworkError):
    """A connection did not pass the ``PYC10D_AUTH_TOKEN`` handshake."""


class NotAuthenticating(AuthError):
    """The peer sent something other than a handshake: it has no token set."""


def token() -> bytes | None:
    """The shared secret, read from the environment at each connection (None: auth off)."""
    value = AUTH_TOKEN.get()
    return value.encode() if value else None


def _mac(secret: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


def _recv(sock: socket.socket, n: int, stage: str) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    try:
        while got < n:
            k = sock.recv_into(view[got:])
            if k == 0:
                raise AuthError(f"the peer closed the connection {stage}")
            got += k
    except TimeoutError as e:
        raise AuthError(f"the peer sent nothing in time {stage}") from e
    return bytes(buf)


def client_handshake(sock: socket.socket, secret: bytes) -> None:
    """Prove ``secret`` to the server on ``sock`` and check that it holds it too.

    Raises ``AuthError`` (a ``DistNetworkError``) when the server closes the connection, is
    silent past the socket's timeout, or answers with a proof of another token.
    """
    mine = os.urandom(_NONCE)
    sock.sendall(MAGIC + mine)
    reply = _recv(sock, len(MAGIC) + _NONCE + _MAC,
                  "instead of answering the challenge (does it have PYC10D_AUTH_TOKEN set?)")
    if reply[: len(MAGIC)] != MAGIC:
        raise AuthError("the peer does not speak the authentication handshake")
    theirs, proof = reply[len(MAGIC): len(MAGIC) + _NONCE], reply[len(MAGIC) + _NONCE:]
    if not hmac.compare_digest(proof, _mac(secret, b"server", mine, theirs)):
        raise AuthError("the peer's proof does not match: its PYC10D_AUTH_TOKEN differs")
    sock.sendall(_mac(secret, b"client", theirs, mine))


def authenticate(sock: socket.socket, secret: bytes, who: str) -> None:
    """``client_handshake`` for a connection just dialled: on failure ``sock`` is closed and
    the ``AuthError`` says ``who`` dialled whom (``"<who>: <why>"``)."""
    try:
        client_handshake(sock, secret)
    except (AuthError, OSError) as e:
        sock.close()
        raise AuthError(f"{who}: {e}") from e


class ServerHandshake:
    """The server's side of the handshake as a state machine fed with bytes, no socket.

    Why: the TCPStore server runs one event loop for every connection and must never block
    on one client, so it hands over whatever ``recv`` returned and sends what comes back;
    ``server_handshake`` drives the same machine on a blocking socket, so both speak exactly
    the same protocol and fail with the same words.
    """

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._got = bytearray()
        self._mine = self._theirs = b""
        self.done = False

    @property
    def stage(self) -> str:
        """Where the handshake is, in the words of an error about it."""
        if self._mine:
            return "before proving its token (a different PYC10D_AUTH_TOKEN?)"
        if len(self._got) >= len(MAGIC):
            return "in the middle of the handshake"
        return "before authenticating"

    def want(self) -> int:
        """How many bytes the next step needs; before the magic is complete, one at a time, so
        a plain request shorter than the magic is told apart at once."""
        if self._mine:
            return _MAC - len(self._got)
        if len(self._got) < len(MAGIC):
            return 1
        return len(MAGIC) + _NONCE - len(self._got)

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """Take received bytes; returns (bytes to send, bytes that came after the handshake).

        Raises ``NotAuthenticating`` as soon as the bytes cannot be the magic, ``AuthError``
        for a wrong proof. ``done`` turns True once the client proved the token.
        """
        self._got += data
        if not self._mine:
            head = bytes(self._got[: len(MAGIC)])
            if not MAGIC.startswith(head):
                raise NotAuthenticating("the peer did not authenticate (no PYC10D_AUTH_TOKEN set?)")
            if len(self._got) < len(MAGIC) + _NONCE:
                return b"", b""
            self._theirs = bytes(self._got[len(MAGIC): len(MAGIC) + _NONCE])
            rest = bytes(self._got[len(MAGIC) + _NONCE:])
            self._mine = os.urandom(_NONCE)
            self._got = bytearray(rest)
            reply = MAGIC + self._mine + _mac(self._secret, b"server", self._theirs, self._mine)
            return reply, self._finish()
        return b"", self._finish()

    def _finish(self) -> bytes:
        if len(self._got) < _MAC:
            return b""
        proof, rest = bytes(self._got[:_MAC]), bytes(self._got[_MAC:])
        if not hmac.compare_digest(proof, _mac(self._secret, b"client", self._mine, self._theirs)):
            raise AuthError("the peer's proof does not match: its PYC10D_AUTH_TOKEN differs")
        self.done = True
        self._got = bytearray()
        return rest

    def ended(self, timed_out: bool) -> AuthError:
        """The error for a peer that closed (or, ``timed_out``, went silent) mid-handshake."""
        what = "sent nothing in time" if timed_out else "closed the connection"
        return AuthError(f"the peer {what} {self.stage}")


def server_handshake(sock: socket.socket, secret: bytes) -> None:
    """Check that the client on ``sock`` holds ``secret`` (and prove that we do).

    Raises ``NotAuthenticating`` when the first bytes are not a handshake (the client has no
    token), ``AuthError`` for a wrong proof, a closed connection or a silent peer (bound the
    wait with the socket's timeout).
    """
    hs = ServerHandshake(secret)
    while not hs.done:
        reply, _ = hs.feed(_recv(sock, hs.want(), hs.stage))
        if reply:
            sock.sendall(reply)
