"""``ProcessGroupPyc10d`` beyond torchft's own tests: what torchft relies on from it.

Ranks are threads, groups are made and reconfigured through torchft's
``reconfigure_with_store`` as torchft's tests make them. Checked: an ``abort`` from another
thread releases a collective blocked on a peer that never comes (torchft's reason to run Gloo
in a subprocess), ``shutdown`` tells the peers at once while the group is still referenced,
``set_timeout`` applies to the live group, ``errored`` names the failure as an abort, and a
reconfiguration shuts the previous group down.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import torch
from _clock import bound

pytest.importorskip("torchft", reason="torchft-nightly (the test extra) is not installed")

from torch._C._distributed_c10d import AllreduceOptions
from torch.distributed import TCPStore
from torchft.process_group import reconfigure_with_store

from pyc10d.integrations.torchft import ProcessGroupPyc10d

pytestmark = [pytest.mark.timeout(40), pytest.mark.xdist_group("torchft")]

BACKENDS = ["pyc10d_shm", "pyc10d_tcp"]


def _on_ranks(world: int, body: Callable[[int, ProcessGroupPyc10d], Any], backend: str,
              timeout_s: float = 10.0) -> list[Any]:
    """``body(rank, pg)`` on ``world`` threads, each with a group of ``world`` ranks."""
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)

    def rank_main(rank: int) -> Any:
        pg = ProcessGroupPyc10d(timeout=timedelta(seconds=timeout_s), backend=backend)
        reconfigure_with_store(pg, f"localhost:{store.port}/g", rank, world)
        try:
            return body(rank, pg)
        finally:
            pg.shutdown()

    with ThreadPoolExecutor(world) as ex:
        return list(ex.map(rank_main, range(world)))


def _allreduce(pg: ProcessGroupPyc10d, value: float = 1.0) -> torch.Tensor:
    t = torch.full((4,), value)
    pg.allreduce([t], AllreduceOptions()).wait()
    return t


def _failing(fn: Callable[[], Any]) -> tuple[float, BaseException]:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        fn()
    return time.monotonic() - t0, info.value


@pytest.mark.parametrize("backend", BACKENDS)
def test_abort_from_another_thread_releases_a_blocked_collective(backend: str) -> None:
    """Rank 1 never joins; rank 0's all_reduce (60 s timeout) is released by an abort from a
    watchdog thread at once (0.3 s), well before the timeout, and ``errored`` then answers an
    "aborted" error."""
    joined = threading.Event()
    timeout_s = 60

    def body(rank: int, pg: ProcessGroupPyc10d) -> Any:
        _allreduce(pg)
        if rank == 1:
            joined.wait(timeout_s)
            return None
        threading.Timer(0.3, pg.abort).start()
        took, error = _failing(lambda: _allreduce(pg))
        joined.set()
        return took, error, pg.errored()

    (took, error, errored), _ = _on_ranks(2, body, backend, timeout_s=timeout_s)
    # released by the abort, not the timeout: a third of it, far above a 3x slower machine's time
    assert took < timeout_s / 3, f"abort released the collective after {took:.2f} s (group timeout 60 s)"
    assert "aborted" in str(error)
    assert isinstance(errored, RuntimeError) and "aborted" in str(errored)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shutdown_tells_the_peers_at_once(backend: str) -> None:
    """Rank 2 shuts its group down while its wrapper (and the group) stay referenced: the
    others' next all_reduce fails with "Connection closed by peer" well before the 30 s
    timeout, and their ``errored`` says the group aborted."""
    timeout_s = 30
    failed = [threading.Event(), threading.Event()]

    def body(rank: int, pg: ProcessGroupPyc10d) -> Any:
        assert _allreduce(pg).tolist() == [3.0] * 4
        if rank == 2:
            held = pg._pg
            pg.shutdown()
            for e in failed:  # ``held`` keeps the group alive past the peers' failure
                e.wait(timeout_s)
            return held
        try:
            took, error = _failing(lambda: _allreduce(pg))
        finally:
            failed[rank].set()
        return took, error, pg.errored()

    results = _on_ranks(3, body, backend, timeout_s=timeout_s)
    for took, error, errored in results[:2]:
        # told by the shutdown (the group is held until they failed), not by the timeout: a
        # third of it, far above a 3x slower machine's time
        assert took < timeout_s / 3, f"the peers learnt of the shutdown after {took:.2f} s"
        assert "Connection closed by peer" in str(error) and "rank 2" in str(error)
        assert "aborted" in str(errored)


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_timeout_applies_to_the_live_group(backend: str) -> None:
    """A group made with a 30 s timeout and set to 0.5 s: a collective rank 1 never joins
    times out in about 0.5 s, with torch's "Timed out"."""
    done = threading.Event()

    def body(rank: int, pg: ProcessGroupPyc10d) -> Any:
        _allreduce(pg)
        if rank == 1:
            done.wait(20)
            return None
        pg.set_timeout(timedelta(seconds=0.5))
        took, error = _failing(lambda: _allreduce(pg))
        done.set()
        return took, error

    (took, error), _ = _on_ranks(2, body, backend, timeout_s=30)
    assert 0.4 < took < 0.5 + bound(2.5), took  # at the 0.5 s set, not the 30 s made with
    assert "Timed out" in str(error)


