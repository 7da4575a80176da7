"""The shared-memory backend: chunked paths, clean-up of /dev/shm, dead ranks, idle CPU, auto.

The collective-by-collective conformance of ``shm`` runs in ``tests/test_conformance.py``
(it is in ``BACKENDS``); here are the properties only shm has. ``TINY`` shrinks the arena
slots to 256 bytes and the rings to 1 KiB, so a few thousand elements take many phases.
"""

from __future__ import annotations

import os
import random
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
from pyc10d.errors import DistError
from pyc10d.transport.shm.segment import created_by

TINY = {
    "pyc10d.backends.shm.SLOT_BYTES": 256,
    "pyc10d.algorithms.SHM_FLAT_ALLREDUCE": 64,
    "pyc10d.transport.shm.transport.RING_BYTES": 1024,
}
pytestmark = pytest.mark.timeout(45)


def _leftovers(pids: list[int]) -> list[str]:
    """Segments in /dev/shm created by any of ``pids`` (names carry the creator's pid)."""
    return created_by(*pids)


def _pids() -> list[int]:
    return list(dist.group.WORLD._get_backend().transport.pids)


# -- every collective, every dtype, many phases -----------------------------------------------
def _mixed_sequence(rank: int, ws: int, seed: int) -> int:
    """A random mix of collectives and sizes, so consecutive operations of every kind (and of
    both the flat and the chunked kind) follow one another on the two buffer parities."""
    rng = random.Random(seed)  # same sequence on every rank
    dtypes = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16, torch.uint8]
    checked = 0
    for step in range(60):
        kind = rng.choice(["ar", "ar_max", "ag", "rs", "bc", "a2a", "a2av", "reduce", "barrier"])
        dtype = rng.choice(dtypes)
        n = rng.choice([0, 1, 3, 17, 64, 257, 1000])
        g = torch.Generator().manual_seed(seed * 1000 + step)
        xs = [torch.randint(0, 5, (n * ws,), generator=g).to(dtype) for _ in range(ws)]
        mine = xs[rank]
        if kind == "ar":
            t = mine.clone()
            dist.all_reduce(t)
            want = sum(x.to(torch.float64) for x in xs).to(dtype)
        elif kind == "ar_max":
            t = mine.clone()
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            want = torch.stack(xs).amax(0)
        elif kind == "reduce":
            t = mine.clone()
            dist.reduce(t, dst=ws - 1)
            want = sum(x.to(torch.float64) for x in xs).to(dtype) if rank == ws - 1 else t
        elif kind == "ag":
            t = torch.empty(n * ws * ws, dtype=dtype)
            dist.all_gather_into_tensor(t, mine)
            want = torch.cat(xs)
        elif kind == "rs":
            t = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(t, mine)
            want = sum(x.to(torch.float64) for x in xs).to(dtype)[rank * n:(rank + 1) * n]
        elif kind == "bc":
            t = mine.clone()
            dist.broadcast(t, src=step % ws)
            want = xs[step % ws]
        elif kind == "a2a":
            t = torch.empty(n * ws, dtype=dtype)
            dist.all_to_all_single(t, mine)
            want = torch.cat([x[rank * n:(rank + 1) * n] for x in xs])
        elif kind == "a2av":  # rank p sends p + q + k elements to rank q
            def part(p: int, q: int, n: int = n, dtype: torch.dtype = dtype) -> torch.Tensor:
                return torch.full((p + q + n,), p * 10 + q, dtype=dtype)
            outs = [torch.empty(p + rank + n, dtype=dtype) for p in range(ws)]
            dist.all_to_all(outs, [part(rank, q) for q in range(ws)])
            t, want = torch.cat(outs), torch.cat([part(p, rank) for p in range(ws)])
        else:
            dist.barrier()
            continue
        assert torch.equal(t, want), f"step {step}: {kind} {dtype} n={n}: {t} != {want}"
        checked += 1
    return checked


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_mixed_collectives_many_phases(world_size: int) -> None:
    res = run_ranks("shm", world_size, _mixed_sequence, 7, patches=TINY, timeout=40)
    assert res[0] > 40


def _reductions(rank: int, ws: int) -> None:
    for name in ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"]:
        dtype = torch.float64 if name in ("AVG", "PREMUL_SUM") else torch.int64
        xs = [torch.arange(1000, dtype=dtype) % 7 + r + 1 for r in range(ws)]
        ref = {"SUM": lambda a, b: a + b, "PRODUCT": lambda a, b: a * b,
               "MIN": torch.minimum, "MAX": torch.maximum, "BAND": lambda a, b: a & b,
               "BOR": lambda a, b: a | b, "BXOR": lambda a, b: a ^ b,
               "AVG": lambda a, b: a + b, "PREMUL_SUM": lambda a, b: a + b}[name]
        want = xs[0]
        for x in xs[1:]:
            want = ref(want, x)
        if name == "AVG":
            want = want / ws
        op = dist._make_premul_sum(2.0) if name == "PREMUL_SUM" else getattr(dist.ReduceOp, name)
        if name == "PREMUL_SUM":
            want = want * 2
        t = xs[rank].clone()
        dist.all_reduce(t, op=op)
        assert torch.allclose(t, want), name
        out = torch.empty(250, dtype=dtype)
        inp = torch.cat([xs[rank][:250]] * ws)
        dist.reduce_scatter_tensor(out, inp, op=op)
        assert torch.allclose(out, want[:250]), f"reduce_scatter {name}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_reduction_chunked(world_size: int) -> None:
    run_ranks("shm", world_size, _reductions, patches=TINY)


