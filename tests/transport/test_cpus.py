"""``transport.cpus.place``: each rank of a host on CPUs of its own, once, only where it fits.

Every case runs in a forked child (placement pins the whole process) whose affinity set is
chosen first, so the cases do not depend on how many CPUs the machine has beyond two.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from _multirank import FORK, run_ranks

from pyc10d.transport import cpus

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to place ranks on")]


@pytest.fixture(autouse=True)
def _own_register(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A register of pyc10d processes of these tests' own: the suite's other workers run shm
    jobs beside them, whose lines would unplace the ranks under test at once."""
    monkeypatch.setattr(cpus, "register_path", lambda: str(tmp_path / "register"))


def _in_child(fn: Callable[[], Any], env: dict[str, str] | None = None) -> Any:
    recv, send = FORK.Pipe(duplex=False)

    def child() -> None:
        os.environ.update(env or {})
        try:
            send.send(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            send.send(("error", repr(e)))

    p = FORK.Process(target=child)
    p.start()
    status, value = recv.recv()
    p.join(10)
    assert status == "ok", value
    return value


def _two_cpus() -> list[int]:
    both = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, both)
    return both


def _place_with_a_thread_running(local_rank: int) -> tuple[list[int], list[int], list[int], Any]:
    both = _two_cpus()
    started = threading.Event()
    stop = threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), stop.wait(5)))
    worker.start()
    started.wait(5)
    mine = cpus.place(local_rank, 2)
    seen = (sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(worker.native_id)))
    again = cpus.place(1 - local_rank, 2)  # once a process: the first placement stays
    stop.set()
    worker.join()
    return both, mine, list(seen), again


@pytest.mark.parametrize("local_rank", [0, 1])
def test_each_local_rank_gets_its_own_cpu_for_every_thread(local_rank: int) -> None:
    both, mine, (main, worker), again = _in_child(lambda: _place_with_a_thread_running(local_rank))
    assert mine == [both[local_rank]]
    assert main == worker == mine, "a thread running before the placement kept the old mask"
    assert again == mine


def test_bind_none_more_ranks_than_cpus_and_ranks_already_bound_are_left_alone() -> None:
    def case(local_size: int, confine: bool) -> tuple[Any, list[int]]:
        both = _two_cpus()
        if confine:  # as mpirun or pyc10d.run --bind-to core leave a rank: one CPU of its own
            os.sched_setaffinity(0, both[:1])
        return cpus.place(0, local_size), sorted(os.sched_getaffinity(0))

    assert _in_child(lambda: case(2, False), {cpus.BIND_ENV: "none"})[0] is None
    placed, mask = _in_child(lambda: case(3, False))
    assert placed is None and len(mask) == 2
    placed, mask = _in_child(lambda: case(2, True))
    assert placed is None and len(mask) == 1


def _affinity_after_init(rank: int, world: int) -> list[int]:
    return sorted(os.sched_getaffinity(0))


def test_an_shm_world_places_its_ranks_apart() -> None:
    """Through the backend: the ranks of a 2-rank shm world each end on one CPU, not the same."""
    def run() -> list[list[int]]:
        _two_cpus()
        return run_ranks("shm", 2, _affinity_after_init, timeout=20)

    res = _in_child(run)
    assert all(len(m) == 1 for m in res) and res[0] != res[1], res
    off = _in_child(lambda: (_two_cpus(), run_ranks("shm", 2, _affinity_after_init, timeout=20))[1],
                    {cpus.BIND_ENV: "none"})
    assert all(len(m) == 2 for m in off), off


def _two_ranks_in_one_process() -> tuple[list[int], list[int], Any]:
    """Two ranks of one shm group as threads of this process (as torchft's Manager tests run
    replicas): pinning the process to the first rank's share would put both ranks on it."""
    from datetime import timedelta

    from pyc10d import HashStore
    from pyc10d.backends.shm import ShmBackend

    both = _two_cpus()
    store, engines = HashStore(), [None, None]

    def make(rank: int) -> None:
        engines[rank] = ShmBackend.create(store, rank, 2, timedelta(seconds=20), "two-in-one")

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    mask = sorted(os.sched_getaffinity(0))
    pids = engines[0].transport.pids
    for e in engines:
        e.shutdown()
    return both, mask, pids


