"""torchrun's elastic restarts on pyc10d's backends, through torch.distributed.

torchrun's agent serves the workers' store and hands every restarted attempt the same one,
the failed attempt's keys still in it (and ``TORCHELASTIC_RESTART_COUNT`` is counted by each
agent, unchanged when membership changes). Rank 1 exits with code 3 after the first attempt's
all_reduce; the agent restarts both workers, and the second attempt must form a new group and
reduce correctly (``pyc10d.store.attempt`` is what makes each forming meet under keys of its
own). Before it, every restarted attempt died in ``init_process_group``. No
``/dev/shm/pyc10d_*`` segment of the job may be left behind.

Launchers: ``forked`` (``make test``) runs the job's attempts as processes forked from this
one, with the variables torchrun sets and a torch ``TCPStore`` server standing in for the
agent's, kept across attempts as the agent keeps its own: seconds, where a real torchrun job
imports torch in five fresh interpreters. ``standalone`` and ``c10d`` are torch's own
``torchrun`` (``python -m torch.distributed.run``), ``--standalone`` and
``--rdzv-backend=c10d``, in ``make test-full``. Gloo runs the same jobs beside pyc10d's,
recorded rather than judged: bounded, its outcome printed and kept as the test's ``gloo``
property.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import _elastic_rank
import pytest
import torch.distributed as tdist

from pyc10d.transport.shm import segment

pytestmark = pytest.mark.interpreters  # starts Python interpreters: see conftest.py

WORKER = str(Path(__file__).resolve().parents[1] / "_elastic_rank.py")
Records = dict[tuple[int, int, int], dict]
#: A real torchrun job starts five interpreters, each importing torch: 5 CPU-seconds apiece
#: here, 10-20 s of wall time under the load of a 2-core machine shared with a test suite,
#: so a job with a restart takes 30-70 s. Bounded at 120 s, killed past it (Gloo's hang).
TORCHRUN_BOUND = 120.0
TORCHRUN = [pytest.mark.full, pytest.mark.timeout(TORCHRUN_BOUND + 30)]
FORKED = [pytest.mark.timeout(30)]  # (a timeout mark per case: the function's would win over them)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _leaked(out: Path) -> list[str]:
    """The ``/dev/shm`` segments that the job's workers created and left (a segment's name
    holds its creator's pid; other jobs on this machine have segments of their own)."""
    return segment.created_by(*(int(p.name[len("pid-"):]) for p in out.glob("pid-*")))


def _records(out: Path) -> Records:
    return {(r["attempt"], r["world"], r["rank"]): r
            for r in (json.loads(p.read_text()) for p in out.glob("*.json"))}


def _sum(world: int) -> list[float]:
    return [float(world * (world + 1) // 2)] * 5


# -- torch's torchrun ----------------------------------------------------------------------
def _torchrun(rdzv: str, endpoint: str, *args: str) -> list[str]:
    """``--monitor-interval=0.1``: the agent notices a dead worker or a waiting node at once."""
    if rdzv == "standalone":
        where = ["--standalone"]
    else:
        where = ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=pyc10d-elastic",
                 "--rdzv-conf=last_call_timeout=1"]
    return [sys.executable, "-m", "torch.distributed.run", "--monitor-interval=0.1", *where, *args]


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=_env())


def _workers_of(out: Path) -> list[int]:
    """The pids of the job's workers still running (their command line names ``out``):
    torchrun starts each in a session of its own, so ending the agent does not end them."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if WORKER.encode() in argv and str(out).encode() in argv:
            pids.append(int(proc.name))
    return pids


def _finish(procs: list[subprocess.Popen], out: Path, deadline: float) -> list[int | None]:
    """Each launcher's exit status by ``deadline``; None for one still running then, which
    is killed, with every worker of the job."""
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for pid in _workers_of(out):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return codes


def _torchrun_restart(rdzv: str, backend: str, out: Path, bound: float) -> tuple[int | None, str, float]:
    log = out.parent / f"{out.name}.log"
    t0 = time.monotonic()
    proc = _start(_torchrun(rdzv, f"127.0.0.1:{_free_port()}", "--nnodes=1", "--nproc-per-node=2",
                            "--max-restarts=2", WORKER, backend, str(out), "exit"), log)
    [code] = _finish([proc], out, t0 + bound)
    return code, log.read_text(), time.monotonic() - t0


# -- the forked stand-in -------------------------------------------------------------------------
def _forked_worker(env: dict[str, str], backend: str, out: str, mode: str) -> None:
    os.environ.update(env)
    _elastic_rank.main(backend, Path(out), mode)


def _forked_attempt(port: int, backend: str, out: Path, mode: str, attempt: int, world: int,
                    stop_after: float = 30, until: Callable[[], bool] | None = None) -> list[int | None]:
    """One attempt of ``world`` forked workers on the agent's store at ``port``; their exit
    codes (None: still running after ``stop_after`` seconds, or once ``until()`` holds, and
    terminated as torchrun's agent does: SIGTERM)."""
    ctx = multiprocessing.get_context("fork")
    procs = []
    for rank in range(world):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": str(attempt),
               "TORCHELASTIC_RUN_ID": "pyc10d-elastic"}
        p = ctx.Process(target=_forked_worker, args=(env, backend, str(out), mode), daemon=True)
        p.start()
        procs.append(p)
    deadline = time.monotonic() + stop_after
    for p in procs:
        while p.is_alive() and time.monotonic() < deadline and not (until is not None and until()):
            p.join(0.05)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    return codes