def _out_of_place(rank: int, ws: int) -> None:
    """``allreduce(..., _src=x)`` (the functional all_reduce's path) reads ``x`` and writes
    only the output, on the flat (small) and the chunked (many phases) algorithm alike."""
    engine = dist.group.WORLD._get_backend()
    for n in (3, 1000):  # TINY: 3 elements fit one slot, 1000 take many phases
        for name in ["SUM", "MAX", "AVG", "PREMUL_SUM"]:
            xs = [torch.arange(n, dtype=torch.float64) % 7 + r + 1 for r in range(ws)]
            op = dist._make_premul_sum(2.0) if name == "PREMUL_SUM" else getattr(dist.ReduceOp, name)
            want = torch.stack(xs).amax(0) if name == "MAX" else sum(xs)
            want = want / ws if name == "AVG" else want * 2 if name == "PREMUL_SUM" else want
            src = xs[rank].clone()
            out = torch.full((n,), -1.0, dtype=torch.float64)
            engine.allreduce([out], dist.AllreduceOptions(reduceOp=op), _src=src).wait()
            assert torch.allclose(out, want), (n, name)
            assert torch.equal(src, xs[rank]), f"the input changed ({n}, {name})"


@pytest.mark.parametrize("world_size", [2, 3])
def test_allreduce_out_of_place(world_size: int) -> None:
    run_ranks("shm", world_size, _out_of_place, patches=TINY)


# -- /dev/shm stays clean -------------------------------------------------------------------------
def _lifecycle(rank: int, ws: int) -> tuple[list[int], list[str], list[str]]:
    pids = _pids()
    dist.barrier()  # the group's arena is made in its first collective, unlinked in its first phase
    after_init = _leftovers(pids)
    t = torch.ones(5000)
    dist.all_reduce(t)
    g = dist.new_group(list(range(ws)))
    dist.all_reduce(t, group=g)
    dist.barrier()
    in_use = _leftovers(pids)
    dist.destroy_process_group()
    return pids, after_init, in_use


@pytest.mark.parametrize("world_size", [2, 4])
def test_segments_are_unlinked(world_size: int) -> None:
    """Once every rank has mapped a segment its name is gone: nothing to leak, ever."""
    res = run_ranks("shm", world_size, _lifecycle, init=True)
    pids = res[0][0]
    for _, after_init, in_use in res:
        assert after_init == [] and in_use == [], (after_init, in_use)
    assert _leftovers(pids) == []


# -- a rank that dies -----------------------------------------------------------------------------
def _killed_mid_collective(rank: int, ws: int, victim: int, posts: int) -> tuple:
    from pyc10d.transport.shm import arena as shm_arena

    pids = _pids()
    if posts > 1:  # else: die in the group's very first collective, before its arena is unlinked
        dist.barrier()
    if rank == victim:
        post, count = shm_arena.Arena.post, [0]

        def dying_post(self, c: int) -> None:
            count[0] += 1
            if count[0] >= posts:
                os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no clean-up: a crash
            post(self, c)

        shm_arena.Arena.post = dying_post
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(50_000))  # 200 KB over 256-byte slots: hundreds of phases
    except DistError as e:
        took = time.monotonic() - t0
        try:  # the group is broken: later calls fail at once, naming the same cause
            dist.barrier()
            later = "no error"
        except DistError as e2:
            later = str(e2)
        return pids, took, str(e), later
    return pids, time.monotonic() - t0, "no error", ""


@pytest.mark.parametrize("victim,posts", [(0, 1), (2, 40), (1, 3)], ids=["creator-first-op", "mid", "early"])
def test_killed_rank_is_named_and_nothing_leaks(victim: int, posts: int) -> None:
    ws = 3
    res = run_ranks("shm", ws, _killed_mid_collective, victim, posts, patches=TINY,
                    may_exit=(victim,), timeout=25)
    assert exited(res[victim])
    pids = None
    for rank, r in enumerate(res):
        if rank == victim:
            continue
        pids, took, err, later = r
        assert f"rank {victim}" in err, err
        assert took < bound(2.0), (took, err)  # (the group timeout is 30 minutes)
        assert f"rank {victim}" in later, later
    assert _leftovers(pids) == [], _leftovers(pids)


