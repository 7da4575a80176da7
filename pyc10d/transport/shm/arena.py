"""A group's shared arena: phase counters, op descriptors and data slots in one segment.

Layout (``n`` ranks, ``S`` = slot bytes; every part page-aligned)::

    header      4 KiB         word 16: abort word (0, or 1 + the aborting group rank)
    lines       n x 512 B     per rank: phase counter (word 0, alone on its cache line),
                              closed flag (byte 64), sleeping-on (byte 68), op descriptors
                              (bytes 72..104, one per phase parity), abort reason (128..512)
    meta        2 x n x n     int64, meta[parity][rank]: n numbers a rank publishes (e.g. the
                              split sizes of an all_to_all)
    slots       2 x n x S     parity-major: slots[parity][rank]
    results     2 x S         results[parity]

Ranks move through numbered *phases*; a rank publishes phase ``c`` by storing ``c`` in its
counter and waking the counter's futex. Phase ``c`` uses only the buffers of parity
``c & 1`` (its data slots, descriptor and result), and the one rule that makes two
parities enough is what a posted counter promises:

    counter[r] >= c  means rank r has written everything it writes in phase c, and has
                     finished every access to the buffers of phases <= c - 1.

So before writing parity ``c & 1`` in phase ``c`` a rank waits until every counter is
>= ``c - 1`` (``next_phase``), and before reading what rank ``p`` wrote in phase ``c`` it
waits for counter[p] >= ``c``. Chunked algorithms that read and write in the same phase post
only after all of the phase's work, which keeps the promise.

Waiting spins briefly on the counter (yielding the CPU between looks when the group has more
ranks than this process has CPUs), then sleeps on its futex in slices of ``SLICE`` seconds;
between slices it checks the group's abort word, the awaited rank's closed flag and whether
any member process died, so a dead rank is named within a fraction of a second. A rank about
to sleep on rank p's counter says so in its sleeping-on word, stored with a full barrier
(``futex.exchange``) before it reads the counter a last time, so a poster that sees nobody
sleeping on it may skip the wake-up syscall. The poster's own counter store is a plain one:
x86 lets its read of the sleeping-on words pass that store while it sits in the store
buffer (nanoseconds), so a rank going to sleep in exactly that window could miss its wake-up.
A sleep's first slice is therefore ``FIRST_SLICE`` (1 ms), doubling to ``SLICE``: a missed
wake-up costs at most that millisecond, where a fenced store cost every post a ``ctypes``
call (1.1 us hot, 8 us cold, a diagnostic).
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Callable

import torch

from ... import settings
from ...errors import DistBackendError, DistNetworkError, DistTimeoutError
from ..cpus import oversubscribed, when_shared
from . import futex
from .segment import PeerWatch, Segment

HEADER = 4096
LINE = 512
PAGE = 4096
SLICE = 0.1
FIRST_SLICE = 1e-3
_LONE_YIELD = 5e-6
_LONE_YIELDS = 20
_ABORT_WORD = 16
_REASON_OFF = 128
_REASON_MAX = LINE - _REASON_OFF - 4
_M = 0xFFFFFFFF
_SEQ_CST = futex.SEQ_CST


def _reached(value: int, c: int) -> bool:
    return ((value - c) & _M) < 0x80000000


def _descriptor_word(p: int, c: int) -> int:
    """Index (in 8-byte words) of rank ``p``'s descriptor for phases of ``c``'s parity."""
    return (HEADER + p * LINE + 72 + (c & 1) * 16) // 8


def _align(x: int, a: int = PAGE) -> int:
    return (x + a - 1) // a * a


def default_spin(size: int) -> tuple[float, bool]:
    """(seconds to spin before sleeping, whether to yield the CPU while spinning).

    With more ranks than CPUs a spinning rank holds the CPU the awaited rank needs, so it
    yields between looks (``PYC10D_SHM_YIELD=0/1`` forces either; ``PYC10D_SHM_SPIN_US``
    sets the spin time, default 50 us, or 200 us when yielding).
    """
    forced = settings.SHM_YIELD.get()
    yield_ = oversubscribed(size) if forced is None else forced
    us = settings.SHM_SPIN_US.get(200.0 if yield_ else 50.0)
    return us * 1e-6, yield_


def caller_spin(size: int) -> float:
    """Seconds to spin in a wait whose thread is the caller's own, blocked in a synchronous
    collective (the lean lane's steps), before sleeping: ``PYC10D_SHM_CALLER_SPIN_US``,
    default 1 ms with a CPU per rank, else the ordinary spin.

    Such a thread has nothing else to do, and with a core per rank no other rank needs its
    core; a sleep there costs a futex wake-up on the peer's side and a reschedule on this one
    (tens of microseconds on a VM), which small operations pay at every skew between ranks
    longer than the ordinary 50 us. A diagnostic on the 2-core VM (a script, results not
    checked, no peer: it times waiting, not a collective's speed): 2 ranks each computing a
    random 100-300 us between 8-byte all_reduces (ideal: ~233 us of the slower rank's compute
    + ~25 us the call) took 312-322 us per op with 50 us, 266-279 us with 1 ms (three runs
    each, alternated). Past the ordinary spin the wait yields the CPU between looks (``wait``), so
    it holds a core only while nothing else wants it. A progress thread, which may run
    beside the caller's compute, keeps the ordinary spin.
    """
    spin, yield_ = default_spin(size)
    if yield_:
        return spin
    return settings.SHM_CALLER_SPIN_US.get() * 1e-6


class Arena:
    """This rank's handle on a group's arena. Not thread-safe: one operation at a time."""

    def __init__(
        self, seg: Segment, rank: int, size: int, slot_bytes: int, watch: PeerWatch,
        members: list[int],
    ) -> None:
        self.seg, self.rank, self.size, self.slot_bytes = seg, rank, size, slot_bytes
        self.watch, self.members = watch, members
        self.words = seg.words
        self._meta_words = memoryview(seg.mm).cast("q")
        self._ctr = [(HEADER + p * LINE) // 4 for p in range(size)]
        self._meta = HEADER + _align(size * LINE)
        self._data = self._meta + _align(2 * size * size * 8)
        self.unlink_pending = True  # the name goes once every member is known to have mapped it
        self.phase = 0
        self.known = 0
        self.spin_s, self.yield_spin = default_spin(size)
        self.caller_spin_s = caller_spin(size)
        when_shared(self)
        self._sleep_i = [(HEADER + p * LINE + 68) // 4 for p in range(size)]
        self._exchange = futex.exchange
        self._post_addr = seg.address + 4 * self._ctr[rank]  # this rank's counter
        self.cancelled: BaseException | None = None
        self._own_abort = ""  # this rank's abort, as its own waits raise it (``_raise_aborted``)
        self.timeout = 0.0  # of the current operation, for messages
        #: optional ``() -> error or None``, polled while sleeping: a failure reported to this
        #: rank some other way (e.g. an abort message on the transport) ends the wait too
        self.poll_error: Callable[[], BaseException | None] | None = None
        self._typed: dict = {}
        # Word index of each rank's descriptor, per parity (``_descriptor_word``, computed once).
        self._desc = [[_descriptor_word(p, parity) for p in range(size)] for parity in (0, 1)]

    def host_shared(self) -> None:
        """Other jobs use this host's CPUs (``cpus.when_shared``): wait as ranks sharing CPUs do."""
        self.spin_s, self.yield_spin = default_spin(self.size)
        self.caller_spin_s = caller_spin(self.size)

    @staticmethod
    def nbytes(size: int, slot_bytes: int) -> int:
        return HEADER + _align(size * LINE) + _align(2 * size * size * 8) + (2 * size + 2) * slot_bytes

    # -- buffers ---------------------------------------------------------------------------
    def slots(self, parity: int, dtype: torch.dtype) -> torch.Tensor:
        """(n, S / itemsize) view of every rank's slot of ``parity``; row p is rank p's."""
        key = (0, parity & 1, dtype)
        t = self._typed.get(key)
        if t is None:
            off = self._data + (parity & 1) * self.size * self.slot_bytes
            t = self.seg.view(off, self.size * self.slot_bytes).view(dtype).view(self.size, -1)
            self._typed[key] = t
        return t

    def result(self, parity: int, dtype: torch.dtype) -> torch.Tensor:
        key = (1, parity & 1, dtype)
        t = self._typed.get(key)
        if t is None:
            off = self._data + (2 * self.size + (parity & 1)) * self.slot_bytes
            t = self.seg.view(off, self.slot_bytes).view(dtype)
            self._typed[key] = t
        return t

    def set_meta(self, parity: int, values: list[int]) -> None:
        """Publish this rank's n numbers (row ``rank`` of the meta table of ``parity``)."""
        base = (self._meta + ((parity & 1) * self.size + self.rank) * self.size * 8) // 8
        self._meta_words[base:base + self.size] = array("q", values)

    def meta(self, parity: int) -> list[list[int]]:
        """The (n, n) meta table of ``parity``: row p holds the numbers rank p published."""
        n = self.size
        base = (self._meta + (parity & 1) * n * n * 8) // 8
        flat = self._meta_words[base:base + n * n].tolist()
        return [flat[p * n:(p + 1) * n] for p in range(n)]

    def set_descriptor(self, c: int, head: int, nbytes: int) -> None:
        """Publish this rank's descriptor of the operation starting in phase ``c``: two
        64-bit words (what the operation is; its size), compared as integers, no bytes."""
        i = self._desc[c & 1][self.rank]
        words = self._meta_words
        words[i] = head
        words[i + 1] = nbytes

    def descriptor(self, p: int, c: int) -> tuple[int, int]:
        i = self._desc[c & 1][p]
        return self._meta_words[i], self._meta_words[i + 1]

    def disagreeing(self, c: int, exact: bool) -> int:
        """The first rank whose descriptor of phase ``c`` differs from this rank's (only the
        head when not ``exact``), or -1. Runs once per operation: one loop, no tuples."""
        words, idx = self._meta_words, self._desc[c & 1]
        i = idx[self.rank]
        head, nbytes = words[i], words[i + 1]
        for p, j in enumerate(idx):
            if words[j] != head or (exact and words[j + 1] != nbytes):
                return p
        return -1

    def rows(self, parity: int, dtype: torch.dtype, numel: int) -> list[torch.Tensor]:
        """``[slots(parity, dtype)[p, :numel] for p in ranks]``, cached (small ops repeat)."""
        key = (3, parity & 1, dtype, numel)
        rows = self._typed.get(key)
        if rows is None:
            if len(self._typed) > 512:
                self._typed.clear()
            slots = self.slots(parity, dtype)
            rows = self._typed[key] = [slots[p, :numel] for p in range(self.size)]
        return rows

    # -- phases ----------------------------------------------------------------------------
    def next_phase(self, deadline: float, op: str) -> int:
        """The next phase number; waits until every rank is done with its buffers."""
        c = self.phase + 1
        if self.known < c - 1:
            self.wait_all(c - 1, deadline, op)
        return c

    def post(self, c: int) -> None:
        self.phase = c
        words = self.words
        words[self._ctr[self.rank]] = c & _M  # plain: see the module's note on sleepers
        if self._exchange is None:  # sleepers' words are not fenced either: always wake
            futex.wake(self._post_addr)
            return
        me = self.rank + 1
        for j in self._sleep_i:
            if words[j] == me:
                futex.wake(self._post_addr)
                return

    def reached_by_all(self, c: int, spin_s: float = 0.0) -> bool:
        """Whether every rank has posted phase ``c``, looking for up to ``spin_s`` seconds
        (yielding the CPU between looks where ranks outnumber CPUs, as ``wait`` does)."""
        words, ctr = self.words, self._ctr
        end = time.perf_counter() + spin_s
        while True:
            if all(_reached(words[i], c) for i in ctr):
                return True
            if time.perf_counter() >= end:
                return False
            if self.yield_spin:
                os.sched_yield()

    def wait_all(self, c: int, deadline: float, op: str, spin_s: float | None = None) -> None:
        words = self.words
        for p, i in enumerate(self._ctr):
            if ((words[i] - c) & _M) >= 0x80000000 and p != self.rank:
                self.wait(p, c, deadline, op, spin_s)
        if c > self.known:
            self.known = c
        if self.unlink_pending:
            self.unlink_pending = False
            self.seg.unlink()

    def wait(self, p: int, c: int, deadline: float, op: str, spin_s: float | None = None) -> None:
        """Return once rank ``p`` has posted phase ``c``; raise on abort, death or timeout.

        ``spin_s`` (a blocked caller's longer spin, see ``caller_spin``): spin that long, and
        past the ordinary spin yield the CPU between looks, so that a process sharing this
        core (another job, a rank of an oversubscribed host) runs instead of this loop; None:
        the ordinary spin."""
        words, i = self.words, self._ctr[p]
        if _reached(words[i], c):
            return
        now = time.perf_counter
        t = now()
        end = t + (self.spin_s if spin_s is None else spin_s)
        polite = t + self.spin_s if spin_s is not None and not self.yield_spin else end
        alone = 0
        while True:
            if t > polite:
                os.sched_yield()  # returns at once while nothing else wants this CPU
            elif self.yield_spin:
                t = now()
                os.sched_yield()
                # a yield that returns at once found nobody to run here: this CPU is ours
                # alone while the awaited rank queues elsewhere, so sleeping (which lets the
                # kernel move a runnable rank onto this CPU) beats spinning on
                alone = alone + 1 if now() - t < _LONE_YIELD else 0
                if alone > _LONE_YIELDS:
                    break
            if _reached(words[i], c):
                return
            if words[_ABORT_WORD]:
                self._raise_aborted(op)
            t = now()
            if t > end:
                break
        if self.cancelled is not None:
            raise self.cancelled
        self._sleep_until(p, c, deadline, op)

    def _sleep_until(self, p: int, c: int, deadline: float, op: str) -> None:
        words, i = self.words, self._ctr[p]
        addr = self.seg.address + 4 * i
        flag = self.seg.address + 4 * self._sleep_i[self.rank]
        if self._exchange is not None:
            self._exchange(flag, p + 1, _SEQ_CST)
        try:
            self._sleep_loop(p, c, deadline, op, addr)
        finally:
            if self.words is not None:
                words[self._sleep_i[self.rank]] = 0

    def _sleep_loop(self, p: int, c: int, deadline: float, op: str, addr: int) -> None:
        words, i = self.words, self._ctr[p]
        checked = time.monotonic()
        nap = FIRST_SLICE  # a wake-up missed on entry costs at most this (module docstring)
        while True:
            v = words[i]
            if _reached(v, c):
                return
            if words[_ABORT_WORD]:
                self._raise_aborted(op)
            if self.cancelled is not None:
                raise self.cancelled
            if words[(HEADER + p * LINE + 64) // 4]:
                raise DistNetworkError(
                    f"{op}: rank {self.members[self.rank]}: rank {self.members[p]} shut down "
                    f"its process group while this rank waited for it"
                )
            now = time.monotonic()
            if now - checked >= SLICE:
                checked = now
                self.check_alive(op)
                err = self.poll_error() if self.poll_error is not None else None
                if err is not None:
                    raise type(err)(f"{op}: rank {self.members[self.rank]}: {err}")
            if now >= deadline:
                late = [q for q in range(self.size) if not _reached(words[self._ctr[q]], c)]
                raise DistTimeoutError(
                    f"{op}: rank {self.members[self.rank]} timed out after {self.timeout:.1f}s "
                    f"waiting for {', '.join(f'rank {self.members[q]}' for q in late)} "
                    f"(shm phase {c})"
                )
            futex.wait(addr, v, min(nap, deadline - now))
            nap = min(2 * nap, SLICE)

    def check_alive(self, op: str) -> None:
        dead = self.watch.dead([self.members[p] for p in range(self.size)])
        if dead:
            who = ", ".join(f"rank {g} (pid {self.watch.pids[g]})" for g in dead)
            raise DistNetworkError(
                f"{op}: rank {self.members[self.rank]}: {who} died during the collective"
            )

    # -- failure and shutdown ------------------------------------------------------------
    def abort(self, reason: str) -> None:
        """Make every member's current and later waits raise ``reason`` (first abort wins)."""
        if self.unlink_pending:
            self.unlink_pending = False
            self.seg.unlink()
        data = reason.encode(errors="replace")[:_REASON_MAX]
        self._own_abort = f"aborted by rank {self.members[self.rank]}: {reason}"
        off = HEADER + self.rank * LINE + _REASON_OFF
        self.words[off // 4] = len(data)
        self.seg.mm[off + 4:off + 4 + len(data)] = data
        if not self.words[_ABORT_WORD]:
            self.words[_ABORT_WORD] = self.rank + 1
        self._wake_all()

    def cancel(self, error: BaseException) -> None:
        """Fail this rank's own waits (not the peers') with ``error``."""
        self.cancelled = error
        self._wake_all()

    def _raise_aborted(self, op: str) -> None:
        words, seg = self.words, self.seg
        if words is None or seg is None:  # closed by another thread (abort, then shutdown) meanwhile
            raise DistBackendError(f"{op}: {self._own_abort or 'aborted: the group was shut down while this rank waited'}")
        who = words[_ABORT_WORD] - 1
        off = HEADER + who * LINE + _REASON_OFF
        n = words[off // 4]
        reason = bytes(seg.mm[off + 4:off + 4 + min(n, _REASON_MAX)]).decode(errors="replace")
        raise DistBackendError(f"{op}: aborted by rank {self.members[who]}: {reason}")

    def _wake_all(self) -> None:
        for i in self._ctr:
            futex.wake(self.seg.address + 4 * i)

    def close(self) -> None:
        """Mark this rank gone (peers waiting on it fail at once) and unmap."""
        if self.seg is None:
            return
        self.words[(HEADER + self.rank * LINE + 64) // 4] = 1
        futex.wake(self.seg.address + 4 * self._ctr[self.rank])
        self._typed.clear()
        self.words = self._meta_words = None  # type: ignore[assignment]
        seg, self.seg = self.seg, None  # type: ignore[assignment]
        if seg is not None:  # (another thread's close took it meanwhile)
            seg.close()
