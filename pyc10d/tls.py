"""Optional mutual TLS on every pyc10d socket: TCPStore (client and server) and tcp transport.

With ``PYC10D_TLS_CERT``, ``PYC10D_TLS_KEY`` and ``PYC10D_TLS_CA`` set (the same three files
on every rank), each new connection is wrapped in TLS 1.3 (Python's ``ssl``) before anything
else crosses it, and both ends present their certificate: a peer whose certificate is not
signed by that CA is refused on both sides, with an error that says so. Everything after the
handshake (the ``PYC10D_AUTH_TOKEN`` handshake if set, store requests and values, the
transport's hello and every frame and tensor byte) travels inside TLS.

Who is checked: the certificate's signature by the CA, not its name. Ranks dial each other
by the addresses they publish through the store, and one certificate shared by every rank
cannot name every host; admission to the job is "holds a key whose certificate the job's CA
signed", as a shared ``PYC10D_AUTH_TOKEN`` is "holds the token".

Why the server confirms: in TLS 1.3 the client's handshake ends before the server has
checked the client's certificate, so a refused client would learn of it only at its first
read, as an unexplained failure somewhere later. The server therefore sends one byte,
``CONFIRM``, once it has accepted the client, and the client waits for it: a refusal surfaces
in the handshake, on both sides, as a ``TLSError`` naming the certificate.

Sockets come back as ``TLSSocket`` (an ``ssl.SSLSocket``) that keeps the calls the data path
makes working as on a plain socket: ``recv_into(..., MSG_WAITALL)`` fills the buffer
(``SSLSocket`` refuses flags), and ``shutdown`` leaves the TLS state in place, so a send
racing a shutdown fails instead of going out in clear. ``buffered(sock)`` tells a caller that
waits in ``poll`` whether decrypted bytes already wait inside the TLS layer, which poll cannot
see. With the variables unset nothing here runs: plain sockets, unchanged wire.

A leaf module, like ``auth``: the store (the lowest layer) and the transports import it.
"""

from __future__ import annotations

import os
import selectors
import socket
import ssl
import threading

from . import threads
from .errors import DistNetworkError
from .settings import TLS_CA, TLS_CERT, TLS_KEY

ENV_CERT, ENV_KEY, ENV_CA = TLS_CERT.name, TLS_KEY.name, TLS_CA.name
CONFIRM = b"\x16"
# How long either side gives a new connection to finish the TLS handshake.
HANDSHAKE_TIMEOUT_S = 10.0
# Non-blocking calls that must be retried when the socket is ready (plain or TLS).
WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class TLSError(DistNetworkError):
    """A connection failed the TLS handshake (certificate refused, peer without TLS, ...)."""


class CertificateRefused(TLSError):
    """One side refused the other's certificate: dialling again cannot help."""


class TLSSocket(ssl.SSLSocket):
    """An ``SSLSocket`` with the plain socket's behaviour where pyc10d's data path needs it."""

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:  # type: ignore[override]
        """``MSG_WAITALL`` fills ``nbytes`` (or stops at the end of the stream), as a plain
        socket does; other flags are refused by ``SSLSocket`` as before."""
        if not flags & socket.MSG_WAITALL:
            return super().recv_into(buffer, nbytes, flags)
        view = memoryview(buffer).cast("B")
        n = nbytes or len(view)
        got = 0
        while got < n:
            k = super().recv_into(view[got:n], n - got)
            if k == 0:
                break
            got += k
        return got

    def shutdown(self, how: int) -> None:
        """Shut the connection down without dropping the TLS state (``SSLSocket.shutdown``
        drops it, after which another thread's ``sendall`` would write in clear)."""
        socket.socket.shutdown(self, how)


def settings() -> tuple[str, str, str] | None:
    """(cert, key, CA) file paths from the environment, or None when TLS is off. Raises
    ``TLSError`` when only some of the three are set: half a configuration must not quietly
    fall back to clear text."""
    values = [s.get() or "" for s in (TLS_CERT, TLS_KEY, TLS_CA)]
    if not any(values):
        return None
    if not all(values):
        missing = [n for n, v in zip((ENV_CERT, ENV_KEY, ENV_CA), values) if not v]
        raise TLSError(f"TLS: {', '.join(missing)} not set; set {ENV_CERT}, {ENV_KEY} and {ENV_CA} "
                       "together (or none of them)")
    return values[0], values[1], values[2]


def enabled() -> bool:
    return settings() is not None


_CACHE: dict[tuple[object, ...], ssl.SSLContext] = {}
_CACHE_LOCK = threading.Lock()
threads.renew_after_fork(globals(), _CACHE_LOCK=threading.Lock)


def context(server_side: bool) -> ssl.SSLContext | None:
    """The context for new connections (None: TLS off), rebuilt when a file changes."""
    paths = settings()
    if paths is None:
        return None
    try:
        stamp = tuple(os.stat(p).st_mtime_ns for p in paths)
    except OSError as e:
        raise TLSError(f"TLS: cannot read {e.filename} ({e.strerror})") from e
    key = (server_side, paths, stamp)
    with _CACHE_LOCK:
        ctx = _CACHE.get(key)
        if ctx is None:
            _CACHE.clear()
            ctx = _CACHE[key] = _make(server_side, *paths)
        return ctx