# -- timeouts and mismatches ----------------------------------------------------------------------
def _absent_rank(rank: int, ws: int) -> str:
    store = dist._get_default_store()
    if rank == 1:  # stays (alive) until the others have given up on it
        store.wait([f"gave_up/{r}" for r in range(ws) if r != 1], timedelta(seconds=20))
        return "absent"
    t0 = time.monotonic()
    try:
        with pytest.raises(DistError) as info:  # a timeout here, or the other waiter's abort
            dist.all_reduce(torch.ones(10))
    finally:
        store.set(f"gave_up/{rank}", "1")
    assert time.monotonic() - t0 < 1.0 + bound(1.0)  # at the 1 s timeout, not later
    return f"{type(info.value).__name__}: {info.value}"


def test_timeout_names_the_missing_rank() -> None:
    res = run_ranks("shm", 3, _absent_rank, pg_timeout=1.0, timeout=20)
    waiters = [r for r in res if r != "absent"]
    assert all("timed out after 1.0s" in r and "rank 1" in r for r in waiters), res
    assert any(r.startswith("DistTimeoutError") for r in waiters), res


def _mismatch(rank: int, ws: int) -> str:
    t = torch.ones(100 + (3 if rank == 1 else 0))
    with pytest.raises(DistError) as info:
        dist.all_reduce(t)
    return str(info.value)


def test_size_mismatch_is_reported() -> None:
    res = run_ranks("shm", 3, _mismatch, patches=TINY)
    assert all("rank 1" in r for r in res), res


# -- oversubscribed and idle ----------------------------------------------------------------------
def _idle_cpu(rank: int, ws: int) -> float:
    dist.barrier()
    if rank == 0:
        time.sleep(1.0)
    c0 = time.process_time()
    dist.barrier()  # ranks 1..3 wait ~1 s here
    return time.process_time() - c0


def test_waiting_rank_sleeps_instead_of_spinning() -> None:
    """4 ranks on (typically) 2 cores: a rank blocked for 1 s in a barrier uses ~no CPU."""
    cpu = run_ranks("shm", 4, _idle_cpu, timeout=20)
    assert max(cpu[1:]) < 0.25, cpu


def _oversubscribed(rank: int, ws: int) -> float:
    t0 = time.monotonic()
    for i in range(300):
        t = torch.full((8 << (i % 12),), float(rank))
        dist.all_reduce(t)
        assert t[0].item() == ws * (ws - 1) / 2
    return time.monotonic() - t0


def test_oversubscribed_ranks_make_progress() -> None:
    res = run_ranks("shm", 4, _oversubscribed, timeout=30)
    assert max(res) < 20, res


# -- point to point and subgroups over the rings ----------------------------------------------------
def _p2p_and_groups(rank: int, ws: int) -> None:
    big = torch.arange(20_000, dtype=torch.float64)  # 160 KB through a 1 KiB ring
    if rank == 0:
        dist.send(big, dst=1)
        dist.send(big[:7], dst=1, tag=3)
    elif rank == 1:
        small = torch.empty(7, dtype=torch.float64)
        work = dist.irecv(small, src=0, tag=3)  # posted first, for a later message
        got = torch.empty_like(big)
        dist.recv(got, src=0)
        work.wait()
        assert torch.equal(got, big) and torch.equal(small, big[:7])
    evens = dist.new_group([r for r in range(ws) if r % 2 == 0])
    odds = dist.new_group([r for r in range(ws) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    works = [dist.all_reduce(torch.ones(3000), group=mine, async_op=True) for _ in range(3)]
    t = torch.ones(3000)
    dist.all_reduce(t)
    for w in works:
        w.wait()
    assert t[0].item() == ws


def test_p2p_and_concurrent_subgroups() -> None:
    run_ranks("shm", 4, _p2p_and_groups, patches=TINY)


# -- backend="auto" -------------------------------------------------------------------------------
def _auto(rank: int, ws: int, store_path: str, split: bool) -> str:
    from pyc10d.backends import shm

    if split and rank == 1:
        shm.host_identity = lambda: "another-host"
    store = dist.FileStore(store_path, ws)
    dist.init_process_group(store=store, rank=rank, world_size=ws, timeout=timedelta(seconds=20))
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == ws
    name = dist.get_backend()
    dist.destroy_process_group()
    return name


@pytest.mark.parametrize("split", [False, True], ids=["one-host", "two-hosts"])
def test_auto_is_the_default(tmp_path, split: bool) -> None:
    """One host: shm; ranks 0 and 2 on one host, rank 1 on another: hierarchical."""
    res = run_ranks("shm", 3, _auto, str(tmp_path / "store"), split, init=False)
    assert res == (["hier"] * 3 if split else ["shm"] * 3)


def _auto_alone(rank: int, ws: int, store_path: str) -> str:
    from pyc10d.backends import shm

    shm.host_identity = lambda: f"host-{rank}/boot/0"
    return _auto(rank, ws, store_path, False)


def test_auto_one_rank_per_host_is_tcp(tmp_path) -> None:
    assert run_ranks("shm", 2, _auto_alone, str(tmp_path / "store"), init=False) == ["tcp", "tcp"]
