"""Run a test body on ``world_size`` ranks that are threads of the test process.

Two entry points, as in torch's ``common_distributed``:

* :class:`MultiThreadedTestCase`: call ``self._spawn_threads()`` in ``setUp``; every test
  method then runs once per rank, on its own thread, with ``self.rank`` set and the default
  group initialised with the ``threaded`` backend;
* :func:`spawn_threads_and_init_comms`: a decorator doing the same for one method of any
  ``TestCase``.

Each rank-thread has its own pyc10d ``World``, so ``dist.get_rank()`` and the default group
are per thread. The main thread waits for all ranks and then:

* if a rank raised, fails with ``RuntimeError`` listing every failed rank with its traceback,
  the likely cause first: errors that are not pyc10d's (the test's own) before pyc10d errors
  (often ranks released because of another's failure), each in the order they were seen.
  As soon as a rank raises, every world its threads met through the
  test's store is terminated, so the other ranks' pending and later receives fail at once
  instead of waiting on a rank that will never send (no hang);
* if ranks skipped (``unittest.skip`` and friends) and none failed, reports a skip;
* if ranks are still running at the timeout, terminates their worlds (which releases any rank
  blocked in a collective) and fails naming those ranks, with their Python stacks.

The timeout is the class attribute ``timeout`` (or the decorator's argument), else the
environment variable ``PYC10D_TEST_TIMEOUT``, else 30 seconds.

Autograd's per-device worker threads are switched off in every rank-thread (the setting is
per thread), so a backward pass runs on the rank's thread and sees that rank's group.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
import traceback
import unittest
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

import pyc10d
from pyc10d.errors import DistBackendError, DistError, DistTimeoutError
from pyc10d.settings import TEST_TIMEOUT
from pyc10d.store import HashStore
from pyc10d.testing.case import TestCase, dispatch_to_ranks
from pyc10d.testing.decorators import pending_skip_reason
from pyc10d.threads import settle_torch_pool
from pyc10d.transport.threaded import terminate
from pyc10d.world import World, set_thread_world

TIMEOUT_ENV_VAR = TEST_TIMEOUT.name
DEFAULT_TIMEOUT = 30.0
DEFAULT_WORLD_SIZE = 4
_MAX_STACK_CHARS = 4000


def _timeout(value: float | None) -> float:
    if value is not None:
        return float(value)
    return float(TEST_TIMEOUT.get(DEFAULT_TIMEOUT))


_patcher_local = threading.local()


@contextlib.contextmanager
def _thread_patcher() -> Iterator[Any]:
    from torch.fx import _symbolic_trace

    prior = getattr(_patcher_local, "patcher", None)
    patcher = _patcher_local.patcher = _symbolic_trace._Patcher()
    try:
        yield patcher
    finally:
        patcher.revert_all_patches()
        _patcher_local.patcher = prior


def _per_thread_fx_patcher() -> None:
    """Let rank-threads trace (``make_fx``) at the same time.

    torch.fx keeps the tracer's patcher in one module global, which two threads tracing at
    once clobber ("CURRENT_PATCHER is None in finally block"); rank-threads must trace
    together, since each trace runs collectives the others join. This gives each thread
    its own patcher (torch's tests reset the sibling global ``_is_fx_tracing_flag`` in
    tearDown for the same reason).
    """
    from torch.fx import _symbolic_trace

    if _symbolic_trace._new_patcher is not _thread_patcher:
        _symbolic_trace._new_patcher = _thread_patcher


def _reset_fx_tracing_flag() -> None:
    """Traces that overlapped in rank-threads can leave torch.fx's global "is tracing" flag
    set (each restores the value it saw on entry); nothing traces once the ranks are done."""
    from torch.fx import _symbolic_trace

    _symbolic_trace._is_fx_tracing_flag = False


@dataclass
class _Outcome:
    rank: int
    error: BaseException
    trace: str
    when: float


class ThreadedRun:
    """One run of ``body(rank)`` on ``world_size`` rank-threads sharing a fresh ``HashStore``."""

    def __init__(self, world_size: int, timeout: float | None = None) -> None:
        self.world_size = int(world_size)
        self.timeout = _timeout(timeout)
        self.store = HashStore()
        self.threads: list[threading.Thread] = []
        self.outcomes: list[_Outcome] = []
        self._lock = threading.Lock()

    def start(self, body: Callable[[int], Any]) -> None:
        self._started = time.monotonic()
        _per_thread_fx_patcher()
        settle_torch_pool()
        for rank in range(self.world_size):
            t = threading.Thread(
                target=self._rank_main, args=(rank, body), name=f"pyc10d-rank-{rank}", daemon=True
            )
            self.threads.append(t)
            t.start()

    def _rank_main(self, rank: int, body: Callable[[int], Any]) -> None:
        set_thread_world(World())
        try:
            # autograd's flag is per thread: off here, backward runs on this rank's thread
            with torch.autograd.set_multithreading_enabled(False):
                body(rank)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            self._record(rank, e)
        finally:
            try:
                if pyc10d.is_initialized():
                    pyc10d.destroy_process_group()
            except BaseException as e:  # noqa: BLE001
                self._record(rank, e)
            set_thread_world(None)

    def _record(self, rank: int, error: BaseException) -> None:
        outcome = _Outcome(rank, error, traceback.format_exc(), time.monotonic())
        with self._lock:
            self.outcomes.append(outcome)
        if not isinstance(error, unittest.SkipTest):
            terminate(
                self.store,
                DistBackendError(
                    f"rank {rank} failed ({type(error).__name__}: {error}); the test is being torn down"
                ),
            )

    def join(self) -> None:
        """Wait for every rank (up to the timeout), then raise what the ranks' outcome calls for."""
        deadline = self._started + self.timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        _reset_fx_tracing_flag()
        stuck = [r for r, t in enumerate(self.threads) if t.is_alive()]
        stacks = _stacks([self.threads[r] for r in stuck])
        if stuck:
            terminate(
                self.store,
                DistTimeoutError(
                    f"test timed out after {self.timeout:g} s with ranks {stuck} still running"
                ),
            )
            for r in stuck:
                self.threads[r].join(5.0)
        self._report(stuck, stacks)

    def _report(self, stuck: list[int], stacks: dict[int, str]) -> None:
        outcomes = sorted(self.outcomes, key=lambda o: o.when)
        skips = [o for o in outcomes if isinstance(o.error, unittest.SkipTest)]
        errors = [o for o in outcomes if not isinstance(o.error, unittest.SkipTest)]
        if skips and not stuck:
            first_skip = skips[0].when
            # Ranks released because a peer skipped (their peer left) are not failures.
            if all(isinstance(o.error, DistError) and o.when >= first_skip for o in errors):
                raise unittest.SkipTest(
                    "; ".join(sorted({str(o.error) or "skipped" for o in skips}))
                )
        if not errors and not stuck:
            return
        errors.sort(key=lambda o: isinstance(o.error, DistError))  # stable: time order kept
        parts = []
        for i, o in enumerate(errors):
            label = " (likely cause)" if i == 0 and len(errors) > 1 else ""
            parts.append(
                f"Thread {o.rank} (rank {o.rank}) exited with exception{label}:\n{o.trace}"
            )
        if stuck:
            parts.append(
                f"Test timed out after {self.timeout:g} s: ranks {stuck} had not finished."
            )
            for r in stuck:
                if stacks.get(r):
                    parts.append(f"Stack of rank {r} at the timeout:\n{stacks[r]}")
        raise RuntimeError("\n".join(parts))


