"""A rank that never enters a collective is named, with what it last did, by every rank
waiting for it: in a warning after ``PYC10D_STUCK_WARN_S`` and in the timeout error."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
import torch
from _clock import bound
from _multirank import BACKENDS, run_ranks
from _refs import Check

import pyc10d as dist
from pyc10d.errors import DistTimeoutError

WARN_S = 1.0


#: The longest a sleeping rank stays away waiting for the others' signal (a backstop: they
#: signal as soon as they have what the test checks, so it normally waits about ``WARN_S``).
SLEEP_MAX_S = 15.0


class _Collect(logging.Handler):
    """Collects pyc10d's warnings; the first one of this rank's own wait is also announced
    in the store (``warned/<rank>``) so the sleeping rank knows it may come back."""

    def __init__(self, store: dist.Store, rank: int) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.times: list[float] = []
        self._store, self._rank = store, rank

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.times.append(time.monotonic())
        if f"rank {self._rank} has waited" in self.messages[-1]:
            self._store.set(f"warned/{self._rank}", "1")


def _sleep_until(store: dist.Store, what: str, ws: int, sleeper: int) -> None:
    """The sleeper stays away until every other rank has set ``<what>/<rank>`` (at most
    ``SLEEP_MAX_S``): no fixed sleep longer than the threshold under test."""
    store.wait([f"{what}/{r}" for r in range(ws) if r != sleeper], timedelta(seconds=SLEEP_MAX_S))


def _sleeper_warned(rank: int, ws: int) -> int:
    c = Check(rank)
    sleeper = ws - 1
    store = dist._get_default_store()
    handler = _Collect(store, rank)
    logging.getLogger("pyc10d").addHandler(handler)
    try:
        dist.barrier()
        t = torch.ones(4)
        if rank == sleeper:
            _sleep_until(store, "warned", ws, sleeper)
        t0 = time.monotonic()
        dist.all_reduce(t)
        c.eq(t, torch.full((4,), float(ws)), "all_reduce after the wait")
        if rank != sleeper:
            mine = [m for m in handler.messages if f"rank {rank} has waited" in m]
            c.true(len(mine) == 1, f"one warning on rank {rank}, got {handler.messages}")
            c.true(bool(mine) and f"rank {sleeper} (last completed: barrier #1)" in mine[0],
                   f"warning names the sleeping rank and its last collective: {mine}")
            c.true(time.monotonic() - t0 > WARN_S, "waited past the threshold")
            late = [t - t0 for m, t in zip(handler.messages, handler.times) if f"rank {rank} has waited" in m]
            limit = WARN_S + bound(2.0)  # at the threshold, not later
            c.true(bool(late) and late[0] <= limit, f"warned {late} s after entering (limit {limit:.1f})")
    finally:
        logging.getLogger("pyc10d").removeHandler(handler)
    return c.finish()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_stuck_rank_named_in_a_warning(backend: str) -> None:
    run_ranks(backend, 3, _sleeper_warned, timeout=40,
              patches={"pyc10d.backends.watchdog.warn_after": lambda: WARN_S})


def _sleeper_timeout(rank: int, ws: int) -> str:
    sleeper = ws - 1
    dist.broadcast(torch.ones(2), src=0)
    g = dist.new_group(list(range(ws)), timeout=timedelta(seconds=3))
    store = dist._get_default_store()
    if rank == sleeper:
        _sleep_until(store, "gave_up", ws, sleeper)
        return "slept"
    try:
        dist.all_reduce(torch.ones(4), group=g)
    except RuntimeError as e:  # a timeout here, or a peer's abort quoting its timeout
        msg = str(e)
        assert isinstance(e, DistTimeoutError) or "timed out" in msg, msg
        assert f"rank {sleeper} (" in msg and "not in allreduce #1" in msg, msg
        return "named"
    finally:
        store.set(f"gave_up/{rank}", "1")
    return "no timeout"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_timeout_names_the_missing_rank(backend: str) -> None:
    assert run_ranks(backend, 3, _sleeper_timeout, timeout=40) == ["named", "named", "slept"]


def _register_in_child(queue) -> None:  # type: ignore[no-untyped-def]
    from pyc10d.backends import watchdog

    class Engine:  # what register needs: something weakly referable
        pass

    engine = Engine()
    watchdog.WATCHDOG.register(engine)
    queue.put("registered")


@pytest.mark.timeout(30)
def test_watchdog_lock_held_at_fork_does_not_hang_the_child() -> None:
    """Regression: a process forked while its watchdog thread held the watchdog's lock (a
    test runner that ran in-process groups before forking ranks) hung in the child's
    ``init_process_group``, which registers with the watchdog."""
    import multiprocessing

    from pyc10d.backends import watchdog

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    with watchdog.WATCHDOG._lock:  # as the watchdog thread holds it for a moment each period
        child = ctx.Process(target=_register_in_child, args=(queue,))
        child.start()
    try:
        assert queue.get(timeout=10) == "registered"
    finally:
        child.join(5)
        if child.is_alive():
            child.kill()
