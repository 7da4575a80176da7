"""The caller's own reads and writes on its peers' sockets (the tcp lean lane's transport).

Every tcp connection has a receiver thread that drains it (``tcp``): sends never deadlock,
and a message that comes before its receive is kept. But a synchronous collective pays for it
twice per message: the receiver wakes for the data, and then wakes the caller, who had gone to
sleep on a lock. On the 2-core VM a Python ping-pong over loopback between two processes
that sleep in ``recv`` takes ~36 us per exchange; the same exchange with the reader spinning
on a non-blocking ``recv`` takes ~4.4 us (``docs/where-the-time-goes.md``, "The tcp lane"). So for a
synchronous collective the calling thread reads its peers' sockets itself, looking for a
while before it sleeps, and sends each frame in one ``sendmsg`` of header and payload.

Who reads a socket is decided by one lock per connection (``owner.Owner``): the
receiver thread holds it only between a frame's first and last byte; a caller takes it for an
operation and gives it back; the receiver stays off the socket for a grace after that.

While the caller owns a socket it does what the receiver thread would with every frame that
is not the one it waits for (another group's message, a peer's abort or goodbye: the same
``control_frame``/``_deliver`` code), and a send that would block drains the op's sockets while
it waits (two ranks sending to each other at once must not both stop reading).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from typing import Protocol

from ...errors import DistTimeoutError
from ..base import Mailbox, RecvHandle
from ..framed import KIND_DATA, BadFrame, Frame, max_message_bytes, read_header
from .owner import Owner


class Sockets(Protocol):
    """What ``DirectIO`` uses of the tcp transport (``transport.TCPTransport``): its public
    per-peer state and the frame handling it shares with the receiver threads. A protocol,
    so that this module needs no import of the transport, which imports it."""

    HEADER: struct.Struct
    mailbox: Mailbox
    socks: list[socket.socket | None]  # by peer; None: not connected
    send_locks: list[threading.Lock]  # by peer: one frame at a time on a socket
    owners: dict[int, Owner]  # by peer: who reads its socket now (a receiver thread or a caller)

    def irecv(self, peer: int, channel: int, buf: memoryview) -> RecvHandle: ...

    def control_frame(self, peer: int, kind: int, channel: int, payload: bytes | bytearray) -> bool: ...

    def stream_broken(self, peer: int, e: BaseException) -> None: ...

#: With more ranks on the host than CPUs, operations of tensors over this many bytes stay on
#: the receiver threads: measured at n=4 on 2 cores (``bench``, every result checked, same
#: hour), the lane took all_reduce 64 KiB 754 -> 442 us and 1 MiB 3754 -> 3210, but 2 MiB
#: 5201 -> 5829 and 16 MiB 32529 -> 36330, broadcast 2 MiB 2522 -> 3286: a rank that reads
#: without blocking takes each socket's few bytes at a time, where a receiver thread blocked
#: in ``MSG_WAITALL`` wakes once per 512 KiB. (With a CPU per rank the lane wins or ties at
#: every size: n=2 all_reduce 2 MiB 1733 -> 1248-1344 us, 16-64 MiB within 5%.)
OVERSUBSCRIBED_DIRECT_MAX = 1 << 20
#: Receives up to this many bytes read their header and payload in one call (``_scatter``).
SCATTER_MAX = 64 * 1024
#: Longest single sleep of a waiting caller: it looks for an abort or a lost peer (set by
#: other threads, which cannot wake a thread in ``poll``) at least this often.
SLICE_S = 0.02
_DONTWAIT = socket.MSG_DONTWAIT
_IN = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_OUT = select.POLLOUT | select.POLLERR | select.POLLHUP
_monotonic = time.monotonic
_yield = os.sched_yield


class _Stream:
    """The frame being read from one peer's socket, a piece at a time: never blocking in the
    middle of a frame, since the peer may finish sending it only once this rank reads what
    a third rank sends it (a ring: every rank mid-frame from its left, nobody sending)."""

    __slots__ = ("peer", "sock", "fd", "header", "hview", "view", "got", "frame", "ended", "pending")

    def __init__(self, peer: int, sock: socket.socket, header_size: int) -> None:
        self.peer, self.sock, self.fd = peer, sock, sock.fileno()
        self.header = bytearray(header_size)
        self.hview = memoryview(self.header)
        self.view = self.hview  # what the next bytes fill
        self.got = 0
        # Bytes read past the end of a frame (``DirectIO._scatter``), consumed before the socket.
        self.pending = b""
        # None while reading a header; else the frame whose payload is being read
        self.frame: Frame | None = None
        self.ended = False  # the peer said goodbye, or its stream broke: nothing more to read


class DirectHandle(RecvHandle):
    """A receive of the operation, filled by the caller's own reads: ``wait`` reads the
    peers' sockets itself (``DirectIO.fill``). No latch: nobody else completes it."""

    __slots__ = ("io",)

    def __init__(self, io: DirectIO, peer: int, channel: int, buf: memoryview) -> None:
        self.io, self.peer, self.channel, self.buf = io, peer, channel, buf
        self.nbytes, self.meta, self.error, self.truncated = -1, 0, None, False

    def wait(self, timeout: float | None) -> tuple[int, int]:
        if self.nbytes < 0:
            self.io.fill(self, _monotonic() + (86400.0 if timeout is None else max(timeout, 0.0)))
        if self.nbytes > len(self.buf):
            self.truncated = True
        return self.nbytes, self.meta


