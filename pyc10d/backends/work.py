"""``Work``: the handle an operation returns, and its ``torch.futures.Future``.

A Work completes exactly once, with the operation's output tensors or its error. ``wait``
re-raises the error on the caller's thread, so a failure on the progress thread is never lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from ..errors import TIMED_OUT, DistTimeoutError


class Work:
    """Handle of one (possibly asynchronous) operation."""


    def __init__(self, opname: str, outputs: Any = None, seq: int = -1) -> None:
        self.opname = opname
        self.outputs = outputs
        self.seq = seq
        # A pre-acquired lock is the cheapest blocking latch (an Event costs a Condition).
        self._latch = threading.Lock()
        self._latch.acquire()
        self._finished = False
        self._error: BaseException | None = None
        self._future: torch.futures.Future | None = None
        self._lock = threading.Lock()
        self._source_rank = -1
        # Set by the engine for a queued operation: runs it on the waiting thread when that
        # keeps the group's order (True), instead of waiting for the progress thread.
        self.runner: Callable[[Work], bool] | None = None
        self.issuer = 0  # the thread that issued it (``threading.get_ident``)

    # -- completion (called by the backend) -----------------------------------------------
    def finish(self, error: BaseException | None = None) -> None:
        with self._lock:
            self._error = error
            self._finished = True
            self._latch.release()
            fut = self._future
        if fut is not None:
            self._settle(fut)

    def _settle(self, fut: torch.futures.Future) -> None:
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self.outputs)

    # -- torch's Work API ------------------------------------------------------------------
    def wait(self, timeout: timedelta | float | None = None) -> bool:
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if secs is not None and secs <= 0:
            secs = None
        if not self._finished:
            runner = self.runner
            # Only an unbounded wait may run the operation itself: a bounded one must be able
            # to give up at its timeout, which an operation running on its thread cannot.
            if not (runner is not None and secs is None and runner(self)):
                if not self._latch.acquire(timeout=-1 if secs is None else secs):
                    raise DistTimeoutError(f"{self.opname}: {TIMED_OUT} (Work.wait gave up after {secs:.1f}s)")
                self._latch.release()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._finished

    def is_success(self) -> bool:
        return self._finished and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        out = self.outputs
        return out if isinstance(out, list) else [out] if out is not None else []

    def source_rank(self) -> int:
        return self._source_rank

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._finished:
                    self._settle(self._future)
            return self._future

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "pending"
        return f"<Work {self.opname} seq={self.seq} {state}>"


class StartedWork(Work):
    """An asynchronous operation its issuing thread started on the lean lane: its part is
    posted, its peers need nothing more from this rank, and what remains (waiting for their
    posts, writing the output) is local (``algorithms.shm_comm.split_step``). The engine
    finishes it when the result is needed first: here in ``wait`` (on the waiting thread,
    no hop to the progress thread), in ``is_completed`` if its peers have all posted, at the
    group's next operation, or on the progress thread once something must complete without
    a waiting caller (a bounded ``wait``, a future's callbacks, a poll that found it not
    ready: it must still time out or fail on a dead peer; the watchdog's look, when nobody
    came back to it within a period, ``watchdog.unattended``)."""

    def __init__(self, engine: Any, opname: str, outputs: Any, seq: int) -> None:
        super().__init__(opname, outputs, seq)
        self._engine = engine

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        if not self._finished:
            secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
            if secs is None or secs <= 0:
                self._engine.finish_started(self)
            else:  # a bounded wait must be able to give up: the progress thread finishes it
                self._engine.hand_off(self)
        return super().wait(timeout)

    def is_completed(self) -> bool:
        if not self._finished:
            self._engine.finish_started(self, block=False)
        return self._finished

    def get_future(self) -> torch.futures.Future:
        if not self._finished:  # its callbacks must run without anyone calling ``wait``
            self._engine.hand_off(self)
        return super().get_future()


class CompletedWork(Work):
    """An operation that finished, without error, before its Work was made (non-members'
    calls, world size 1's all_reduce, broadcast and barrier, fake backends): no latch or lock
    to build, nothing to wait for."""

    _finished = True
    _error = None
    runner = None
    issuer = 0
    _source_rank = -1

    def __init__(self, opname: str = "noop", outputs: Any = None, seq: int = -1) -> None:
        self.opname, self.outputs, self.seq = opname, outputs, seq
        self._future = None

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            fut = torch.futures.Future()
            fut.set_result(self.outputs)
            self._future = fut
        return self._future
