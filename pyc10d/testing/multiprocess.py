"""``MultiProcessTestCase``: run one test method on ``world_size`` forked ranks.

Usage mirrors torch's class of the same name::

    class MyTest(MultiProcessTestCase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()

        def test_x(self):  # runs once per rank, with self.rank set
            ...

How a test runs:

* ``setUp`` (parent) makes a fresh ``self.file_name``; ``_spawn_processes``
  forks ``world_size`` children. Forking (not spawning) keeps start-up in the
  milliseconds because torch is already imported; each child sets
  ``torch.set_num_threads(1)`` so it never touches the OpenMP pool inherited
  from the parent.
* Each child runs the same test method with ``self.rank`` set, destroys any
  process group the test left behind, reports ``ok``/``skip``/``error`` (with
  traceback) through a pipe and exits with ``os._exit`` (no inherited atexit
  handlers, no waiting on leaked threads).
* The parent waits for all ranks. A failed rank fails the test with its rank
  and traceback; ranks still running ``failure_grace_period`` seconds after a
  failure are killed. If the whole test exceeds the timeout, every rank is
  killed and the test fails naming the ranks that had not finished. Either way
  the Python stacks of the ranks being killed are included (via
  :mod:`faulthandler` on ``SIGUSR1``). If ranks skip (and none failed), the test
  is reported as skipped.

The timeout is the class attribute ``timeout`` if set, else the environment
variable ``PYC10D_TEST_TIMEOUT``, else 60 seconds.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import unittest
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, TextIO

import torch

from pyc10d.settings import TEST_TIMEOUT
from pyc10d.testing._dist import dist_module_name
from pyc10d.testing.case import TestCase, dispatch_to_ranks, set_rng_seed
from pyc10d.testing.decorators import pending_skip_reason

TIMEOUT_ENV_VAR = TEST_TIMEOUT.name
DEFAULT_TIMEOUT = 60.0

#: Exit codes torch's tests use to mean "skipped", with their reasons.
SKIP_EXIT_CODES: dict[int, str] = {
    72: "Skipped because distributed backend is not available.",
    73: "Skipped due to small world size.",
    74: "CUDA is not available.",
    75: "Need at least 1 CUDA device",
    76: "c10d not compiled with NCCL support",
    77: "Need at least 2 CUDA devices",
    81: "Need at least 4 CUDA devices",
    85: "Need at least 8 CUDA devices",
    86: "Test skipped at subprocess level, look at subprocess log for skip reason",
    87: "Skipped due to odd world size.",
    89: "accelerator is not available.",
}


class TestSkip(NamedTuple):
    exit_code: int
    message: str


#: torch's ``TEST_SKIPS``: ``sys.exit(TEST_SKIPS["multi-gpu-2"].exit_code)`` in a rank skips the test.
TEST_SKIPS: dict[str, TestSkip] = {
    "backend_unavailable": TestSkip(72, SKIP_EXIT_CODES[72]),
    "small_worldsize": TestSkip(73, SKIP_EXIT_CODES[73]),
    "no_cuda": TestSkip(74, SKIP_EXIT_CODES[74]),
    "multi-gpu-1": TestSkip(75, SKIP_EXIT_CODES[75]),
    "nccl": TestSkip(76, SKIP_EXIT_CODES[76]),
    "multi-gpu-2": TestSkip(77, SKIP_EXIT_CODES[77]),
    "multi-gpu-4": TestSkip(81, SKIP_EXIT_CODES[81]),
    "multi-gpu-8": TestSkip(85, SKIP_EXIT_CODES[85]),
    "generic": TestSkip(86, SKIP_EXIT_CODES[86]),
    "odd_worldsize": TestSkip(87, SKIP_EXIT_CODES[87]),
}

_MAX_STACK_CHARS = 6000

# Keeps the faulthandler target file of a child open for the child's lifetime.
_stack_file: TextIO | None = None


@dataclass
class RankResult:
    """What one rank reported: ``status`` is ``ok``, ``skip`` or ``error``."""

    status: str
    detail: str = ""


class MultiProcessTestCase(TestCase):
    """Base class for tests whose every method runs on several forked ranks."""

    MAIN_PROCESS_RANK: ClassVar[int] = -1
    TEST_ERROR_EXIT_CODE: ClassVar[int] = 10
    SKIP_EXIT_CODE: ClassVar[int] = 86

    #: Whole-test timeout in seconds; ``None`` means env var or the default.
    timeout: ClassVar[float | None] = None
    #: Seconds the other ranks get to finish once one rank has failed.
    failure_grace_period: ClassVar[float] = 5.0

    @property
    def world_size(self) -> int:
        """Number of ranks to fork; override in subclasses."""
        return 4

    @property
    def destroy_pg_upon_exit(self) -> bool:
        """Whether each rank destroys a still-initialised default group at the end."""
        return True

    def __init__(self, methodName: str = "runTest") -> None:  # noqa: N803 - unittest API
        super().__init__(methodName)
        self.rank = self.MAIN_PROCESS_RANK
        self.file_name = ""
        self.processes: list[Any] = []
        self._pipes: list[multiprocessing.connection.Connection] = []
        self._stack_paths: list[str] = []
        self._started_at = 0.0
        self._threads_at_fork: list[str] = []
        dispatch_to_ranks(self, methodName, lambda: self.rank == self.MAIN_PROCESS_RANK, self._join_processes)

    # ----------------------------------------------------------------- parent
    def setUp(self) -> None:
        super().setUp()
        self.rank = self.MAIN_PROCESS_RANK
        self.processes = []
        self._pipes = []
        self._stack_paths = []
        fd, self.file_name = tempfile.mkstemp(prefix="pyc10d_test_")
        os.close(fd)
        # A cleanup (not tearDown) so the files also go when setUp skips or fails.
        self.addCleanup(self._remove_files)

    def tearDown(self) -> None:
        super().tearDown()
        self._kill_all()

    def _remove_files(self) -> None:
        self._kill_all()
        for path in [self.file_name, *self._stack_paths]:
            try:
                os.remove(path)
            except OSError:
                pass

    def _timeout(self) -> float:
        if self.timeout is not None:
            return float(self.timeout)
        return float(TEST_TIMEOUT.get(DEFAULT_TIMEOUT))

    def _spawn_processes(self) -> None:
        """Fork one child per rank; call from ``setUp`` after ``super().setUp()``."""
        reason = pending_skip_reason(getattr(self, self._testMethodName))
        if reason:
            raise unittest.SkipTest(reason)
        ctx = multiprocessing.get_context("fork")
        # Threads do not survive fork, but locks they hold do; remembered for diagnosis.
        self._threads_at_fork = [
            t.name for t in threading.enumerate() if t is not threading.main_thread()
        ]
        self._started_at = time.monotonic()
        for rank in range(int(self.world_size)):
            stack_path = f"{self.file_name}.rank{rank}.stacks"
            self._stack_paths.append(stack_path)
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=self._run_rank, args=(rank, writer, stack_path), name=f"rank {rank}"
            )
            proc.start()
            writer.close()
            self.processes.append(proc)
            self._pipes.append(reader)

    def _join_processes(self) -> None:
        if not self.processes:
            self.fail(
                f"{type(self).__name__} ran no ranks: call self._spawn_processes() in setUp "
                f"after super().setUp()"
            )
        timeout = self._timeout()
        deadline = self._started_at + timeout
        results: dict[int, RankResult] = {}
        first_failure: float | None = None
        while True:
            self._collect(results)
            pending = [r for r in range(len(self.processes)) if r not in results]
            if not pending:
                break
            now = time.monotonic()
            if first_failure is None and any(r.status == "error" for r in results.values()):
                first_failure = now
            if first_failure is not None and now - first_failure >= self.failure_grace_period:
                break
            if now >= deadline:
                break
            limit = deadline if first_failure is None else first_failure + self.failure_grace_period
            waitables = [self._pipes[r] for r in pending] + [
                self.processes[r].sentinel for r in pending
            ]
            multiprocessing.connection.wait(waitables, timeout=max(0.0, min(limit - now, 1.0)))
        elapsed = time.monotonic() - self._started_at
        stacks = self._dump_stacks(pending)
        for rank in results:  # reported ranks exit right away; let them finish flushing
            self.processes[rank].join(timeout=2)
        self._kill_all()
        self._report(results, pending, stacks, elapsed, timeout)

    def _collect(self, results: dict[int, RankResult]) -> None:
        """Read every report that is available; an exit without one is a crash."""
        for rank, pipe in enumerate(self._pipes):
            if rank in results:
                continue
            proc = self.processes[rank]
            # A child sends before it exits, so once it is gone the pipe is final.
            exited = not proc.is_alive()
            if pipe.poll():
                try:
                    results[rank] = pipe.recv()
                    continue
                except (EOFError, OSError):
                    exited = True
            if exited:
                proc.join(timeout=5)
                results[rank] = RankResult(
                    "error", f"process died without reporting ({_describe_exit(proc.exitcode)})"
                )

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Ask still-running ranks for their Python stacks (best effort, ~1 s)."""
        if not ranks or not hasattr(signal, "SIGUSR1"):
            return {}
        asked = []
        for rank in ranks:
            try:
                os.kill(self.processes[rank].pid, signal.SIGUSR1)
                asked.append(rank)
            except OSError:
                pass
        stacks: dict[int, str] = {}
        end = time.monotonic() + 2.0
        while asked and time.monotonic() < end:
            time.sleep(0.2)  # faulthandler writes from the signal handler; give it a moment
            for rank in list(asked):
                try:
                    with open(self._stack_paths[rank]) as f:
                        text = f.read()
                except OSError:
                    continue
                if text:
                    stacks[rank] = _trim_stacks(text)
                    asked.remove(rank)
        return stacks

    def _kill_all(self) -> None:
        for proc in self.processes:
            if proc.is_alive():
                proc.kill()
        for proc in self.processes:
            proc.join(timeout=10)
        for pipe in self._pipes:
            pipe.close()
        self._pipes = []
        self.processes = []

    def _report(
        self,
        results: dict[int, RankResult],
        pending: list[int],
        stacks: dict[int, str],
        elapsed: float,
        timeout: float,
    ) -> None:
        errors = {r: res for r, res in sorted(results.items()) if res.status == "error"}
        skips = {r: res for r, res in sorted(results.items()) if res.status == "skip"}
        if not errors and not pending:
            if skips:
                reasons = sorted({res.detail for res in skips.values()})
                raise unittest.SkipTest("; ".join(reasons))
            return
        parts = [f"Rank {rank} failed:\n{res.detail.rstrip()}" for rank, res in errors.items()]
        if pending and errors:
            parts.append(
                f"Ranks {pending} were still running {self.failure_grace_period:g} s after "
                f"the first failure and were killed."
            )
        elif pending:
            finished = sorted(results)
            parts.append(
                f"Test timed out after {timeout:g} s (elapsed {elapsed:.1f} s): ranks {pending} "
                f"had not finished and were killed (finished: {finished})."
            )
        if self._threads_at_fork:
            parts.append(
                f"Note: the parent had threads {self._threads_at_fork} running when it forked "
                f"the ranks; a lock one of them held stays locked in every rank."
            )
        for rank in pending:
            if stacks.get(rank):
                parts.append(f"Stacks of rank {rank} when killed:\n{stacks[rank].rstrip()}")
        self.fail("\n\n".join(parts))

    # ------------------------------------------------------------------ child
    def _run_rank(self, rank: int, pipe: Any, stack_path: str) -> None:
        """Body of a forked child: run the test as ``rank`` and report."""
        # The parent's objects (torch's and pytest's: ~300k) move to GC's permanent generation:
        # a full collection in the rank would otherwise walk them all and copy every page they
        # sit on (0.25 s of CPU measured for one gc.collect() in such a child).
        gc.freeze()
        self.rank = rank
        self.processes, self._pipes = [], []
        torch.set_num_threads(1)
        _install_stack_dump(stack_path)
        set_rng_seed()
        try:
            getattr(self, self._testMethodName)()
            result = RankResult("ok")
        except unittest.SkipTest as exc:
            result = RankResult("skip", str(exc) or "skipped")
        except SystemExit as exc:
            result = _result_for_exit_code(exc.code)
        except BaseException:  # noqa: BLE001 - the rank's result carries it
            result = RankResult("error", traceback.format_exc())
        # Only a rank that passed tears down: after a failure peers may be stuck
        # in collectives and destroying could hang; os._exit reclaims everything.
        if result.status == "ok" and self.destroy_pg_upon_exit:
            failure = _destroy_leftover_process_groups()
            if failure:
                result = RankResult("error", failure)
        exit_code = {"ok": 0, "skip": self.SKIP_EXIT_CODE}.get(
            result.status, self.TEST_ERROR_EXIT_CODE
        )
        try:
            pipe.send(result)
            pipe.close()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - nothing sensible left to do
                    pass
            os._exit(exit_code)


