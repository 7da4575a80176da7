"""TCPStore's wire format, shared by the client (``tcp``) and the server (``tcp_server``).

A frame (both directions) is ``!BI`` (op or status, part count), then each part as ``!I``
length + raw bytes. Values travel as raw bytes, never pickled.

Nothing read from a socket is trusted: an unknown code, more than ``MAX_PARTS`` parts, a
part longer than ``PYC10D_STORE_MAX_BYTES`` (1 GiB) or a frame cut short raise ``BadFrame``
before anything is allocated for what was merely announced. Two readers share those
rules: ``read_frame`` for a blocking client socket and ``FrameParser`` for the server's
event loop, which is handed bytes as they arrive and must never wait for the rest.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from .. import settings

HEAD, LEN = struct.Struct("!BI"), struct.Struct("!I")
(SET, MGET, ADD, CAS, WAIT, CHECK, DELETE, NUMKEYS, MSET, APPEND, WAITGE, QPUSH, QPOP, QLEN,
 LIST) = range(1, 16)
OK, TIMEOUT, ERROR, AUTH = 0, 1, 2, 3
# Parts per frame: a multi_get/multi_set of this many keys still fits (half as many for a set).
MAX_PARTS = 1 << 16
_DEFAULT_MAX_BYTES = 1 << 30
# Parts longer than this are read a piece at a time, so a length that is announced but never
# sent costs nothing; shorter ones in one call (BufferedReader allocates the whole size first).
_PIECE = 1 << 20
# How many parts each op takes: (fewest, most or None, parts must pair up).
SHAPES: dict[int, tuple[int, int | None, bool]] = {
    SET: (2, 2, False), MGET: (1, None, False), ADD: (2, 2, False), CAS: (3, 3, False),
    WAIT: (1, None, False), CHECK: (0, None, False), DELETE: (1, 1, False),
    NUMKEYS: (0, 0, False), MSET: (0, None, True), APPEND: (2, 2, False),
    WAITGE: (3, 3, False), QPUSH: (2, 2, False), QPOP: (2, 2, False), QLEN: (1, 1, False),
    LIST: (0, 0, False),
}
STATUSES = frozenset((OK, TIMEOUT, ERROR, AUTH))


class BadFrame(Exception):
    """Bytes that break the framing: the reader closes the connection."""


def max_part_bytes() -> int:
    """The longest part a frame may carry: ``PYC10D_STORE_MAX_BYTES``, else 1 GiB."""
    return settings.STORE_MAX_BYTES.get(_DEFAULT_MAX_BYTES)


def pack(code: int, parts: list[bytes]) -> bytes:
    out = [HEAD.pack(code, len(parts))]
    for p in parts:
        out += (LEN.pack(len(p)), p)
    return b"".join(out)


def pack_list(items: list[bytes]) -> bytes:
    """Many byte strings as one part (a key listing may hold more than ``MAX_PARTS``)."""
    return b"".join(LEN.pack(len(x)) + x for x in items)


def unpack_list(blob: bytes) -> list[bytes]:
    out, pos, end = [], 0, len(blob)
    while pos < end:
        if end - pos < LEN.size:
            raise BadFrame("a listing cut short inside a length")
        (n,) = LEN.unpack_from(blob, pos)
        pos += LEN.size
        if end - pos < n:
            raise BadFrame(f"a listing cut short: {n} bytes announced, {end - pos} came")
        out.append(blob[pos:pos + n])
        pos += n
    return out


def _check_head(code: int, n: int, codes: frozenset[int] | dict[int, object]) -> None:
    if code not in codes:
        raise BadFrame(f"unknown code {code}")
    if n > MAX_PARTS:
        raise BadFrame(f"{n} parts announced, at most {MAX_PARTS} allowed")


def _check_len(length: int, max_bytes: int) -> None:
    if length > max_bytes:
        raise BadFrame(
            f"a part of {length} bytes announced, at most {max_bytes} allowed "
            "(PYC10D_STORE_MAX_BYTES)"
        )


def _read_exact(rfile: BinaryIO, n: int) -> bytes:
    pieces, got = [], 0
    while got < n:
        piece = rfile.read(min(n - got, _PIECE))
        if not piece:
            raise BadFrame(f"frame cut short: {n} bytes announced, {got} came")
        pieces.append(piece)
        got += len(piece)
    return b"".join(pieces) if len(pieces) != 1 else pieces[0]


def read_frame(
    rfile: BinaryIO, max_bytes: int, codes: frozenset[int] | dict[int, object]
) -> tuple[int, list[bytes]] | None:
    """One frame from a blocking reader; None at a clean end of stream (between frames)."""
    head = rfile.read(HEAD.size)
    if not head:
        return None
    if len(head) < HEAD.size:
        raise BadFrame(f"frame cut short inside its header ({len(head)} of {HEAD.size} bytes)")
    code, n = HEAD.unpack(head)
    _check_head(code, n, codes)
    parts = []
    for _ in range(n):
        (length,) = LEN.unpack(_read_exact(rfile, LEN.size))
        _check_len(length, max_bytes)
        parts.append(_read_exact(rfile, length))
    return code, parts


def parse_whole(data: bytes, max_bytes: int, codes: frozenset[int] | dict[int, object]
                ) -> tuple[int, list[bytes]] | None:
    """The frame ``data`` holds exactly, or None when it holds less or more than one.

    The common case on both ends (one small request or answer per ``recv``) without a
    parser's bookkeeping; the limits are checked all the same.
    """
    end = len(data)
    if end < HEAD.size:
        return None
    code, count = HEAD.unpack_from(data)
    _check_head(code, count, codes)
    pos, parts = HEAD.size, []
    for _ in range(count):
        if end - pos < LEN.size:
            return None
        (plen,) = LEN.unpack_from(data, pos)
        _check_len(plen, max_bytes)
        pos += LEN.size
        if end - pos < plen:
            return None
        parts.append(data[pos:pos + plen])
        pos += plen
    return (code, parts) if pos == end else None


class FrameParser:
    """Frames out of bytes handed over as they arrive, for a non-blocking server.

    ``feed`` appends what a ``recv`` returned; ``next_frame`` returns the next whole frame
    or None until more comes. The limits are checked as soon as the header or a length is
    complete, so memory grows with the bytes that came, never with an announced length. The
    frame in progress is kept between calls: a frame trickling in a byte at a time is parsed
    once, not from its start at every call.
    """

    __slots__ = ("_buf", "_pos", "_max", "_codes", "_code", "_count", "_parts", "_plen")

    def __init__(self, max_bytes: int, codes: frozenset[int] | dict[int, object]) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._max, self._codes = max_bytes, codes
        self._code = -1  # -1: between frames
        self._count, self._parts, self._plen = 0, [], -1  # type: int, list[bytes], int

    def feed(self, data: bytes) -> None:
        self._buf += data

    def idle(self) -> bool:
        """Nothing received that is not yet returned: the next bytes start a frame."""
        return self._code < 0 and self._pos == len(self._buf)

    def unparsed(self) -> int:
        """Bytes received and not yet returned in a frame."""
        return len(self._buf) - self._pos

    def next_frame(self) -> tuple[int, list[bytes]] | None:
        buf, pos, end = self._buf, self._pos, len(self._buf)
        if self._code < 0:
            if end - pos < HEAD.size:
                return self._compact(pos, None)
            code, count = HEAD.unpack_from(buf, pos)
            _check_head(code, count, self._codes)
            pos += HEAD.size
            self._code, self._count, self._parts = code, count, []
        parts, limit = self._parts, self._max
        while len(parts) < self._count:
            plen = self._plen
            if plen < 0:
                if end - pos < LEN.size:
                    return self._compact(pos, None)
                (plen,) = LEN.unpack_from(buf, pos)
                _check_len(plen, limit)
                pos += LEN.size
                self._plen = plen
            if end - pos < plen:
                return self._compact(pos, None)
            parts.append(bytes(buf[pos:pos + plen]))
            pos += plen
            self._plen = -1
        frame = (self._code, parts)
        self._code = -1
        return self._compact(pos, frame)

    def _compact(self, pos: int, frame: tuple[int, list[bytes]] | None
                 ) -> tuple[int, list[bytes]] | None:
        if pos == len(self._buf):
            self._buf.clear()
            pos = 0
        elif frame is None and pos > 0:
            del self._buf[:pos]  # waiting for more: drop what was parsed, once
            pos = 0
        self._pos = pos
        return frame

    def check_clean_end(self) -> None:
        """At the end of the stream: raise ``BadFrame`` if it cut a frame short."""
        left = len(self._buf) - self._pos
        if self._code < 0:
            if left:
                raise BadFrame(f"frame cut short inside its header ({left} of {HEAD.size} bytes)")
        elif self._plen < 0:
            raise BadFrame(f"frame cut short: {LEN.size} bytes announced, {left} came")
        else:
            raise BadFrame(f"frame cut short: {self._plen} bytes announced, {left} came")


def check_shape(code: int, parts: list[bytes]) -> None:
    """Raise ``ValueError`` when a well-framed request has the wrong number of parts."""
    fewest, most, paired = SHAPES[code]
    n = len(parts)
    if n < fewest or (most is not None and n > most) or (paired and n % 2):
        want = f"{fewest}" if most == fewest else f"at least {fewest}" if most is None else (
            f"{fewest} to {most}")
        raise ValueError(f"op {code} takes {want}{' (in pairs)' if paired else ''} parts, got {n}")