def test_a_process_running_two_ranks_is_not_placed() -> None:
    both, mask, pids = _in_child(_two_ranks_in_one_process)
    assert pids[0] == pids[1], pids  # the case itself: one process, two ranks
    assert mask == both, "a process running two ranks was pinned to one rank's CPUs"


def _tree(tmp: Any, files: dict[str, str]) -> Any:
    for rel, text in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp


def test_cgroup_quota_v1_v2_nested_and_none(tmp_path: Any) -> None:
    """The quota is read from the process's cgroup (v1 cfs or v2 cpu.max), the smallest along
    its path; none when the files say unlimited or are missing."""
    v1 = _tree(tmp_path / "v1", {"proc": "3:cpuset:/\n2:cpu,cpuacct:/job/step\n0::/\n",
                                "cg/cpu,cpuacct/job/cpu.cfs_quota_us": "250000\n",
                                "cg/cpu,cpuacct/job/cpu.cfs_period_us": "100000\n",
                                "cg/cpu,cpuacct/job/step/cpu.cfs_quota_us": "-1\n",
                                "cg/cpu,cpuacct/job/step/cpu.cfs_period_us": "100000\n"})
    assert cpus.cpu_quota(str(v1 / "proc"), v1 / "cg") == 2.5
    v2 = _tree(tmp_path / "v2", {"proc": "0::/pod/c1\n", "cg/cgroup.controllers": "cpu\n",
                                "cg/pod/cpu.max": "150000 100000\n", "cg/pod/c1/cpu.max": "max 100000\n"})
    assert cpus.cpu_quota(str(v2 / "proc"), v2 / "cg") == 1.5
    (v2 / "cg/pod/c1/cpu.max").write_text("50000 100000\n")
    assert cpus.cpu_quota(str(v2 / "proc"), v2 / "cg") == 0.5
    free = _tree(tmp_path / "free", {"proc": "0::/\n", "cg/cgroup.controllers": "cpu\n", "cg/cpu.max": "max 100000\n"})
    assert cpus.cpu_quota(str(free / "proc"), free / "cg") is None
    assert cpus.cpu_quota(str(tmp_path / "no-such-file"), tmp_path) is None


def _usable_under(quota: float | None) -> tuple[int, int, int, bool]:
    both = _two_cpus()
    cpus._quota.cache_clear()
    cpus._quota = lambda: quota  # type: ignore[assignment]
    before = cpus.usable_cpus()
    placed = cpus.place(0, 2) is not None
    return len(both), before, cpus.usable_cpus(), placed


def test_usable_cpus_counts_the_host_not_the_placed_share_and_the_quota() -> None:
    """A placed rank's own mask is its share: ``usable_cpus`` still answers for the host (so
    "more ranks than CPUs?" stays False at 2 ranks on 2 CPUs after placement), and a quota
    below the affinity set lowers it (rounded down, at least 1)."""
    assert _in_child(lambda: _usable_under(None)) == (2, 2, 2, True)
    assert _in_child(lambda: _usable_under(1.5)) == (2, 1, 1, False)  # a quota below 2 CPUs: not placed
    assert _in_child(lambda: _usable_under(0.3)) == (2, 1, 1, False)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_others_cpus_sees_a_busy_process_that_is_not_the_jobs() -> None:
    busy = FORK.Process(target=_spin, args=(3.0,))
    busy.start()
    try:
        time.sleep(0.2)
        used = cpus.others_cpus([os.getpid()], 0.5)
    finally:
        busy.kill()
        busy.join()
    assert used is not None and used >= 0.6, used


class _Waiter:
    def __init__(self) -> None:
        self.told = 0

    def host_shared(self) -> None:
        self.told += 1


def _unplaced_when_shared() -> tuple[list[int], list[int], float, int, bool]:
    both = _two_cpus()
    cpus.WATCH_S = 0.2
    waiter = _Waiter()
    cpus.when_shared(waiter)
    mine = cpus.place(0, 2)
    assert mine is not None and sorted(os.sched_getaffinity(0)) == mine
    assert not cpus.oversubscribed(2)
    busy = FORK.Process(target=_spin, args=(6.0,))  # another job's rank, as far as this one knows
    busy.start()
    t0 = time.monotonic()
    try:
        while sorted(os.sched_getaffinity(0)) != both and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        while waiter.told == 0 and time.monotonic() - t0 < 5:
            time.sleep(0.05)
    finally:
        busy.kill()
        busy.join()
    return both, sorted(os.sched_getaffinity(0)), time.monotonic() - t0, waiter.told, cpus.oversubscribed(2)