def _result_for_exit_code(code: Any) -> RankResult:
    if code is None or code == 0:
        return RankResult("ok")
    if isinstance(code, int) and code in SKIP_EXIT_CODES:
        return RankResult("skip", SKIP_EXIT_CODES[code])
    return RankResult("error", f"test called sys.exit({code!r})")


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _trim_stacks(text: str) -> str:
    """Drop the frames below ``_run_rank`` (the parent's stack, inherited by fork)."""
    kept: list[str] = []
    skipping = False
    for line in text.splitlines():
        if not line.startswith(" "):  # a thread header or blank line
            skipping = False
        elif skipping:
            continue
        kept.append(line)
        if " in _run_rank" in line:
            skipping = True
    trimmed = "\n".join(kept)
    if len(trimmed) > _MAX_STACK_CHARS:
        trimmed = trimmed[:_MAX_STACK_CHARS] + "\n..."
    return trimmed


def _install_stack_dump(path: str) -> None:
    """Make ``SIGUSR1`` write all thread stacks of this process to ``path``."""
    global _stack_file
    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        _stack_file = open(path, "w")  # must outlive this function
        faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError):
        _stack_file = None


def _destroy_leftover_process_groups() -> str | None:
    """Destroy the default group of pyc10d (and the module under test) if still up.

    Only modules the test already imported are considered, so a test that never
    touched pyc10d does not import it here. Returns a description of an
    unexpected failure; ``ValueError``/``AssertionError`` (nothing left to
    destroy) are ignored, as torch's harness does.
    """
    for name in dict.fromkeys(["pyc10d", dist_module_name()]):
        module = sys.modules.get(name)
        if module is None or not hasattr(module, "destroy_process_group"):
            continue
        try:
            is_initialized = getattr(module, "is_initialized", lambda: True)
            if is_initialized():
                module.destroy_process_group()
        except (ValueError, AssertionError):
            pass
        except Exception:  # noqa: BLE001 - reported as this rank's failure
            return f"destroy_process_group() of {name} failed after the test:\n" + (
                traceback.format_exc()
            )
    return None
