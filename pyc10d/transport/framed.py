"""What the tcp and shm transports share: framed messages over one byte stream per peer.

Both move frames of (channel, nbytes, meta, kind) followed by the payload, and both drain
each peer's stream on a receiver thread. This class holds that common part — the frame
kinds, ``send``/``irecv``/``abort`` and the receive pump that matches data frames with
posted receives (reading straight into the destination when the receive came first) and
handles the control frames (a peer's abort, a peer's goodbye). A transport supplies
``_send`` (write one frame) and, to its receiver threads, a ``read`` function.

Every header is checked before its payload is read or allocated: an unknown kind, a control
frame over ``MAX_CONTROL_BYTES`` or a data frame over ``PYC10D_MAX_MESSAGE_BYTES`` (64 GiB)
means the stream can no longer be trusted, so that peer is dropped (``_drop``) and marked lost
with the reason, which is logged; the other peers carry on.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Any

from .. import settings
from ..errors import DistNetworkError
from ..keepalive import peer_timeout, silent_error
from .base import Mailbox, RecvHandle, Transport, abort_error, lost_error
from .pool import POOL_MIN

KIND_DATA, KIND_ABORT, KIND_BYE, KIND_PING = 0, 1, 2, 3  # a ping: see ``heartbeat``
_KINDS = (KIND_DATA, KIND_ABORT, KIND_BYE, KIND_PING)
# An abort carries a reason, a goodbye nothing: anything longer is not one of ours.
MAX_CONTROL_BYTES = 64 * 1024
STRIPES_SHIFT = 8  # a frame's kind field: its kind in the low bits, its stripes above (links)
_KIND_MASK = (1 << STRIPES_SHIFT) - 1
MAX_STRIPES = 16
_DEFAULT_MAX_MESSAGE = 1 << 36
# Seconds the pump holds a large message for its receive to be posted (see ``_pump``).
WAIT_FOR_POST = 0.01
_NO_PAYLOAD = memoryview(b"")
log = logging.getLogger("pyc10d")


def max_message_bytes() -> int:
    """The largest message a peer may announce: ``PYC10D_MAX_MESSAGE_BYTES``, else 64 GiB."""
    return settings.MAX_MESSAGE_BYTES.get(_DEFAULT_MAX_MESSAGE)


class BadFrame(DistNetworkError):
    """A peer sent a frame no pyc10d rank sends; its stream is dropped."""


def check_header(kind: int, nbytes: int, max_message: int) -> int:
    """Raise ``BadFrame`` unless a frame of ``kind`` may carry ``nbytes`` of payload; the
    number of stripes it comes in (0: one piece; a data frame may come in 2 to
    ``MAX_STRIPES``, see ``links``)."""
    stripes = kind >> STRIPES_SHIFT
    if stripes and kind & ((1 << STRIPES_SHIFT) - 1) == KIND_DATA and 2 <= stripes <= MAX_STRIPES:
        kind = KIND_DATA
    if kind not in _KINDS:
        raise BadFrame(f"it sent a frame of unknown kind {kind}")
    limit = max_message if kind == KIND_DATA else MAX_CONTROL_BYTES
    if nbytes > limit:
        what = "message" if kind == KIND_DATA else "control frame"
        raise BadFrame(f"it announced a {what} of {nbytes} bytes, over the limit of {limit}")
    return stripes


class Frame:
    """A frame being read: its header's fields, checked (``read_header``), and, for a reader
    that fills receives itself (``tcp/direct.py``), the receive its payload goes to (``exp``)
    or the buffer holding it meanwhile (``held``). Mutable: a frame begun for nobody may be
    adopted by a receive posted while its payload arrives."""

    __slots__ = ("kind", "channel", "nbytes", "meta", "stripes", "exp", "held")

    def __init__(self, kind: int, channel: int, nbytes: int, meta: int, stripes: int = 0,
                 exp: Any = None, held: bytearray | None = None) -> None:
        self.kind, self.channel, self.nbytes, self.meta = kind, channel, nbytes, meta
        self.stripes, self.exp, self.held = stripes, exp, held


def read_header(unpack: Callable[[Any], tuple[int, int, int, int]], header: Any, max_message: int) -> Frame:
    """The one reader of a frame's header, for the receiver threads (``_pump``) and a caller
    reading its sockets itself (``tcp/direct.py``): its fields, its kind without the stripes
    bits, checked (``check_header``: ``BadFrame``)."""
    channel, nbytes, meta, kind = unpack(header)
    stripes = check_header(kind, nbytes, max_message)
    return Frame(kind & _KIND_MASK, channel, nbytes, meta, stripes)


class FramedTransport(Transport):
    HEADER: struct.Struct  # unpacks to (channel, nbytes, meta, kind)
    mailbox: Mailbox
    _closing: bool

    def _send(self, peer: int, kind: int, channel: int, data: memoryview, meta: int) -> None:
        raise NotImplementedError

    def send(self, peer: int, channel: int, data: memoryview, meta: int = 0) -> None:
        self._send(peer, KIND_DATA, channel, data, meta)

    def irecv(self, peer: int, channel: int, buf: memoryview) -> RecvHandle:
        handle = RecvHandle(buf, peer, channel)
        self.mailbox.post(handle)
        return handle

    def abort(self, namespace: int, reason: str, peers: list[int]) -> None:
        payload = memoryview(reason.encode())
        for peer in peers:
            if peer != self.rank and self.is_connected(peer):
                try:
                    self._send(peer, KIND_ABORT, namespace, payload, 0)
                except Exception:  # noqa: BLE001 - best effort: the peer may be gone too
                    pass

    def is_connected(self, peer: int) -> bool:
        """Whether a frame can go to ``peer`` without opening a connection (best-effort
        control frames are not worth one)."""
        return self.is_alive(peer)

    def _say_bye(self, peer: int) -> None:
        try:
            self._send(peer, KIND_BYE, 0, _NO_PAYLOAD, 0)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass

    def _drop(self, peer: int) -> None:
        """Stop talking to ``peer`` after it sent garbage (tcp: shut its socket down)."""

    def _read_stripes(self, peer: int, stripes: int, view: memoryview) -> None:
        """Fill ``view`` with a payload ``peer`` sent in ``stripes`` stripes (tcp's links)."""
        raise BadFrame(f"it sent a message in {stripes} stripes, which this transport does not take")

    def _pump(self, peer: int, read: Callable[[memoryview, bool], None]) -> None:
        """Receive frames from ``peer`` until it leaves; ``read(view, is_payload)`` fills ``view``."""
        header = bytearray(self.HEADER.size)
        hview = memoryview(header)
        max_message = max_message_bytes()
        unpack = self.HEADER.unpack
        try:
            while True:
                read(hview, False)
                f = read_header(unpack, header, max_message)
                if f.kind != KIND_DATA:
                    payload = bytearray(f.nbytes)
                    read(memoryview(payload), True)
                    if self.control_frame(peer, f.kind, f.channel, payload):
                        return
                    continue
                # A large message whose receive is not posted yet would be read into a
                # holding buffer and copied again later; the receive is usually a moment
                # away, so wait briefly for it. Only briefly: the stream from this peer is
                # stalled meanwhile, and the receiver may first need a message behind this one.
                self._deliver(peer, f.channel, f.nbytes, f.meta, f.stripes, read,
                              WAIT_FOR_POST if f.nbytes >= POOL_MIN else 0.0)
        except Exception as e:  # noqa: BLE001 - whatever breaks the stream loses this peer only
            self.stream_broken(peer, e)

    def control_frame(self, peer: int, kind: int, channel: int, payload: bytes | bytearray) -> bool:
        """Take a control frame; True when it ends the stream (a goodbye)."""
        box = self.mailbox
        if kind == KIND_PING:
            return False
        if kind == KIND_BYE:
            box.peer_said_bye(peer)
            box.peer_lost(peer, lost_error(peer, "it shut down its process group"))
            return True
        reason = payload.decode(errors="replace")
        box.peer_aborted(peer, reason)
        box.abort(channel, abort_error(peer, reason))
        return False

    def _deliver(self, peer: int, channel: int, nbytes: int, meta: int, stripes: int,
                 read: Callable[[memoryview, bool], None], wait: float) -> None:
        """Read a data frame's payload into the receive posted for it (waiting up to ``wait``
        seconds for one), else into a holding buffer for the receive to come. A receive being
        filled when the stream breaks is failed here, naming the peer."""
        box = self.mailbox
        sink = box.sink_of(channel) if box.sinks else None
        if sink is not None:  # a window's message: straight into the window (``base.Sink``)
            view = sink.landing(peer, channel, nbytes, meta)
            into = view[:nbytes] if view is not None else box.pool.acquire(nbytes)  # None: read past it
            if stripes:
                self._read_stripes(peer, stripes, into)
            elif nbytes:
                read(into, True)
            if view is None:
                box.pool.release(into)
            return
        handle = box.take_posted(peer, channel, wait)
        try:
            if handle is not None and nbytes <= len(handle.buf):
                if stripes:
                    self._read_stripes(peer, stripes, handle.buf[:nbytes])
                else:
                    read(handle.buf[:nbytes], True)
                handle.complete(nbytes, meta)
                return
            payload = box.pool.acquire(nbytes)
            if stripes:
                self._read_stripes(peer, stripes, payload)
            else:
                read(payload, True)
        except BaseException as e:
            if handle is not None and not handle.done():  # the peer went mid-message
                self.stream_broken(peer, e)
                handle.fail(box.dead.get(peer) or lost_error(peer, str(e)))
            raise
        if handle is not None:
            handle.complete(nbytes, meta, truncated=True)
            box.pool.release(payload)
        else:
            box.arrived(peer, channel, payload, meta)

    def stream_broken(self, peer: int, e: BaseException) -> None:
        """What reading ``peer``'s stream raised ``e`` means: a peer that left or went silent
        is lost, one that sent garbage is dropped (the other peers carry on)."""
        box = self.mailbox
        if self._closing or peer in box.dead:
            return
        if isinstance(e, BadFrame):
            self._refuse(peer, str(e))
        elif isinstance(e, TimeoutError) and not isinstance(e, DistNetworkError):  # keepalive
            box.peer_lost(peer, silent_error(peer, peer_timeout() or 0, "stopped answering", e))
        elif isinstance(e, (OSError, DistNetworkError)):  # the peer left or died
            box.peer_lost(peer, e if isinstance(e, DistNetworkError) else str(e))
        else:  # e.g. no memory for the message
            self._refuse(peer, f"receiving from it failed: {type(e).__name__}: {e}")

    def _refuse(self, peer: int, reason: str) -> None:
        why = f"rank {self.rank} dropped its connection to rank {peer}: {reason}"
        log.warning("%s", why)
        self._drop(peer)
        self.mailbox.peer_lost(peer, DistNetworkError(why))