class DirectIO:
    """One thread's direct use of a ``TCPTransport``'s sockets for one operation at a time:
    ``send``/``irecv``/``exchange`` (as the transport's), then ``end`` (always)."""

    def __init__(self, transport: Sockets, spin_s: float, max_bytes: int | None = None,
                 yield_: bool = False) -> None:
        self.t = transport
        self.spin_s = spin_s
        self.yield_ = yield_  # give the CPU away between looks (``spin_yields``)
        #: tensors over this many bytes take the receiver threads' path (None: any size)
        self.max_bytes = max_bytes
        self.owned: dict[int, Owner] = {}  # peers whose sockets this operation reads
        self.streams: list[_Stream] = []  # theirs, in the order taken
        self.fallback: set[int] = set()  # peers whose receives go to the receiver thread
        self.expected: dict[int, list[DirectHandle]] = {}
        self.max_message = max_message_bytes()
        self._pack, self._unpack = transport.HEADER.pack, transport.HEADER.unpack
        self._streams: dict[int, _Stream] = {}  # kept between operations (same socket: same one)

    def end(self) -> None:
        """Give the sockets back, each between two frames (a frame begun is read to its end
        first: the receiver thread must start at a header), and forget the operation's
        receives: the next operation starts clean."""
        try:
            for st in self.streams:
                if st.got or st.frame is not None or st.pending:
                    self._finish_frame(st)
        finally:
            posted = self.t.mailbox.posted
            for peer, own in self.owned.items():
                if posted[peer]:  # someone waits on the receiver thread: no grace
                    own.parked_until = 0.0
                own.give()
            self.owned.clear()
            self.streams.clear()
            self.fallback.clear()
            self.expected.clear()

    # -- what a Comm calls ---------------------------------------------------------------------
    def irecv(self, peer: int, channel: int, buf: memoryview) -> RecvHandle:
        box = self.t.mailbox
        if peer not in self.owned and (peer < 0 or peer in self.fallback or box.aborted or peer in box.dead
                                       or not self._own(peer)):
            return self.t.irecv(peer, channel, buf)  # (a failed one fails there, as it should)
        h = DirectHandle(self, peer, channel, buf)
        queue = self.expected.get(peer)
        if queue:
            for e in queue:
                if e.channel == channel:  # those receives take the next messages of the channel
                    queue.append(h)
                    return h
        if box.waiting_unexpected:  # read before this op took the socket, or before it asked
            got = box.take_unexpected(peer, channel, buf)
            if got is not None:
                h.nbytes, h.meta = got
                return h
        st = self._streams[peer]
        frame = st.frame
        if frame is not None and frame.exp is None and frame.kind == KIND_DATA and frame.channel == channel:
            self._adopt(st, h)  # it is arriving now
        elif queue is None:
            self.expected[peer] = [h]
        else:
            queue.append(h)
        return h

    def exchange(self, peer: int, channel: int, data: memoryview, meta: int, buf: memoryview) -> RecvHandle:
        """``irecv(peer, channel, buf)``, ``send(peer, channel, data, meta)`` and the first look
        for the answer, in one call: the whole of a two-rank exchange of small messages (an
        all_reduce of two ranks, ``allreduce_direct_step``). The handle comes back filled when
        the peer's frame came within the spin (check ``nbytes`` and ``meta``), else its
        ``wait`` reads on. Anything but a clean stream, an owned socket and nothing read
        ahead takes the separate calls' way.

        Why one call: at 8 bytes the exchange itself is ~5 us here and every Python call
        around it ~0.3; this is the irecv, send, wait, fill and spin layers of a step in one
        (docs/where-the-time-goes.md, "The tcp lane")."""
        box = self.t.mailbox
        st = self._streams.get(peer)
        # (``waiting_unexpected`` after ``_own``: the receiver thread may finish reading the
        # peer's frame into the mailbox while ``_own`` waits for it to give the socket up)
        clean = (st is not None and len(buf) <= SCATTER_MAX and not self.expected and not box.aborted
                 and peer not in box.dead and peer not in self.fallback and self._own(peer)
                 and not box.waiting_unexpected)
        if clean:
            st = self._streams[peer]  # (``_own`` makes a new one for a new socket)
            clean = not (st.pending or st.got or st.frame is not None or st.ended)  # (not mid-frame)
        if not clean:
            h = self.irecv(peer, channel, buf)
            self.send(peer, channel, data, meta)
            return h
        h = DirectHandle(self, peer, channel, buf)
        self.expected[peer] = [h]
        self.send(peer, channel, data, meta)
        # (a send that had to wait read what came meanwhile: ``_spin_one`` then leaves it to ``wait``)
        self._spin_one(st, h, _monotonic() + self.spin_s)
        return h

    def _adopt(self, st: _Stream, exp: DirectHandle) -> None:
        """Give the frame ``st`` is in the middle of reading (for nobody yet) to ``exp``: what
        came so far is copied over, the rest lands in ``exp.buf``."""
        frame = st.frame
        assert frame is not None
        frame.exp = exp
        nbytes, held = frame.nbytes, frame.held
        if nbytes <= len(exp.buf):
            assert held is not None  # (a frame begun for nobody is held: ``_start_frame``)
            exp.buf[:st.got] = memoryview(held)[:st.got]
            st.view = exp.buf[:nbytes]
            frame.held = None
            self.t.mailbox.pool.release(held)

    def send(self, peer: int, channel: int, data: memoryview, meta: int) -> None:
        t = self.t
        sock = t.socks[peer]
        if sock is None:  # not connected yet: the transport dials
            t.send(peer, channel, data, meta)
            return
        header = self._pack(channel, len(data), meta, KIND_DATA)
        with t.send_locks[peer]:
            try:
                try:
                    sent = sock.sendmsg((header, data), (), _DONTWAIT)
                except BlockingIOError:
                    sent = 0
                hsize = len(header)
                if sent < hsize + len(data):
                    rest = [memoryview(header)[sent:], data] if sent < hsize else [data[sent - hsize:]]
                    self._send_rest(peer, sock, rest)
            except OSError as e:
                raise t.mailbox.explain_loss(peer, f"send failed: {e}") from e

    def _send_rest(self, peer: int, sock: socket.socket, rest: list[memoryview]) -> None:
        """Finish a send the socket would not take at once, reading what the op's peers send
        meanwhile: they may be blocked sending to this rank, waiting for it to read. (Peers
        whose sockets this op does not read get their receiver threads back now.)"""
        t = self.t
        for p, own in t.owners.items():
            if p not in self.owned:
                own.unpark()
        out_fd = sock.fileno()
        by_fd = {st.fd: st for st in self.streams}
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, _IN)
        poller.register(out_fd, _OUT | (_IN if out_fd in by_fd else 0))
        for view in rest:
            while view:
                for fd, ev in poller.poll(SLICE_S * 1000):
                    st = by_fd.get(fd)
                    if st is not None and ev & ~select.POLLOUT:
                        while self._advance(st):
                            pass
                    if fd == out_fd and ev & ~select.POLLIN and view:
                        try:
                            view = view[sock.send(view, _DONTWAIT):]
                        except BlockingIOError:
                            pass
                self._check(peer)

    # -- reading -------------------------------------------------------------------------------
    def _own(self, peer: int) -> bool:
        """Take ``peer``'s socket for this operation (False: it is busy or not connected)."""
        if peer in self.owned:
            return True
        t = self.t
        own, sock = t.owners.get(peer), t.socks[peer]
        box = t.mailbox
        # Receives posted through the mailbox (another thread's operation, point to point) are
        # the receiver thread's to serve: this one joins them there rather than park it.
        if (own is None or sock is None or box.posted[peer] or box.any_posted
                or not own.try_take()):
            self.fallback.add(peer)
            if own is not None:
                own.unpark()
            return False
        self.owned[peer] = own
        st = self._streams.get(peer)
        if st is None or st.sock is not sock:
            st = self._streams[peer] = _Stream(peer, sock, t.HEADER.size)
        self.streams.append(st)
        return True

    def fill(self, exp: DirectHandle, deadline: float) -> None:
        """Read the op's sockets until ``exp`` is filled (or raise): all of them, not only
        ``exp.peer``'s (another peer may be blocked sending to this rank, and the peer this
        rank waits for may be waiting for that one)."""
        streams = self.streams
        box = self.t.mailbox
        spin_end = _monotonic() + self.spin_s
        if len(streams) == 1 and self._spin_one(streams[0], exp, spin_end):
            return
        poller: select.poll | None = None
        while True:
            moved = False
            for st in streams:  # (no further than needed: what follows may be a goodbye)
                while exp.nbytes < 0 and self._advance(st):
                    moved = True
            if exp.nbytes >= 0:
                return
            if moved:
                continue
            if box.aborted or exp.peer in box.dead:
                self._check(exp.peer)
            now = _monotonic()
            if now < spin_end:
                if self.yield_:
                    _yield()
                continue
            if now >= deadline:
                raise DistTimeoutError(f"timed out waiting for {len(exp.buf)} bytes from rank {exp.peer}")
            if poller is None:
                poller = select.poll()
                for st in streams:
                    poller.register(st.fd, _IN)
            poller.poll(max(min(deadline - now, SLICE_S), 0.0) * 1000)

    def _spin_one(self, st: _Stream, exp: DirectHandle, spin_end: float) -> bool:
        """``fill``'s look at a single socket while ``exp`` is the next frame's receive: the
        same read as ``_scatter``, in a loop of nothing else (each turn of the general loop
        costs microseconds of calls, the time by which it sees the data late). True once
        ``exp`` is filled; False to go on the general way (anything else to do, or the spin
        is over)."""
        queue = self.expected.get(st.peer)
        if not queue or queue[0] is not exp or len(exp.buf) > SCATTER_MAX:
            return False
        read, parts = st.sock.recvmsg_into, (st.hview, exp.buf)
        while not (st.pending or st.got or st.frame is not None or st.ended):
            try:
                k = read(parts, 0, _DONTWAIT)[0]
            except BlockingIOError:
                if _monotonic() < spin_end:
                    if self.yield_:
                        _yield()
                    continue
                return False
            except OSError as e:
                self._ended(st, e)
                return False
            self._scattered(st, queue, k)
            return exp.nbytes >= 0
        return False

    def _finish_frame(self, st: _Stream) -> None:
        """Read the rest of ``st``'s frame (``end``: nothing of this rank's is left to send)."""
        poller = select.poll()
        poller.register(st.fd, _IN)
        dead = self.t.mailbox.dead
        while (st.got or st.frame is not None or st.pending) and not st.ended:
            if not self._advance(st):
                if st.peer in dead:  # (the receiver thread finds the stream broken too)
                    return
                poller.poll(SLICE_S * 1000)

    def _advance(self, st: _Stream) -> bool:
        """Read what is there of ``st``'s current frame (without waiting); False if nothing was.
        A frame read whole fills its receive, or goes where the receiver thread would put it.
        A stream that ends (a goodbye, a close, garbage) marks its peer lost and reads no
        more: whoever waits for that peer raises (``_check``); the rest of the op goes on."""
        if st.ended:
            return False
        view = st.view
        if st.pending:
            k = min(len(view) - st.got, len(st.pending))
            view[st.got:st.got + k] = st.pending[:k]
            st.pending = st.pending[k:]
        else:
            if st.frame is None and not st.got:
                queue = self.expected.get(st.peer)
                if queue and len(queue[0].buf) <= SCATTER_MAX:
                    return self._scatter(st, queue)
            try:
                k = st.sock.recv_into(view[st.got:], len(view) - st.got, _DONTWAIT)
            except BlockingIOError:
                return False
            except OSError as e:
                self._ended(st, e)
                return False
            if k == 0 and len(view):
                self._ended(st, ConnectionResetError("connection closed by peer"))
                return False
        st.got += k
        if st.got < len(view):
            return True
        st.got = 0
        frame = st.frame
        if frame is None:
            self._start_frame(st)
        else:
            st.frame, st.view = None, st.hview
            self._complete(st, frame)
        return True

    def _scatter(self, st: _Stream, queue: list[DirectHandle]) -> bool:
        """Read a header and the payload after it in one call, the payload straight into the
        buffer of the receive next in line (the frame is nearly always that one's: one system
        call and none of ``_start_frame`` per message). A frame that is not goes the general
        way, with the bytes already read fed back in (``pending``)."""
        try:
            k = st.sock.recvmsg_into((st.hview, queue[0].buf), 0, _DONTWAIT)[0]
        except BlockingIOError:
            return False
        except OSError as e:
            self._ended(st, e)
            return False
        self._scattered(st, queue, k)
        return True

    def _scattered(self, st: _Stream, queue: list[DirectHandle], k: int) -> None:
        """``k`` bytes came into the next header and the buffer of ``queue[0]``: see ``_scatter``."""
        head = queue[0]
        hview, buf = st.hview, head.buf
        if k == 0:
            self._ended(st, ConnectionResetError("connection closed by peer"))
            return
        hsize = len(hview)
        if k < hsize:  # part of a header: the general way reads the rest
            st.got = k
            return
        channel, nbytes, meta, kind = self._unpack(st.header)
        got = k - hsize
        if kind == KIND_DATA and channel == head.channel and nbytes <= len(buf):
            del queue[0]
            if got >= nbytes:
                if got > nbytes:  # it was shorter than the receive: what follows is the next frame's
                    st.pending = bytes(buf[nbytes:got])
                head.nbytes, head.meta = nbytes, meta
            else:
                st.frame, st.view, st.got = Frame(kind, channel, nbytes, meta, 0, head), buf[:nbytes], got
            return
        st.pending = bytes(buf[:got])  # another frame's bytes (and perhaps more): the general way
        self._start_frame(st)

    def _start_frame(self, st: _Stream) -> None:
        t = self.t
        try:
            frame = read_header(self._unpack, st.header, self.max_message)
            if frame.stripes:
                raise BadFrame("it sent a striped message over a connection without links")
        except BadFrame as e:
            self._ended(st, e)
            return
        kind, channel, nbytes = frame.kind, frame.channel, frame.nbytes
        exp = None
        if kind == KIND_DATA:
            queue = self.expected.get(st.peer)
            if queue:
                for i, e in enumerate(queue):
                    if e.channel == channel:
                        exp = queue.pop(i)
                        break
        if exp is not None and nbytes <= len(exp.buf):
            held, st.view = None, exp.buf[:nbytes]
        else:  # a frame of no receive of this op (or too long for it): held, then handed on
            held = bytearray(nbytes) if kind != KIND_DATA or exp is not None else t.mailbox.pool.acquire(nbytes)
            st.view = memoryview(held)
        frame.exp, frame.held = exp, held
        if nbytes:
            st.frame = frame
        else:
            st.view = st.hview
            self._complete(st, frame)

    def _complete(self, st: _Stream, frame: Frame) -> None:
        kind, channel, nbytes, meta, exp, held = (frame.kind, frame.channel, frame.nbytes, frame.meta,
                                                   frame.exp, frame.held)
        peer = st.peer
        if exp is not None:  # (too long for its receive: its length says so, the Comm names it)
            exp.nbytes, exp.meta = nbytes, meta
            if held is not None and kind == KIND_DATA:
                self.t.mailbox.pool.release(held)
        elif kind != KIND_DATA:
            if self.t.control_frame(peer, kind, channel, held):  # a goodbye (the peer is marked lost)
                st.ended = True
        else:
            self.t.mailbox.arrived(peer, channel, held, meta)

    def _ended(self, st: _Stream, e: BaseException) -> None:
        """``st``'s stream broke with ``e``: its peer is lost, as the receiver thread would say."""
        st.ended = True
        t = self.t
        t.stream_broken(st.peer, e)
        if st.peer not in t.mailbox.dead:  # (closing) still fail the receives from it
            t.mailbox.peer_lost(st.peer, str(e))

    def _check(self, peer: int) -> None:
        """Raise what another thread found meanwhile: ``peer`` lost, or the op's group aborted."""
        box = self.t.mailbox
        err = box.dead.get(peer)
        if err is not None:
            raise err
        if box.aborted:  # (every receive of an operation is in its group's namespace)
            for queue in self.expected.values():
                for exp in queue:
                    err = box.aborted.get(exp.channel >> 32)
                    if err is not None:
                        raise err