def _make(server_side: bool, cert: str, key: str, ca: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # see the module docstring: the CA's signature admits a peer
    ctx.verify_mode = ssl.CERT_REQUIRED
    if server_side:
        ctx.num_tickets = 0  # no resumption, and no post-handshake messages on the stream
    ctx.sslsocket_class = TLSSocket
    try:
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as e:
        raise TLSError(f"TLS: cannot load {ENV_CERT}={cert}, {ENV_KEY}={key} or {ENV_CA}={ca}: {e}") from e
    return ctx


_REFUSALS = ("CERTIFICATE_VERIFY_FAILED", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE",
             "TLSV13_ALERT_CERTIFICATE_REQUIRED", "TLSV1_ALERT_DECRYPT_ERROR", "SSLV3_ALERT_CERTIFICATE_UNKNOWN")


def failure(e: BaseException, what: str) -> TLSError:
    """The ``TLSError`` for a handshake that failed with ``e``: ``"<what>: TLS handshake failed:
    <why>"``, a ``CertificateRefused`` when a certificate was refused."""
    cls = CertificateRefused if getattr(e, "reason", None) in _REFUSALS else TLSError
    return cls(f"{what + ': ' if what else ''}TLS handshake failed: {describe(e)}")


def describe(e: BaseException) -> str:
    """What a handshake failure means, in the words of the certificate check."""
    reason = getattr(e, "reason", None) or ""
    if reason == "CERTIFICATE_VERIFY_FAILED":
        detail = getattr(e, "verify_message", "") or str(e)
        return f"the peer's certificate is not signed by {ENV_CA} ({detail}): refused it"
    if reason in _REFUSALS:
        return (f"the peer refused this side's certificate ({reason.lower()}): "
                f"it is not signed by the peer's {ENV_CA}")
    if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNEXPECTED_EOF_WHILE_READING", "PACKET_LENGTH_TOO_LONG"):
        return f"the peer does not speak TLS ({reason.lower()}): is {ENV_CERT} etc. set on every rank?"
    if isinstance(e, (TimeoutError, BlockingIOError)):
        return "the peer sent nothing in time during the TLS handshake"
    if isinstance(e, (ConnectionError, EOFError)) or isinstance(e, ssl.SSLEOFError):
        return "the peer closed the connection during the TLS handshake (is it using TLS, with the same CA?)"
    return f"{type(e).__name__}: {e}"


def wrap_client(sock: socket.socket, who: str, timeout: float = HANDSHAKE_TIMEOUT_S) -> socket.socket:
    """``sock`` (connected, blocking) after the client's handshake and the server's
    ``CONFIRM``; the original object is detached. On failure ``sock`` is closed and a
    ``TLSError`` says ``"<who>: TLS handshake failed: <why>"``."""
    ctx = context(server_side=False)
    if ctx is None:
        return sock
    sock.settimeout(timeout)
    tls = ctx.wrap_socket(sock, server_side=False, do_handshake_on_connect=False)
    try:
        tls.do_handshake()
        if tls.recv(1) != CONFIRM:
            raise ConnectionResetError("closed before confirming the handshake")
    except (OSError, EOFError) as e:
        tls.close()
        raise failure(e, who) from e
    tls.settimeout(None)
    return tls


class ServerHandshake:
    """The server's side on a non-blocking socket, for an event loop (the TCPStore server,
    the transport's listener): ``sock`` is the wrapped socket to register from now on;
    call ``step`` when it is ready for ``events``."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext) -> None:
        sock.setblocking(False)
        self.sock: socket.socket = ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        self.events = selectors.EVENT_READ
        self.done = False
        self._shaken = False

    def step(self) -> bool:
        """Advance; True once the client is accepted and ``CONFIRM`` went out. Raises
        ``TLSError`` saying why the client was refused."""
        try:
            if not self._shaken:
                self.sock.do_handshake()
                self._shaken = True
            self.sock.send(CONFIRM)
        except ssl.SSLWantReadError:
            self.events = selectors.EVENT_READ
            return False
        except (ssl.SSLWantWriteError, BlockingIOError):
            self.events = selectors.EVENT_WRITE
            return False
        except (OSError, EOFError) as e:
            raise failure(e, "") from e
        self.done = True
        self.events = selectors.EVENT_READ
        return True


def server_handshake(sock: socket.socket, ctx: ssl.SSLContext | None) -> ServerHandshake | None:
    """A ``ServerHandshake`` for a just-accepted ``sock`` under ``ctx`` (the server's
    ``context(server_side=True)``, read once when it started), or None when TLS is off."""
    return None if ctx is None else ServerHandshake(sock, ctx)


def is_tls(sock: socket.socket) -> bool:
    return isinstance(sock, ssl.SSLSocket)


def buffered(sock: socket.socket) -> int:
    """Bytes already decrypted inside ``sock``'s TLS layer (0 for a plain socket): a reader
    that waits for the descriptor must first take these, or it may wait for ever."""
    pending = getattr(sock, "pending", None)
    return pending() if pending is not None else 0