def test_reconfigure_shuts_the_previous_group_down() -> None:
    """Each reconfiguration makes a new group (new rank numbering allowed) and shuts the old
    one down: its engine is closed, and the new group works."""
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)

    def rank_main(rank: int) -> Any:
        pg = ProcessGroupPyc10d(timeout=timedelta(seconds=10), backend="pyc10d_tcp")
        reconfigure_with_store(pg, f"localhost:{store.port}/q1", rank, 2)
        first = pg._pg
        _allreduce(pg)
        reconfigure_with_store(pg, f"localhost:{store.port}/q2", 1 - rank, 2)
        second = pg._pg
        total = _allreduce(pg, 2.0)
        pg.shutdown()
        return first, second, total

    with ThreadPoolExecutor(2) as ex:
        for first, second, total in ex.map(rank_main, range(2)):
            assert first is not second
            assert first.engine._closed and second.engine._closed
            assert total.tolist() == [4.0] * 4
            assert pg_name(first) != pg_name(second)


def pg_name(pg: Any) -> str:
    return pg.engine.group_name


def test_backend_name_and_choice() -> None:
    assert ProcessGroupPyc10d().getBackendName() == "torchft-pyc10d"
    assert ProcessGroupPyc10d(backend="pyc10d_tcp").getBackendName() == "torchft-pyc10d_tcp"
    with pytest.raises(ValueError, match="unknown backend 'gloo'"):
        ProcessGroupPyc10d(backend="gloo")


def _fork_and_collect(refs: list[weakref.ref]) -> int:
    """Fork; the child collects at once and exits 0 if the objects of ``refs`` are still
    there, else 4. The child's wait status."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            gc.enable()
            gc.collect()
            code = 0 if all(r() is not None for r in refs) else 4
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


@pytest.mark.timeout(40)
def test_a_forked_child_survives_groups_left_in_cycles() -> None:
    """Ranks as threads leave their groups in reference cycles (as a caught exception's
    traceback does), live, each hosting torchft's master TCPStore; the process forks and the
    child collects. It must not destroy them: the store's destructor joins a server thread
    the child does not have, and the child died of SIGSEGV (``backends.lifetime``)."""
    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)

    def rank_main(rank: int) -> weakref.ref:
        pg = ProcessGroupPyc10d(timeout=timedelta(seconds=10), backend="pyc10d_shm")
        reconfigure_with_store(pg, f"localhost:{store.port}/fork", rank, 2)
        assert _allreduce(pg).tolist() == [2.0] * 4
        pg._cycle = pg  # type: ignore[attr-defined]
        return weakref.ref(pg)

    gc.collect()  # earlier tests' garbage (their torch stores included) is not this test's
    gc.disable()  # the cycles must still be there at the fork
    try:
        with ThreadPoolExecutor(2) as ex:
            refs = list(ex.map(rank_main, range(2)))
        assert all(r() is not None for r in refs)
        status = _fork_and_collect(refs)
    finally:
        gc.enable()
        gc.collect()  # here, in the process that made them, they shut down
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        f"the child died of signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
        else f"the child exited with {os.WEXITSTATUS(status)} (4: it destroyed the groups)")
    assert all(r() is None for r in refs)
