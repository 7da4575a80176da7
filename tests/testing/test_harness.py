"""Behaviour of the test harness in :mod:`pyc10d.testing` (no collectives involved).

Each check runs a small ``MultiProcessTestCase`` through :mod:`unittest`
in-process and inspects the outcome: which ranks ran, how a failing, hanging or
crashing rank is reported, and how skips propagate.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import types
import unittest
from pathlib import Path
from unittest import mock

import pytest
import torch
from _clock import bound

from pyc10d.testing import (
    MultiProcessTestCase,
    TestCase,
    simple_sparse_reduce_tests,
    skip_if_lt_x_gpu,
)

pytestmark = pytest.mark.timeout(60)


class _Harness(MultiProcessTestCase):
    __test__ = False  # run only through _run() below

    out_dir = ""

    @property
    def world_size(self) -> int:
        return 3

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def _record(self, what: str) -> None:
        Path(self.out_dir, f"{what}.{self.rank}").write_text(f"{os.getpid()} {self.file_name}")

    def test_ok(self) -> None:
        self._record("ok")

    def test_one_rank_fails(self) -> None:
        if self.rank == 1:
            raise ValueError("boom from rank 1")

    def test_one_rank_hangs(self) -> None:
        if self.rank == 2:
            time.sleep(1000)

    def test_fail_while_peers_stuck(self) -> None:
        if self.rank == 0:
            raise RuntimeError("rank 0 gave up")
        time.sleep(1000)

    def test_one_rank_crashes(self) -> None:
        if self.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    def test_all_skip(self) -> None:
        raise unittest.SkipTest("no widgets here")

    def test_exit_with_skip_code(self) -> None:
        sys.exit(77)

    @skip_if_lt_x_gpu(1024)
    def test_needs_gpus(self) -> None:
        self._record("needs_gpus")


class _NoSpawn(MultiProcessTestCase):
    __test__ = False

    def test_nothing(self) -> None:
        pass


class _ShortTimeout(_Harness):
    __test__ = False
    timeout = 2.0


class _ShortGrace(_Harness):
    __test__ = False
    failure_grace_period = 1.0


def _run(case: type[unittest.TestCase], name: str, out_dir: Path) -> unittest.TestResult:
    case.out_dir = str(out_dir)  # type: ignore[attr-defined]
    result = unittest.TestResult()
    case(name).run(result)
    return result


def _only_failure(result: unittest.TestResult) -> str:
    assert not result.errors, result.errors
    assert len(result.failures) == 1, result.failures
    return result.failures[0][1]


def test_every_rank_runs_in_its_own_process(tmp_path: Path) -> None:
    result = _run(_Harness, "test_ok", tmp_path)
    assert result.wasSuccessful(), result.failures + result.errors
    records = {p.name: p.read_text().split() for p in tmp_path.iterdir()}
    assert sorted(records) == ["ok.0", "ok.1", "ok.2"]
    pids = {pid for pid, _ in records.values()}
    assert len(pids) == 3 and str(os.getpid()) not in pids
    file_names = {name for _, name in records.values()}
    assert len(file_names) == 1
    assert not os.path.exists(file_names.pop()), "file_name must be removed after the test"


def test_failing_rank_fails_the_test_naming_the_rank(tmp_path: Path) -> None:
    message = _only_failure(_run(_Harness, "test_one_rank_fails", tmp_path))
    assert "Rank 1 failed" in message
    assert "ValueError: boom from rank 1" in message
    assert "Rank 0 failed" not in message and "Rank 2 failed" not in message


def test_hanging_rank_is_killed_at_the_timeout(tmp_path: Path) -> None:
    start = time.monotonic()
    message = _only_failure(_run(_ShortTimeout, "test_one_rank_hangs", tmp_path))
    assert time.monotonic() - start < _ShortTimeout.timeout + bound(13)  # at its 2 s, not the hang's 1000 s
    assert "timed out after 2 s" in message
    assert "ranks [2] had not finished" in message
    assert "Stacks of rank 2" in message and "test_one_rank_hangs" in message


def test_timeout_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYC10D_TEST_TIMEOUT", "1.5")
    start = time.monotonic()
    message = _only_failure(_run(_Harness, "test_one_rank_hangs", tmp_path))
    assert time.monotonic() - start < 1.5 + bound(13.5)  # at its 1.5 s, not the hang's 1000 s
    assert "timed out after 1.5 s" in message


def test_failure_does_not_wait_for_stuck_peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYC10D_TEST_TIMEOUT", "60")
    start = time.monotonic()
    message = _only_failure(_run(_ShortGrace, "test_fail_while_peers_stuck", tmp_path))
    # after the 1 s grace, well before the timeout: a third of it, far above a 3x slower machine's time
    assert time.monotonic() - start < 60 / 3, "must not wait for the 60 s timeout"
    assert "Rank 0 failed" in message and "rank 0 gave up" in message
    assert "Ranks [1, 2] were still running" in message
    assert "Stacks of rank 1" in message and "Stacks of rank 2" in message


def test_crashed_rank_is_reported(tmp_path: Path) -> None:
    message = _only_failure(_run(_Harness, "test_one_rank_crashes", tmp_path))
    assert "Rank 1 failed" in message and "SIGKILL" in message


def test_skip_in_every_rank_skips_the_test(tmp_path: Path) -> None:
    result = _run(_Harness, "test_all_skip", tmp_path)
    assert not result.failures and not result.errors
    assert [reason for _, reason in result.skipped] == ["no widgets here"]


def test_skip_exit_code_skips_the_test(tmp_path: Path) -> None:
    result = _run(_Harness, "test_exit_with_skip_code", tmp_path)
    assert [reason for _, reason in result.skipped] == ["Need at least 2 CUDA devices"]


def test_skip_decorator_skips_before_forking(tmp_path: Path) -> None:
    result = _run(_Harness, "test_needs_gpus", tmp_path)
    assert [reason for _, reason in result.skipped] == ["Need at least 1024 CUDA devices"]
    assert not list(tmp_path.iterdir()), "no rank should have run"


def test_missing_spawn_is_an_error(tmp_path: Path) -> None:
    message = _only_failure(_run(_NoSpawn, "test_nothing", tmp_path))
    assert "_spawn_processes" in message


def _fake_dist(monkeypatch: pytest.MonkeyPatch, out_dir: Path, fail: bool) -> None:
    """Install a module standing in for the dist module, with a group to destroy."""
    fake = types.ModuleType("_pyc10d_fake_dist")

    def destroy_process_group() -> None:
        if fail:
            raise RuntimeError("cannot tear down")
        Path(out_dir, f"destroyed.{os.getpid()}").write_text("")

    fake.is_initialized = lambda: True  # type: ignore[attr-defined]
    fake.destroy_process_group = destroy_process_group  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setenv("PYC10D_TESTING_DIST", fake.__name__)


def test_leftover_process_group_is_destroyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_dist(monkeypatch, tmp_path, fail=False)
    result = _run(_Harness, "test_ok", tmp_path)
    assert result.wasSuccessful(), result.failures + result.errors
    assert len(list(tmp_path.glob("destroyed.*"))) == 3


def test_failing_destroy_fails_the_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_dist(monkeypatch, tmp_path, fail=True)
    message = _only_failure(_run(_Harness, "test_ok", tmp_path))
    assert "destroy_process_group() of _pyc10d_fake_dist failed" in message
    assert "cannot tear down" in message


class AssertEqualTest(TestCase):
    """The tensor-aware assertEqual used by every ported test."""

    def test_tensors_and_nesting(self) -> None:
        self.assertEqual(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]))
        self.assertEqual(
            [[torch.tensor([1])], (torch.tensor([2]),)], [[torch.tensor([1])], [torch.tensor([2])]]
        )
        self.assertEqual(torch.tensor([3]), 3)
        self.assertEqual(0, torch.tensor([]).numel())
        with self.assertRaises(AssertionError):
            self.assertEqual(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))
        with self.assertRaises(AssertionError):
            self.assertEqual([torch.tensor([1])], [torch.tensor([1]), torch.tensor([2])])
        self.assertNotEqual([torch.zeros(2)], [torch.ones(2)])

    def test_identical_tensors_skip_assert_close_and_nothing_else_does(self) -> None:
        # The fast path (identical dense tensors, equal ints) must not let a difference
        # through: with assert_close made to fail everything, only identical pairs pass.
        def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError("assert_close was asked")

        with mock.patch.object(torch.testing, "assert_close", refuse):
            self.assertEqual(torch.tensor([3, 4]), torch.tensor([3, 4]))
            self.assertEqual(7, 7)
            for first, second in [
                (torch.tensor([3]), torch.tensor([4])),
                (torch.tensor([3]), torch.tensor([3.0])),
                (torch.ones(2), torch.ones(3)),
                (torch.tensor([float("nan")]), torch.tensor([float("nan")])),
                (1.5, 1.5),
                (True, 1),
                (torch.empty(2, device="meta"), torch.empty(2, device="meta")),
            ]:
                with self.assertRaisesRegex(AssertionError, "assert_close was asked"):
                    self.assertEqual(first, second)
        self.assertEqual(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
        self.assertEqual(torch.empty(2, device="meta"), torch.empty(2, device="meta"))
        with self.assertRaises(AssertionError):
            self.assertEqual(torch.tensor([3]), torch.tensor([4]))

    def test_message(self) -> None:
        with self.assertRaisesRegex(AssertionError, "Mismatch in iteration 7"):
            self.assertEqual(torch.tensor([1]), torch.tensor([2]), msg="Mismatch in iteration 7")
        with self.assertRaisesRegex(AssertionError, "^custom: "):
            self.assertEqual(1, 2, msg=lambda generated: f"custom: {generated}")

    def test_sparse(self) -> None:
        for inputs, outputs in simple_sparse_reduce_tests(rank=1, world_size=3, num_inputs=2):
            self.assertEqual(len(inputs), 2)
            dense_total = outputs[0].to_dense()
            # Rank r of n sets entries 0..r on the first axis: entry i appears (n - i) times.
            n = dense_total.shape[0]
            expected_first_axis = torch.tensor([float(n - i) for i in range(n)])
            reduced = dense_total.reshape(n, -1)[:, 0] if dense_total.dim() > 1 else dense_total
            self.assertEqual(reduced, expected_first_axis)
            self.assertEqual(outputs[0], outputs[1])


@pytest.mark.timeout(40)
@pytest.mark.parametrize("workers", ["0", pytest.param("1", marks=pytest.mark.full)])
def test_a_peer_run_beside_is_named_and_its_abort_counted_not_failed(tmp_path: Path, workers: str) -> None:
    """A peer's run reported with ``reruns.beside`` (the Slurm tests' Gloo reference) leaves its
    test passing, is printed under "peers beside", and a peer's abort is counted in pytest's
    closing line, in one process and through an xdist worker alike."""
    import subprocess

    tests_dir = Path(__file__).resolve().parents[1]
    (tmp_path / "conftest.py").write_text(  # the suite's two hooks, loaded under another name
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(tests_dir / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "pytest_runtest_makereport = suite.pytest_runtest_makereport\n"
        "pytest_terminal_summary = suite.pytest_terminal_summary\n")
    (tmp_path / "test_peer.py").write_text(
        "from pyc10d.testing import reruns\n\n"
        "def test_ours_then_the_peer():\n"
        "    reruns.beside('peer.py on gloo', 'equal to the reference (exit 134, a rank aborted at exit)', aborted=True)\n\n"
        "def test_a_clean_peer():\n"
        "    reruns.beside('other.py on gloo', 'equal to the reference (exit 0)')\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", workers, "-q",
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=35)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "peers beside" in out, out
    assert "peer.py on gloo: equal to the reference (exit 134, a rank aborted at exit)" in out, out
    assert "other.py on gloo: equal to the reference (exit 0)" in out, out
    closing = out.strip().splitlines()[-1]
    assert "2 passed" in closing and "1 peer aborts" in closing, closing
