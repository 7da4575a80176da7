"""Symmetric memory when things go wrong, and what it leaves behind: a rank killed while a
peer waits on it is named at once, a missing signal times out naming the rank, a blocked
rank uses no CPU, and no segment is ever left in /dev/shm (after a run or a kill -9)."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from datetime import timedelta

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _clock import bound
from _multirank import exited, run_ranks

import pyc10d as dist
import pyc10d.symmetric_memory as symm
from pyc10d.errors import DistNetworkError, DistTimeoutError
from pyc10d.transport.shm.segment import PREFIX, created_by

pytestmark = pytest.mark.timeout(45)


def _leftovers(pids: list[int]) -> list[str]:
    """Segments in /dev/shm created by any of ``pids`` (names carry the creator's pid)."""
    return created_by(*pids)


def _pids(ws: int) -> list[int]:
    got: list = [None] * ws
    dist.all_gather_object(got, os.getpid())
    return got


def _alloc(n: int, alloc_id: int | None = None) -> torch.Tensor:
    return symm.empty_strided_p2p((n,), (1,), torch.float32, "cpu", "0", alloc_id)


def _killed_while_waited_for(rank: int, ws: int, victim: int) -> tuple:
    pids = _pids(ws)
    symm.enable_symm_mem_for_group("0")
    t = _alloc(1 << 16)
    h = symm.rendezvous(t)
    h.barrier()
    if rank == victim:
        time.sleep(0.3)  # let the others block first
        os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no clean-up: a crash
    t0 = time.monotonic()
    with pytest.raises(DistNetworkError) as info:
        if rank == 0:
            h.wait_signal(victim)
        else:
            h.barrier()  # waits on the victim too, sooner or later
    return pids, time.monotonic() - t0, str(info.value)


@pytest.mark.parametrize("victim", [1, 2])
def test_dead_rank_is_named_by_waiting_peers_and_nothing_leaks(victim: int) -> None:
    ws = 3
    res = run_ranks("shm", ws, _killed_while_waited_for, victim, may_exit=(victim,), timeout=25)
    assert exited(res[victim])
    pids = None
    for rank, r in enumerate(res):
        if rank == victim:
            continue
        pids, took, err = r
        assert f"rank {victim} (pid" in err and "died" in err, err
        assert took < bound(2.0), (took, err)  # at once (the group timeout is 30 minutes)
    assert _leftovers(pids) == [], _leftovers(pids)


def _missing_signal(rank: int, ws: int) -> str:
    symm.enable_symm_mem_for_group("0")
    h = symm.rendezvous(_alloc(16))
    store = dist._get_default_store()
    if rank == 1:  # stays (alive) until rank 0 has timed out on it
        store.wait(["timed_out"], timedelta(seconds=20))
        return "absent"
    try:
        t0 = time.monotonic()
        with pytest.raises(DistTimeoutError) as info:
            h.wait_signal(1)
        assert 0.9 < time.monotonic() - t0 < 1.0 + bound(0.5)  # at the 1 s timeout, not later
        with pytest.raises(TimeoutError, match=r"0\.2s waiting for rank 1"):
            h.wait_signal(1, timeout_ms=200)
    finally:
        store.set("timed_out", "1")
    return str(info.value)


def test_timeout_names_the_rank_waited_for() -> None:
    res = run_ranks("shm", 2, _missing_signal, pg_timeout=1.0, timeout=20)
    assert "timed out after 1.0s waiting for rank 1" in res[0], res


def _idle(rank: int, ws: int) -> float:
    symm.enable_symm_mem_for_group("0")
    h = symm.rendezvous(_alloc(16))
    h.barrier()
    if rank == 0:
        time.sleep(1.0)
        for p in range(1, ws):
            h.put_signal(p)
        h.barrier()
        return 0.0
    c0 = time.process_time()
    h.wait_signal(0)  # ~1 s
    h.barrier()
    return time.process_time() - c0


def test_blocked_ranks_sleep_instead_of_spinning() -> None:
    """4 ranks on (typically) 2 cores: a rank blocked for 1 s uses ~no CPU."""
    cpu = run_ranks("shm", 4, _idle, timeout=20)
    assert max(cpu[1:]) < 0.25, cpu


def _lifecycle(rank: int, ws: int) -> tuple[list[int], list[str], list[str]]:
    pids = _pids(ws)
    symm.enable_symm_mem_for_group("0")
    keep = [_alloc(1000), _alloc(1 << 20, alloc_id=3)]
    symm.fused_all_gather_matmul(torch.rand(4, 8), [torch.rand(8, 2)], 0, "0")  # the workspace
    h = symm.rendezvous(keep[0])
    h.barrier()
    in_use = _leftovers(pids)
    del keep, h
    dist.destroy_process_group()
    return pids, in_use, _leftovers(pids)


@pytest.mark.parametrize("world_size", [2, 4])
def test_segments_are_unlinked_once_mapped(world_size: int) -> None:
    res = run_ranks("shm", world_size, _lifecycle)
    pids = res[0][0]
    for _, in_use, after in res:
        assert in_use == [] and after == [], (in_use, after)
    assert _leftovers(pids) == []


def _mapped_regions() -> int:
    """Symmetric-memory segments mapped by this process (their names carry the tag "s")."""
    pattern = re.compile(rf"{PREFIX}\d+_s[0-9a-f]{{12}}")
    with open("/proc/self/maps") as f:
        return sum(bool(pattern.search(line)) for line in f)


def _unmapped(rank: int, ws: int) -> tuple[int, int, int]:
    symm.enable_symm_mem_for_group("0")
    before = _mapped_regions()
    t = _alloc(4096)
    symm.rendezvous(t).barrier()
    during = _mapped_regions()
    del t  # the last reference: every rank's segment is unmapped here
    after_free = _mapped_regions()
    p = _alloc(4096, alloc_id=1)
    del p  # persistent: kept until the group goes
    kept = _mapped_regions()
    dist.destroy_process_group()  # the group's state goes with it, and the persistent memory
    return during - before, after_free - before, kept - before, _mapped_regions() - before


def test_memory_is_unmapped_with_the_last_reference_or_the_group() -> None:
    ws = 2
    for during, after_free, kept, after_destroy in run_ranks("shm", ws, _unmapped):
        assert during == ws and after_free == 0 and kept == ws and after_destroy == 0, \
            (during, after_free, kept, after_destroy)
