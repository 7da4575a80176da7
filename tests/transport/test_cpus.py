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


def _mask_becomes(want: list[int], within_s: float = 2.0) -> list[int]:
    """This process's mask once it is ``want`` (the watch pins at its looks), or after ``within_s``."""
    t0 = time.monotonic()
    while sorted(os.sched_getaffinity(0)) != want and time.monotonic() - t0 < within_s:
        time.sleep(0.01)
    return sorted(os.sched_getaffinity(0))


def _quiet_host() -> None:
    """Only the register may move this process's ranks: the suite's other workers keep the CPUs
    busy, which the watch would take for another job's load."""
    cpus.others_cpus = lambda own, window_s: (time.sleep(window_s), 0.0)[1]


def _place_with_a_thread_running(local_rank: int) -> tuple[list[int], list[int], list[int], Any]:
    both = _two_cpus()
    _quiet_host()
    started = threading.Event()
    stop = threading.Event()
    worker = threading.Thread(target=lambda: (started.set(), stop.wait(5)))
    worker.start()
    started.wait(5)
    mine = cpus.place(local_rank, 2)  # alone on the host: pinned before it returns
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


def _placed_beside_another_job() -> tuple[list[int], list[int], list[int], float]:
    both = _two_cpus()
    _quiet_host()
    other = FORK.Process(target=time.sleep, args=(10,))  # another job's rank, idle
    other.start()
    try:
        with open(cpus.register_path(), "w") as f:
            f.write(f"{other.pid} {cpus._started(other.pid)} {other.pid}\n")
        t0 = time.monotonic()
        cpus.place(0, 2)
        at_once = sorted(os.sched_getaffinity(0))
        want = [both[sorted([os.getpid(), other.pid]).index(os.getpid())]]
        later = _mask_becomes(want)
        return both, at_once, later, time.monotonic() - t0
    finally:
        other.kill()
        other.join()


def test_beside_another_job_a_rank_is_pinned_at_the_watchs_first_look() -> None:
    """Jobs started together enrol one by one: the first, alone, is pinned at once, the others
    only at their watch's first look, with every job of the host in the register by then.
    Three jobs each pinned at enrolment on two CPUs, then unpinned when the third came, left
    two of them on one CPU each (64 KiB: 2.3x ``PYC10D_BIND=none``'s time)."""
    both, at_once, later, took = _in_child(_placed_beside_another_job)
    assert at_once == both, "pinned at enrolment beside another job"
    assert len(later) == 1 and later[0] in both, later
    assert took >= cpus.WATCH_S * 0.9, took


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
    return sorted(os.sched_getaffinity(0))  # (alone on the host: pinned as the transport started)


def test_an_shm_world_places_its_ranks_apart() -> None:
    """Through the backend: the ranks of a 2-rank shm world each end on one CPU, not the same."""
    def run() -> list[list[int]]:
        _two_cpus()
        _quiet_host()  # (the ranks, forked, inherit it)
        return run_ranks("shm", 2, _affinity_after_init, timeout=20)

    res = _in_child(run)
    assert all(len(m) == 1 for m in res) and res[0] != res[1], res
    off = _in_child(lambda: (_two_cpus(), _quiet_host(), run_ranks("shm", 2, _affinity_after_init, timeout=20))[2],
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
    _quiet_host()
    before = cpus.usable_cpus()
    mine = cpus.place(0, 2)
    if mine is not None:
        assert _mask_becomes(mine) == mine  # (pinned: its own mask is one CPU)
    return len(both), before, cpus.usable_cpus(), mine is not None


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
    assert mine is not None and _mask_becomes(mine) == mine
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
    that spin hold CPUs their peers need (measured: docs/placement.md): placement lasts only while
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


def test_share_gives_each_job_a_block_and_each_rank_a_part_of_it() -> None:
    """Alone, each rank its own CPUs; with other jobs, each job a block (its ranks sharing it
    where they outnumber it); more jobs than CPUs: none (the kernel places them)."""
    four = [0, 1, 2, 3]
    assert [cpus.share(four, [7], 7, r, 2) for r in (0, 1)] == [[0, 1], [2, 3]]
    assert [cpus.share(four, [5, 7], 7, r, 2) for r in (0, 1)] == [[2], [3]]
    assert [cpus.share(four, [5, 7], 5, r, 4) for r in range(4)] == [[0, 1]] * 4
    assert cpus.share([0, 1], [5, 7], 5, 1, 2) == [0] and cpus.share([0, 1], [5, 7], 7, 0, 2) == [1]
    assert cpus.share([0, 1], [3, 5, 7], 5, 0, 2) is None
    assert cpus.share([0, 1], [3, 5], 7, 0, 2) is None  # (a job the register does not name)


def _shared_out_by_the_register() -> tuple[list[int], list[int], list[int], list[int], list[str], list[str], int]:
    both = _two_cpus()
    cpus.WATCH_S = 0.2
    _quiet_host()
    mine = cpus.place(0, 2)
    assert mine is not None and _mask_becomes(mine) == mine
    time.sleep(0.5)  # a few looks: alone on the host, the rank stays placed
    assert sorted(os.sched_getaffinity(0)) == mine
    with open(cpus.register_path()) as f:
        enrolled = f.read().split()

    # other jobs' ranks, idle (no CPU used): their jobs keyed by their pids
    others = [FORK.Process(target=time.sleep, args=(10,)) for _ in range(2)]
    for o in others:
        o.start()
    try:
        with open(cpus.register_path(), "a") as f:
            f.write(f"{others[0].pid} {cpus._started(others[0].pid)} {others[0].pid}\n")
        mine_at = sorted([os.getpid(), others[0].pid]).index(os.getpid())
        with_one = _mask_becomes([both[mine_at]])
        with open(cpus.register_path(), "a") as f:
            f.write(f"{others[1].pid} {cpus._started(others[1].pid)}\n")  # (a line without its job)
        with_two = _mask_becomes(both)
        others[1].kill()
        others[1].join()
        _rewrite = cpus._rewrite_register  # what a third process's enrolment does: drop the ended
        _rewrite(lambda pid, start: cpus._started(pid) == start, add=False)
        again = _mask_becomes([both[mine_at]])
    finally:
        for o in others:
            o.kill()
            o.join()
    with open(cpus.register_path()) as f:
        after = f.read().split()
    return both, with_one, with_two, again, enrolled, after, os.getpid()


def test_other_jobs_in_the_register_share_the_cpus_out_by_job() -> None:
    """Two jobs started together sleep until their first collective: pinned rank by rank, the
    two jobs' ranks end one of each job per CPU, which outlives unpinning (placement table, 2
    jobs). The register (/dev/shm) tells a rank of another job on the host before that job
    uses any CPU: each job then gets CPUs of its own, at the next look; with more jobs than
    CPUs, none; and back when a job ends."""
    both, with_one, with_two, again, enrolled, later, child = _in_child(_shared_out_by_the_register)
    assert enrolled == [str(child), enrolled[1], str(child)], enrolled  # pid, start time, job
    assert len(with_one) == 1 and with_one[0] in both, ("not on its job's CPU with a second job", with_one)
    assert with_two == both, "still pinned with three jobs on two CPUs"
    assert again == with_one, "not back on its job's CPU when the third job ended"
    assert len(later) == 6, later  # the child's line and the first other job's


def test_the_register_drops_ended_processes_and_a_process_leaves_when_its_watch_ends() -> None:
    def run() -> tuple[list[str], list[str]]:
        _two_cpus()
        _quiet_host()
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
    assert len(during) == 3 and during[1] != "12345", during  # only the child itself
    assert after == [], after