def _stacks(threads: list[threading.Thread]) -> dict[int, str]:
    frames = sys._current_frames()
    out: dict[int, str] = {}
    for t in threads:
        frame = frames.get(t.ident or -1)
        if frame is None:
            continue
        text = "".join(traceback.format_stack(frame))
        rank = int(t.name.rsplit("-", 1)[-1])
        out[rank] = text[-_MAX_STACK_CHARS:]
    return out


def _init_threaded(rank: int, world_size: int, store: Any) -> None:
    pyc10d.init_process_group(backend="threaded", rank=rank, world_size=world_size, store=store)


def spawn_threads_and_init_comms(
    func: Callable[..., Any] | None = None,
    timeout: float | None = None,
    world_size: int = DEFAULT_WORLD_SIZE,
) -> Any:
    """Run the decorated method once per rank, each on a thread with the threaded backend up."""
    if func is None:
        return functools.partial(
            spawn_threads_and_init_comms, timeout=timeout, world_size=world_size
        )

    @functools.wraps(func)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        run = ThreadedRun(world_size, timeout)

        def body(rank: int) -> None:
            _init_threaded(rank, world_size, run.store)
            func(self, *args, **kwargs)

        run.start(body)
        run.join()

    return wrapper


class MultiThreadedTestCase(TestCase):
    """Base class whose every test method runs on ``world_size`` rank-threads.

    Call ``self._spawn_threads()`` in ``setUp`` after ``super().setUp()``. Per-rank set-up and
    tear-down go in ``perThreadSetUp``/``perThreadTearDown`` (``setUp`` runs on the main
    thread only). Each rank runs on its own instance of the class, with ``self.rank`` set.
    """

    MAIN_THREAD_RANK: ClassVar[int] = -1
    #: Whole-test timeout in seconds; ``None`` means env var or the default.
    timeout: ClassVar[float | None] = None

    def __init__(self, methodName: str = "runTest") -> None:  # noqa: N803 - unittest API
        super().__init__(methodName)
        self.rank = self.MAIN_THREAD_RANK
        self.threads: list[threading.Thread] = []
        self._run: ThreadedRun | None = None
        dispatch_to_ranks(self, methodName, lambda: self.rank == self.MAIN_THREAD_RANK, self._join_threads)

    @property
    def world_size(self) -> int:
        return DEFAULT_WORLD_SIZE

    def perThreadSetUp(self) -> None:  # noqa: N802 - torch's name
        pass

    def perThreadTearDown(self) -> None:  # noqa: N802 - torch's name
        pass

    def setUp(self) -> None:
        super().setUp()
        self.rank = self.MAIN_THREAD_RANK
        self.threads = []
        self._run = None

    def tearDown(self) -> None:
        super().tearDown()
        self.threads = []

    def _spawn_threads(self) -> None:
        """Start one thread per rank running this test; call from ``setUp``."""
        reason = pending_skip_reason(getattr(self, self._testMethodName))
        if reason:
            raise unittest.SkipTest(reason)
        test_name, cls, world_size = self._testMethodName, type(self), int(self.world_size)
        run = ThreadedRun(world_size, self.timeout)

        def body(rank: int) -> None:
            case = cls(test_name)
            case.rank = rank
            _init_threaded(rank, world_size, run.store)
            case.perThreadSetUp()
            try:
                getattr(case, test_name)()
            finally:
                case.perThreadTearDown()

        self._run = run
        run.start(body)
        self.threads = run.threads

    def _join_threads(self) -> None:
        if self._run is None:
            self.fail(
                f"{type(self).__name__} ran no ranks: call self._spawn_threads() in setUp "
                f"after super().setUp()"
            )
        run, self._run = self._run, None
        run.join()

    def assertEqualOnRank(self, x: Any, y: Any, msg: Any = None, *, rank: int = 0) -> None:  # noqa: N802
        """``assertEqual`` on ``rank`` only (rank-threads share one RNG, so values differ)."""
        if self.rank == rank:
            self.assertEqual(x, y, msg)

    def assertNotEqualOnRank(self, x: Any, y: Any, msg: Any = None, *, rank: int = 0) -> None:  # noqa: N802
        """``assertNotEqual`` on ``rank`` only."""
        if self.rank == rank:
            self.assertNotEqual(x, y, msg)


__all__ = ["MultiThreadedTestCase", "ThreadedRun", "spawn_threads_and_init_comms"]