def _forked_restart(backend: str, out: Path) -> tuple[int | None, str, float]:
    t0 = time.monotonic()
    server = tdist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    first = _forked_attempt(server.port, backend, out, "exit", 0, 2, stop_after=10)
    second = _forked_attempt(server.port, backend, out, "exit", 1, 2, stop_after=12)
    code = 0 if second == [0, 0] else 1
    return code, f"attempt 0 exit codes {first}, attempt 1 exit codes {second}", time.monotonic() - t0


# -- the tests ---------------------------------------------------------------------------------
# make test: the forked stand-in on pyc10d's three backends; torchrun itself, and Gloo, in
# make test-full.
@pytest.mark.parametrize("launcher", [pytest.param("forked", marks=FORKED), pytest.param("standalone", marks=TORCHRUN),
                                      pytest.param("c10d", marks=TORCHRUN)])
@pytest.mark.parametrize("backend", ["pyc10d", "pyc10d_shm", "pyc10d_tcp",
                                     pytest.param("gloo", marks=pytest.mark.full)])
def test_a_restarted_attempt_forms_a_new_group(backend: str, launcher: str, tmp_path: Path,
                                               record_property: Callable[[str, object], None]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    if launcher == "forked":
        code, log, took = _forked_restart(backend, out)
    else:
        code, log, took = _torchrun_restart(launcher, backend, out, TORCHRUN_BOUND)
    records = _records(out)
    if backend == "gloo":
        _record_gloo(launcher, code, took, records, log, record_property)
        return
    assert code == 0, f"the job ended {code} after {took:.0f}s; records {sorted(records)}\n{log[-6000:]}"
    # attempt 0 reduced, rank 1 died, the survivor failed; attempt 1 formed a new group
    assert sorted(records) == [(0, 2, 0), (0, 2, 1), (1, 2, 0), (1, 2, 1)], log[-6000:]
    assert all(r["sum"] == _sum(2) for r in records.values()), records
    assert list(out.glob("pid-*")) and not _leaked(out), f"left in /dev/shm: {_leaked(out)}"


def _record_gloo(launcher: str, code: int | None, took: float, records: Records, log: str,
                 record_property: Callable[[str, object], None]) -> None:
    """Gloo's run of the same job, for the record, never a failure of pyc10d's. Gloo meets
    through fixed keys of the same store, so a restarted attempt can read the dead one's
    addresses ("Connection refused") or hang; bounded above, then killed."""
    reduced = sorted({a for (a, _, _) in records if {(a, 2, 0), (a, 2, 1)} <= set(records)})
    outcome = (("hung, killed" if code is None else f"ended {code}") + f" after {took:.0f}s; attempts that "
               f"reduced: {reduced}" + ("" if any(reduced) else " (no restarted one)"))
    record_property("gloo", outcome)
    print(f"gloo under {launcher} with a restart: {outcome}")
    assert 0 in reduced, f"Gloo's first attempt did not reduce either: {outcome}\n{log[-4000:]}"


@pytest.mark.parametrize("backend", [pytest.param("pyc10d", marks=FORKED), pytest.param("pyc10d_tcp", marks=FORKED)])
def test_a_grown_world_forms_a_new_group(backend: str, tmp_path: Path) -> None:
    """Another world size, the restart count unchanged, as when a node joins a running
    ``--nnodes=1:2`` job: the world of 2 is stopped (SIGTERM) and a world of 3 starts on the
    same store. (tcp's own count of joins per generation took the 3 ranks for the end of the
    world of 2's generation and the start of the next.) Forked only: with torch 2.13's shared
    agent store, torchrun's own rendezvous deadlocks there, whatever the backend: the joining
    agent waits for ``MASTER_ADDR`` under the new round's prefix, which the old rank 0 agent,
    holding its bootstrap info from round 0, never writes again."""
    out = tmp_path / "out"
    out.mkdir()
    server = tdist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    _forked_attempt(server.port, backend, out, "grow", 0, 2, stop_after=20, until=lambda: len(_records(out)) == 2)
    codes = _forked_attempt(server.port, backend, out, "grow", 0, 3)
    records = _records(out)
    assert codes == [0, 0, 0], f"the world of 3 exited {codes}; records {sorted(records)}"
    assert sorted(records) == [(0, 2, 0), (0, 2, 1), (0, 3, 0), (0, 3, 1), (0, 3, 2)], records
    assert all(r["sum"] == _sum(r["world"]) for r in records.values()), records
    assert list(out.glob("pid-*")) and not _leaked(out), f"left in /dev/shm: {_leaked(out)}"
