"""No pyc10d thread inside torch when the interpreter finalizes (``pyc10d.threads``).

A daemon thread inside a torch operation at finalization aborts the process ("terminate called
without an active exception", exit code 134). The first test holds a dropped group's shutdown
open in torch on its release thread while the main thread returns: with the exit's wait cut
to nothing (``PYC10D_EXIT_TIMEOUT=0``, what the code did before) the process aborts, which
proves the race real; as shipped it exits 0 after the shutdown finished. The others run
programs that end right after their last collective (``tests/_exit_rank.py``): 8 ranks as
threads, and 2 launched ranks on shm, tcp and the plugin with a group dropped on a daemon
thread just before the exit; ``PYC10D_EXIT_TRIALS`` runs each that many times
(``make exit-trials``: 50).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _clock import bound

from pyc10d import settings, threads
from pyc10d.bench.launch import free_port

HERE = Path(__file__).parent
REPO = HERE.parent
TRIALS = settings.EXIT_TRIALS.get()
pytestmark = [pytest.mark.interpreters, pytest.mark.timeout(50 * TRIALS)]

HELD = """
import sys, time
from datetime import timedelta
import torch
import pyc10d
from pyc10d import threads
from pyc10d.process_group import ProcessGroup, make_engine

engine = make_engine("tcp", pyc10d.HashStore(), 0, 1, timedelta(seconds=10), "held")
shutdown = engine.shutdown

def held_shutdown():  # the dropped group's shutdown, held open inside torch
    a = torch.ones(1 << 21)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        a.add_(1)
    shutdown()
    print("shutdown finished", flush=True)

engine.shutdown = held_shutdown
holder = [ProcessGroup(0, 1, engine=engine, group_name="held")]
del engine
t = torch.ones(4)
holder[0].allreduce([t]).wait()
assert t.tolist() == [1.0] * 4
threads.start(holder.clear, "pyc10d-test-drop")  # the last reference goes on a pyc10d thread
time.sleep(0.05)  # the release thread is inside torch now
print("main returns", flush=True)
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def _python(args: list[str], timeout: float = 45, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], env=_env(**extra), capture_output=True, text=True,
                          timeout=timeout, cwd=HERE)


def test_exit_waits_for_a_release_held_in_torch(tmp_path: Path) -> None:
    script = tmp_path / "held.py"
    script.write_text(HELD)
    cut = _python([str(script)], PYC10D_EXIT_TIMEOUT="0")
    assert cut.returncode == -6 or cut.returncode == 134, (cut.returncode, cut.stderr[-2000:])
    assert "terminate called" in cut.stderr and "shutdown finished" not in cut.stdout
    assert "thread pyc10d-release still running at exit" in cut.stderr
    ok = _python([str(script)])
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.split() == "main returns shutdown finished".split()


def test_eight_rank_threads_exit_at_once() -> None:
    for trial in range(TRIALS):
        res = _python(["_exit_rank.py", "threaded"])
        assert res.returncode == 0, (trial, res.returncode, res.stderr[-3000:])


@pytest.mark.parametrize("backend", [  # make test: shm natively, tcp through the plugin
    "shm", pytest.param("tcp", marks=pytest.mark.full), pytest.param("pyc10d_shm", marks=pytest.mark.full),
    "pyc10d_tcp"])
def test_launched_ranks_exit_at_once_after_a_drop(backend: str) -> None:
    start = settings.EXIT_START.get()
    for trial in range(TRIALS):
        res = _python(["-m", "pyc10d.run", "--nproc-per-node", "2", "--start-method", start,
                       "--master-port", str(free_port()), "_exit_rank.py", backend],
                      OMP_NUM_THREADS="1")
        assert res.returncode == 0, (trial, res.returncode, res.stderr[-3000:])


def test_exit_join_is_bounded_and_names_the_late() -> None:
    """``join`` gives up at its deadline and names what is still running."""
    release = threading.Event()
    t = threads.start(release.wait, "pyc10d-test-late")
    try:
        t0 = time.monotonic()
        late = threads.join(time.monotonic() + 0.2)
        assert 0.15 < time.monotonic() - t0 < bound(5.0)
        assert t in late and t in threads.running()
    finally:
        release.set()
        t.join(5)
    assert t not in threads.running()


def test_thread_names_are_pyc10d_names() -> None:
    with pytest.raises(ValueError, match="start with 'pyc10d-'"):
        threads.start(lambda: None, "worker")


# A forked child whose parent had set torch's thread count: each thread's first parallel op
# asks torch for the intra-op pool, which torch replaces after a fork; asked by 8 threads at
# once, the replacement handed some of them no pool ("Invalid thread pool!"; 36 of 40 forks
# without settle_torch_pool here, measured 2026-11-28).
POOL_RACE = r"""
import os, sys, threading, torch
from pyc10d.testing.threaded import ThreadedRun
torch.set_num_threads(2)
torch.arange(100000).sum()
failed = 0
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        run, together = ThreadedRun(8, timeout=30), threading.Barrier(8)
        run.start(lambda rank: (together.wait(), torch.arange(4, dtype=torch.int).view(2, 2)))
        try:
            run.join()
        except RuntimeError as e:
            print(e, file=sys.stderr)
            os._exit(1)
        os._exit(0)
    failed += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0
print("failed", failed)
"""


@pytest.mark.timeout(50)
def test_rank_threads_in_a_forked_child_all_get_torchs_pool() -> None:
    """8 rank threads of a ``ThreadedRun`` in each of 20 forked children (a rank that
    ``run_fork`` forked runs a threaded example so): every thread's first op gets a pool."""
    out = subprocess.run([sys.executable, "-c", POOL_RACE], capture_output=True, text=True, timeout=45)
    assert out.returncode == 0 and out.stdout.split() == ["failed", "0"], out.stdout + out.stderr[-3000:]


@pytest.mark.timeout(30)
def test_a_child_forked_while_a_thread_held_a_module_lock_starts_threads() -> None:
    """A member forked from a process whose pyc10d threads were starting threads (a pytest
    worker) waited for good at its first ``threads.start``: the lock it takes was held at the
    fork by a thread the child does not have. Every module-level lock is renewed in a child."""
    from pyc10d import tls
    from pyc10d.functional import _buffers
    from pyc10d.transport import threaded
    from pyc10d.transport.shm import segment

    held = [threads._lock, tls._CACHE_LOCK, _buffers._lock, threaded._registry_lock, segment._registry_lock]
    for lock in held:
        lock.acquire()  # (as another thread of this process would hold it, at the fork)
    try:
        pid = os.fork()
        if pid == 0:  # the child: each lock once more, and a thread started
            code = 1
            try:
                fresh = [threads._lock, tls._CACHE_LOCK, _buffers._lock, threaded._registry_lock,
                         segment._registry_lock]
                free = [lock.acquire(timeout=2) for lock in fresh]
                for lock, got in zip(fresh, free):
                    if got:
                        lock.release()
                if all(free):
                    done = threading.Event()
                    threads.start(done.set, "pyc10d-test-forked", join_at_exit=False)
                    code = 0 if done.wait(5) else 3
                else:
                    code = 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 20
        while (res := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        if res == (0, 0):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child is stuck on a lock held at the fork")
        assert os.waitstatus_to_exitcode(res[1]) == 0, res
    finally:
        for lock in held:
            lock.release()
