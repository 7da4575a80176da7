"""The engine's issue order when a waiter runs a queued operation itself (``Engine._run_here``).

A queued operation whose issuing thread waits for it before the progress thread took it up
runs on that thread. These tests drive an engine over a transport that moves no data, with
operations that only record what ran, where and in what order: every operation must run
exactly once, in issue order, with its error delivered to whoever waits, whichever thread
runs it.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from pyc10d.backends.engine import Engine
from pyc10d.errors import DistTimeoutError
from pyc10d.transport.fake import FakeTransport

pytestmark = pytest.mark.timeout(30)


class _Recorder:
    """Operations that append ``(sequence number, thread)`` when they run, optionally
    blocking first."""

    def __init__(self) -> None:
        self.ran: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def op(self, gate: threading.Event | None = None, error: BaseException | None = None,
           dwell: float = 0.0) -> Any:
        def fn(comm: Any) -> None:
            if gate is not None:
                assert gate.wait(10), "gate never opened"
            if dwell:
                time.sleep(dwell)
            with self.lock:
                self.ran.append((comm.channel & 0x7FFFFFFF, threading.get_ident()))  # its sequence number
            if error is not None:
                raise error

        return fn


def _engine() -> Engine:
    engine = Engine(FakeTransport(0, 1), [0], 0, "engine-order-test")
    engine.desync_check = False
    return engine


def _submit(engine: Engine, rec: _Recorder, sync: bool = False, **kw: Any) -> Any:
    return engine._submit("op", rec.op(**kw), None, sync=sync)


class _NoProgress:
    """Stands in for the progress thread: never runs anything, so waiters must."""

    def start(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


def test_waiter_runs_a_queued_operation_on_its_own_thread_once() -> None:
    engine, rec = _engine(), _Recorder()
    engine._worker = _NoProgress()  # type: ignore[assignment]
    works = [_submit(engine, rec) for _ in range(3)]
    for w in works:
        assert not w.is_completed()
        w.wait()
    me = threading.get_ident()
    assert rec.ran == [(1, me), (2, me), (3, me)]
    for w in works:  # waiting again runs nothing again
        w.wait()
    assert len(rec.ran) == 3
    engine.shutdown()


def test_waiting_for_a_later_operation_leaves_the_earlier_ones_to_the_progress_thread() -> None:
    engine, rec = _engine(), _Recorder()
    gate = threading.Event()
    first = _submit(engine, rec, gate=gate)  # holds the progress thread
    later = [_submit(engine, rec) for _ in range(3)]
    threading.Timer(0.2, gate.set).start()
    later[-1].wait()  # not next in line: must not jump ahead of the others
    for w in (first, *later):
        w.wait()
    assert [seq for seq, _ in rec.ran] == [1, 2, 3, 4]
    engine.shutdown()


def test_bounded_wait_and_other_threads_do_not_run_it() -> None:
    """A wait with a timeout must be able to give up, and a thread that did not issue the
    operation may be another rank (threaded backend): neither runs the operation."""
    engine, rec = _engine(), _Recorder()
    engine._worker = _NoProgress()  # type: ignore[assignment]
    work = _submit(engine, rec)
    with pytest.raises(DistTimeoutError):
        work.wait(timeout=0.05)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            work.wait(timeout=0.05)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], DistTimeoutError)
    assert rec.ran == []
    work.wait()
    assert [seq for seq, _ in rec.ran] == [1]
    engine.shutdown()


def test_error_of_an_operation_run_by_its_waiter_is_raised_there_and_breaks_the_group() -> None:
    engine, rec = _engine(), _Recorder()
    engine._worker = _NoProgress()  # type: ignore[assignment]
    work = _submit(engine, rec, error=ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        work.wait()
    assert work.is_completed() and not work.is_success()
    with pytest.raises(ValueError, match="boom"):  # the same error, every time
        work.wait()
    nxt = _submit(engine, rec)
    with pytest.raises(ValueError, match="unusable after an earlier failure"):
        nxt.wait()
    engine.shutdown()


def test_future_callback_may_issue_the_next_synchronous_operation() -> None:
    """The Work is finished after the runner let go of the engine: a callback that issues the
    group's next operation runs it inline instead of deadlocking."""
    engine, rec = _engine(), _Recorder()
    engine._worker = _NoProgress()  # type: ignore[assignment]
    work = _submit(engine, rec)
    chained: list[Any] = []
    work.get_future().then(lambda fut: chained.append(_submit(engine, rec, sync=True)))
    work.wait()
    assert len(chained) == 1 and chained[0].is_completed()
    assert [seq for seq, _ in rec.ran] == [1, 2]
    engine.shutdown()


@pytest.mark.timeout(45)
def test_stress_mixed_async_sync_and_waits_from_several_threads() -> None:
    """Several threads issue mixes of async and sync operations on one engine and wait for
    them in shuffled order: each operation runs exactly once, all in issue (sequence) order,
    on the progress thread or a waiter."""
    engine, rec = _engine(), _Recorder()
    threads, per_thread = 4, 300
    failures: list[BaseException] = []

    def body(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            works = []
            for _ in range(per_thread):
                dwell = 0.0002 if rnd.random() < 0.05 else 0.0
                works.append(_submit(engine, rec, sync=rnd.random() < 0.3, dwell=dwell))
                if rnd.random() < 0.4:
                    rnd.shuffle(works)
                    for w in works[: rnd.randint(0, len(works))]:
                        w.wait()
            for w in works:
                w.wait()
        except BaseException as e:  # noqa: BLE001
            failures.append(e)

    ts = [threading.Thread(target=body, args=(s,)) for s in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(40)
    assert not any(t.is_alive() for t in ts), "a thread hung"
    assert not failures, failures
    seqs = [seq for seq, _ in rec.ran]
    assert seqs == list(range(1, threads * per_thread + 1))
    assert engine._pending == 0 and not engine._jobs
    engine.shutdown()