def test_a_placed_rank_gives_its_placement_up_when_another_process_uses_the_cpus() -> None:
    """Pinned ranks that share their CPUs with another job cannot move away from it, and ranks
    that spin hold CPUs their peers need (measured: performance.md): placement lasts only while
    the host is the job's, and then every wait policy turns to the one for shared CPUs."""
    both, after, took, told, over = _in_child(_unplaced_when_shared)
    assert after == both, "still pinned with another busy process on the host"
    assert took < 3, took
    assert told == 1 and over is True


def _watcher_gone_after_destroy(rank: int, world: int) -> tuple[bool, bool]:
    import torch

    import pyc10d

    pyc10d.all_reduce(torch.ones(2))
    during = any(t.name == "pyc10d-placement" for t in threading.enumerate())
    pyc10d.destroy_process_group()
    deadline = time.monotonic() + 3
    while any(t.name == "pyc10d-placement" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return during, any(t.name == "pyc10d-placement" for t in threading.enumerate())


def test_the_watch_ends_with_the_last_shm_group() -> None:
    for during, after in run_ranks("shm", 2, _watcher_gone_after_destroy, timeout=30):
        assert during and not after, (during, after)


def _unplaced_by_the_register() -> tuple[list[int], list[int], float, list[str], list[str], int]:
    both = _two_cpus()
    cpus.WATCH_S = 0.2
    # only the register may unplace here: the suite's other workers keep the CPUs busy
    cpus.others_cpus = lambda own, window_s: (time.sleep(window_s), 0.0)[1]
    mine = cpus.place(0, 2)
    assert mine is not None and sorted(os.sched_getaffinity(0)) == mine
    time.sleep(0.5)  # a few looks: alone on the host, the rank stays placed
    assert sorted(os.sched_getaffinity(0)) == mine
    with open(cpus.register_path()) as f:
        enrolled = f.read().split()
    other = FORK.Process(target=time.sleep, args=(10,))  # another job's rank, idle: no CPU used
    other.start()
    try:
        with open(cpus.register_path(), "a") as f:
            f.write(f"{other.pid} {cpus._started(other.pid)}\n")
        t0 = time.monotonic()
        while sorted(os.sched_getaffinity(0)) != both and time.monotonic() - t0 < 5:
            time.sleep(0.02)
        took = time.monotonic() - t0
    finally:
        other.kill()
        other.join()
    with open(cpus.register_path()) as f:
        after = f.read().split()
    return both, sorted(os.sched_getaffinity(0)), took, enrolled, after, os.getpid()


def test_another_jobs_process_in_the_register_unplaces_at_the_next_look() -> None:
    """Two jobs started together sleep until their first collective: pinned meanwhile, both
    ran it on the same CPUs (placement table, 2 jobs). The register (/dev/shm) tells a
    rank another job is on the host before that job uses any CPU."""
    both, after, took, enrolled, later, child = _in_child(_unplaced_by_the_register)
    assert len(enrolled) == 2 and enrolled[0] == str(child), enrolled  # its pid and start time
    assert after == both, "still pinned with another job's live process in the register"
    assert took < 1.5, took
    assert len(later) == 4, later  # the child's line and the other's (dropped when a process enrols)


def test_the_register_drops_ended_processes_and_a_process_leaves_when_its_watch_ends() -> None:
    def run() -> tuple[list[str], list[str]]:
        _two_cpus()
        cpus.others_cpus = lambda own, window_s: (time.sleep(window_s), 0.0)[1]  # (a busy suite beside)
        dead = FORK.Process(target=lambda: None)
        dead.start()
        dead.join()
        with open(cpus.register_path(), "w") as f:
            f.write(f"{dead.pid} 12345\n999999999 1\n")
        alive = [True]
        cpus.place(0, 2, alive=lambda: alive[0])
        time.sleep(0.3)
        with open(cpus.register_path()) as f:
            during = f.read().split()
        alive[0] = False
        deadline = time.monotonic() + 5
        while any(t.name == "pyc10d-placement" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(cpus.register_path()) as f:
            return during, f.read().split()

    during, after = _in_child(run)
    assert len(during) == 2 and during[1] != "12345", during  # only the child itself
    assert after == [], after
