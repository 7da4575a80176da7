"""Who reads one tcp connection's socket, the receiver thread or a caller on the lean lane,
and how long a waiting caller looks before it sleeps (``direct``'s policy, read by
``tcp`` when it makes a ``DirectIO``).

One lock per connection (``Owner``): the receiver thread holds it only while it reads a
frame, and between frames it releases it. A caller takes it (``try_take``: never waiting for
it long; a busy socket sends that receive down the receiver's path, the mailbox) and gives it
back at the end of its operation. The receiver stays off the socket for ``GRACE_S`` after
that, so that back-to-back collectives keep the socket without waking it each time; after the
grace, or at once when anything posts a receive the receiver must serve (``unpark``), it
drains the socket as before.
"""

from __future__ import annotations

import select
import threading
import time

from ... import settings
from ..cpus import oversubscribed

#: Seconds a receiver thread stays off its socket after a caller gave it back.
GRACE_S = 0.005
#: Longest a caller waits for a receiver thread to finish the frame it is reading.
TAKE_WAIT_S = 0.05
_TAKE_SLICE_S = 0.0005
_monotonic = time.monotonic


def spin_seconds(ranks_on_host: int, cpus: int) -> float:
    """How long a waiting caller looks at its socket before sleeping: ``PYC10D_TCP_SPIN_US``,
    default 1 ms with a CPU per rank on this host, else 200 us giving the CPU away between
    looks (``spin_yields``: a rank that held it would keep the rank it waits for off it)."""
    us = settings.TCP_SPIN_US.get()
    if us is not None:
        return max(us, 0.0) * 1e-6
    return 200e-6 if oversubscribed(ranks_on_host, cpus) else 1e-3


def spin_yields(ranks_on_host: int, cpus: int) -> bool:
    """Whether a spinning caller yields its CPU between looks: with more ranks than CPUs.

    Measured (``bench``, all_reduce, 4 ranks on the 2 CPUs, 2026-11-28, two rounds of each
    alternated, every result checked): sleeping in ``poll`` at once (the old policy) 8 B
    391-455 us, 32 KiB 544, 1 MiB 4982-5095; spinning 200 us with ``sched_yield`` between
    looks 173-265, 235, 3235-4104 (1 ms of it no better). shm's ``PYC10D_SHM_YIELD`` does the
    same for the same reason."""
    return oversubscribed(ranks_on_host, cpus)


class Owner:
    """Who reads one connection's socket: its receiver thread, or a caller (see module)."""

    __slots__ = ("lock", "parked_until", "takes", "cond", "caller")

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held by whoever is reading the socket
        self.parked_until = 0.0  # the receiver thread stays off the socket until then
        self.takes = 0  # callers that took it so far (the receiver compares)
        self.cond = threading.Condition(threading.Lock())
        self.caller = False  # a caller holds ``lock`` (else the receiver thread, or nobody)

    # -- the receiver thread -----------------------------------------------------------------
    def idle(self, poller: select.poll) -> None:
        """Between two frames, on the receiver thread (holding ``lock``): give the socket up
        until data is there and no caller owns it; return holding ``lock`` again.

        It looks at ``parked_until`` before it takes the lock: a receiver that took the lock
        while a caller wanted it would hold it while it waits for the GIL the caller holds."""
        takes = self.takes
        self.lock.release()
        while True:
            self._park()
            poller.poll()
            if self.parked_until > _monotonic():
                continue  # a caller has the socket (its data, too): stay off it
            self.lock.acquire()
            if self.takes == takes or poller.poll(0):  # nobody read since, or there is more
                return
            takes = self.takes
            self.lock.release()

    def _park(self) -> None:
        cond = self.cond
        with cond:
            while True:
                left = self.parked_until - _monotonic()
                if left <= 0:
                    return
                cond.wait(min(left, GRACE_S))

    def unpark(self) -> None:
        """Send the receiver thread back to its socket now (something posted a receive it
        must serve, or a send must not wait on a peer that waits for this rank to read)."""
        if self.parked_until:
            with self.cond:
                self.parked_until = 0.0
                self.cond.notify()

    # -- a caller ------------------------------------------------------------------------------
    def try_take(self) -> bool:
        """Take the socket for a caller: at once, or once the receiver thread has finished
        the frame it is reading (up to ``TAKE_WAIT_S``). False, and the receiver thread serves
        the caller's receive, if not by then, or at once when another caller's operation has
        the socket (another group of this transport on another thread): that operation
        hands this one's frames on as it reads, and waiting for it could wait for a peer
        that waits for this one (measured: two threads' groups on one connection, 300 calls
        each: 9.3 s waiting in turns, 0.21 s so, 0.31 s without the lane)."""
        deadline = 0.0
        while True:
            if self.caller:
                break
            self.parked_until = _monotonic() + 3600.0  # a receiver waking now parks
            if self.lock.acquire(True, _TAKE_SLICE_S):
                self.caller = True
                self.takes += 1
                return True
            now = _monotonic()
            if not deadline:
                deadline = now + TAKE_WAIT_S
            elif now > deadline:
                break
        self.unpark()
        return False

    def give(self) -> None:
        """Back to the receiver thread: at once if a receive is waiting for it (``unpark``
        while a caller held it), else after ``GRACE_S`` (the caller's next call is near)."""
        if self.parked_until:
            self.parked_until = _monotonic() + GRACE_S
        self.caller = False
        self.lock.release()
