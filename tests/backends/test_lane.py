"""The lean lane (``pyc10d/backends/lane.py``): the same all_reduce as the general path.

A synchronous all_reduce of a key (op, dtype, shape) seen before runs a cached step instead
of the general path. These tests check that it is taken (the general path's ``_submit`` is
not called), that it computes what the general path computes, on every op and dtype it
serves, beside ranks on the general path, and that everything the general path does
besides the bytes still happens: the order of queued operations, the descriptor check
between ranks, timeouts and dead peers named, the flight recorder, the profiler's ranges,
and torch.distributed (the plugin) taking it too.
"""

from __future__ import annotations

import os
import re
import sys
import time
from datetime import timedelta

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _clock import bound
from _multirank import exited, failure_after, run_ranks

pytestmark = pytest.mark.timeout(45)


def _engine(dist):
    pg = dist.group.WORLD
    return pg.engine if hasattr(pg, "engine") else pg._get_backend()


def _count_general(engine) -> list[str]:
    """Record the operations that take the general path (``_submit``) from now on."""
    calls: list[str] = []
    orig = engine._submit

    def submit(opname, *a, **k):
        calls.append(opname)
        return orig(opname, *a, **k)

    engine._submit = submit
    return calls


def _value(rank: int, shape: tuple, dtype: torch.dtype, i: int) -> torch.Tensor:
    n = max(1, int(torch.Size(shape).numel()))
    x = (torch.arange(n) % 5 + rank + 1 + i).reshape(shape)
    return (x % 2 == 0) if dtype == torch.bool else x.to(dtype)


_REF = {"SUM": lambda a, b: a + b, "AVG": lambda a, b: a + b, "PRODUCT": lambda a, b: a * b,
        "MIN": torch.minimum, "MAX": torch.maximum, "BAND": lambda a, b: a & b,
        "BOR": lambda a, b: a | b, "BXOR": lambda a, b: a ^ b}
_CASES = [  # (op, dtype, shape)
    ("SUM", torch.float32, (2,)), ("SUM", torch.float64, (3, 4)), ("SUM", torch.int64, ()),
    ("SUM", torch.bfloat16, (5,)), ("SUM", torch.bool, (6,)), ("AVG", torch.float32, (2, 2)),
    ("PRODUCT", torch.int32, (7,)), ("MIN", torch.float16, (3,)), ("MAX", torch.uint8, (9,)),
    ("MAX", torch.bool, (4,)), ("BAND", torch.int64, (3,)), ("BOR", torch.int16, (2,)),
    ("BXOR", torch.int8, (4,)),
]


def _want(name: str, ws: int, shape: tuple, dtype: torch.dtype, i: int) -> torch.Tensor:
    if dtype == torch.bool:
        xs = [_value(r, shape, dtype, i) for r in range(ws)]
        out = xs[0]
        for x in xs[1:]:
            out = (out | x) if name == "SUM" else torch.maximum(out, x)
        return out
    xs = [_value(r, shape, torch.float64, i) for r in range(ws)]
    out = xs[0]
    for x in xs[1:]:
        out = _REF[name](out.to(torch.int64), x.to(torch.int64)).to(torch.float64) if name.startswith("B") \
            else _REF[name](out, x)
    if name == "AVG":
        out = out / ws
    return out.to(dtype)


def _every_case(rank: int, ws: int, module: str) -> dict:
    import importlib

    dist = importlib.import_module(module)
    engine = _engine(dist)
    general = _count_general(engine)
    wrong = []
    for name, dtype, shape in _CASES:
        op = getattr(dist.ReduceOp, name)
        for i in range(3):  # the first call of a key takes the general path, then the lane
            t = _value(rank, shape, dtype, i)
            dist.all_reduce(t, op=op)
            want = _want(name, ws, shape, dtype, i)
            if not torch.equal(t, want):
                wrong.append(f"{name} {dtype} {shape} call {i}: {t} != {want}")
    return {"general": general, "wrong": wrong, "keys": len(engine._steps)}


@pytest.mark.parametrize("module,world_size", [("pyc10d", 2), ("pyc10d", 3), ("torch.distributed", 2)])
def test_lane_serves_repeat_calls_of_every_op_and_dtype(module: str, world_size: int) -> None:
    backend = "shm" if module == "pyc10d" else "pyc10d_shm"
    for res in run_ranks(backend, world_size, _every_case, module, dist_module=module):
        assert res["wrong"] == []
        # the group's first call opens the arena on the general path; every later one, of
        # every key, ran on the lane (each key's step built at its first call)
        assert res["general"] == ["allreduce"]
        assert res["keys"] == len(_CASES)


def _gather_family(rank: int, ws: int, module: str) -> dict:
    """all_gather_into_tensor, reduce_scatter_tensor and broadcast, each key three times."""
    import importlib

    dist = importlib.import_module(module)
    engine = _engine(dist)
    general = _count_general(engine)
    wrong = []

    def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if not torch.equal(got, want):
            wrong.append(f"{what}: {got} != {want}")

    for i in range(3):
        # odd calls: the other shapes of the same keys (1-D output of the gather, 2-D
        # inputs and outputs elsewhere); float32 9000: above CAT_BYTES (the strided copy out)
        two = i % 2 == 1
        for dtype, k in ((torch.float32, 3), (torch.int64, 1), (torch.bfloat16, 40), (torch.uint8, 5),
                         (torch.float32, 9000)):
            parts = [(torch.arange(k) + 10 * r + i).to(dtype) for r in range(ws)]
            out = torch.full((ws * k,) if two else (ws, k), 99).to(dtype)
            inp = parts[rank].clone()
            dist.all_gather_into_tensor(out, inp.view(1, k) if two else inp)
            check(f"all_gather {dtype} k={k} #{i}", out, torch.stack(parts).view(out.shape))
            for name in ("SUM", "MAX", "AVG"):
                if name == "AVG" and not dtype.is_floating_point:
                    continue
                inputs = [(torch.arange(ws * k) % 7 + r + i).to(dtype) for r in range(ws)]
                out = torch.full((1, k) if two else (k,), 99).to(dtype)
                inp = inputs[rank].clone()
                dist.reduce_scatter_tensor(out, inp.view(ws, k) if two else inp, op=getattr(dist.ReduceOp, name))
                full = torch.stack([x.to(torch.float64) for x in inputs])
                want = full.amax(0) if name == "MAX" else full.sum(0) / (ws if name == "AVG" else 1)
                check(f"reduce_scatter {name} {dtype} k={k} #{i}", out,
                      want[rank * k:(rank + 1) * k].to(dtype).view(out.shape))
            for root in range(ws):
                t = (torch.arange(k) + 100 * root + i).to(dtype) if rank == root else torch.full((k,), 7).to(dtype)
                t = t.view(1, k) if two else t
                dist.broadcast(t, src=root)
                check(f"broadcast root {root} {dtype} #{i}", t,
                      (torch.arange(k) + 100 * root + i).to(dtype).view(t.shape))
    return {"general": general, "wrong": wrong, "keys": len(engine._steps)}


@pytest.mark.parametrize("module,world_size", [("pyc10d", 2), ("pyc10d", 3), ("torch.distributed", 2)])
def test_lane_serves_gather_scatter_and_broadcast(module: str, world_size: int) -> None:
    backend = "shm" if module == "pyc10d" else "pyc10d_shm"
    for res in run_ranks(backend, world_size, _gather_family, module, dist_module=module):
        assert res["wrong"] == []
        # the group's first call opens the arena; every later call ran on the lane
        assert res["general"] == ["allgather_into_tensor"]
        assert res["keys"] == 5 * (1 + 3 + world_size) - 2  # (no AVG for the two integer dtypes)


def _medium(rank: int, ws: int, symmetric: bool) -> dict:
    """A 256 KiB all_reduce (one exchange of the whole tensor since the flat algorithm's bound
    is the ranks' bytes together) runs on the lane with every room of pyc10d imported, and on
    a group with symmetric memory too; only a symmetric tensor of that group leaves it, for
    the reduction out of the peers' memory."""
    import pyc10d as dist
    import pyc10d.functional  # (no import changes a call's path)
    import pyc10d.symmetric_memory as symm
    import pyc10d.window

    name = dist.group.WORLD.group_name
    if symmetric:
        symm.enable_symm_mem_for_group(name)
    general = _count_general(_engine(dist))
    wrong = 0
    want = [torch.arange(65536, dtype=torch.float32) * (ws * (ws + 1) / 2) + ws * i for i in range(3)]
    for i in range(3):
        t = torch.arange(65536, dtype=torch.float32) * (rank + 1) + i
        dist.all_reduce(t)
        wrong += not torch.equal(t, want[i])
    if symmetric:
        s = symm.empty_strided_p2p((65536,), (1,), torch.float32, "cpu", name)
        for i in range(2):
            s.copy_(torch.arange(65536, dtype=torch.float32) * (rank + 1) + i)
            dist.all_reduce(s)
            wrong += not torch.equal(s, want[i])
    return {"general": general, "wrong": wrong}


@pytest.mark.parametrize("symmetric", [False, True], ids=["plain", "symmetric-memory-in-use"])
def test_medium_all_reduce_on_the_lane(symmetric: bool) -> None:
    for r in run_ranks("shm", 2, _medium, symmetric):
        assert r["wrong"] == 0
        # the first opens the arena; the symmetric tensor's two reductions leave the lane
        assert r["general"] == ["allreduce"] * (3 if symmetric else 1)


def _barriers(rank: int, ws: int, module: str) -> dict:
    """A barrier on the lane still waits for the last rank: rank 1 comes 0.3 s late to the
    third of three barriers (the first opens the arena on the general path)."""
    import importlib

    dist = importlib.import_module(module)
    dist.barrier()
    general = _count_general(_engine(dist))
    waited = []
    for i in range(2):
        if rank == 1 and i == 1:
            time.sleep(0.3)
        t0 = time.monotonic()
        dist.barrier()
        waited.append(time.monotonic() - t0)
    return {"general": general, "waited": waited, "entry": _engine(dist).recorder.entries()[-1]}


@pytest.mark.parametrize("module", ["pyc10d", "torch.distributed"])
def test_barrier_on_the_lane_waits_for_every_rank(module: str) -> None:
    backend = "shm" if module == "pyc10d" else "pyc10d_shm"
    res = run_ranks(backend, 2, _barriers, module, dist_module=module)
    for r in res:
        assert r["general"] == []
        assert r["entry"]["op"] == "barrier" and r["entry"]["state"] == "completed" and r["entry"]["numel"] == 0
    assert res[0]["waited"][1] > 0.25, res[0]["waited"]


def _alltoall(rank: int, ws: int, module: str) -> dict:
    """all_to_all_single split evenly, on the lane from the second call; then a call where
    rank 0 sends uneven blocks (general path) to ranks on the lane, and a large one that takes
    several phases on the general path while a rank with small blocks rides along on the lane."""
    import importlib

    dist = importlib.import_module(module)
    engine = _engine(dist)
    dist.barrier()  # opens the arena
    general = _count_general(engine)
    wrong = []
    for i in range(3):
        for dtype, k in ((torch.float32, 3), (torch.int64, 1), (torch.bfloat16, 17)):
            inp = (torch.arange(ws * k) + 100 * rank + i).to(dtype).reshape(ws, k)
            out = torch.full((ws, k), 99).to(dtype)
            dist.all_to_all_single(out, inp)
            want = torch.stack([(torch.arange(ws * k) + 100 * p + i).to(dtype).reshape(ws, k)[rank] for p in range(ws)])
            if not torch.equal(out, want):
                wrong.append(f"{dtype} k={k} #{i}: {out} != {want}")
    lane_calls = len(general)
    # rank 0 sends rank 1 200,000 elements (more than a slot's piece: the exchange takes
    # several phases) and every other block is 1 element: ranks 0 and 1 give split sizes
    # (general path); rank 2, whose split is even, gives none and rides along on the lane
    big = 200_000
    send = [big if (rank == 0 and q == 1) else 1 for q in range(ws)]
    recv = [big if (p == 0 and rank == 1) else 1 for p in range(ws)]
    inp = torch.cat([torch.full((s,), float(10 * rank + q)) for q, s in enumerate(send)])
    out = torch.full((sum(recv),), -1.0)
    if rank >= 2:
        dist.all_to_all_single(out, inp)
    else:
        dist.all_to_all_single(out, inp, recv, send)
    want = torch.cat([torch.full((s,), float(10 * p + rank)) for p, s in enumerate(recv)])
    if not torch.equal(out, want):
        wrong.append(f"uneven: {out[:8]} != {want[:8]}")
    return {"general": general, "lane_calls": lane_calls, "wrong": wrong}


@pytest.mark.parametrize("module,world_size", [("pyc10d", 2), ("pyc10d", 3), ("torch.distributed", 2)])
def test_all_to_all_single_on_the_lane(module: str, world_size: int) -> None:
    backend = "shm" if module == "pyc10d" else "pyc10d_shm"
    for rank, res in enumerate(run_ranks(backend, world_size, _alltoall, module, dist_module=module)):
        assert res["wrong"] == []
        assert res["lane_calls"] == 0  # every even call ran on the lane
        # the uneven call: on the general path where split sizes were given
        assert res["general"] == ([] if rank >= 2 else ["alltoall_base"])


def _mixed_paths(rank: int, ws: int) -> list:
    """Rank 0 passes strided views (the general path), the others contiguous tensors (the
    lane): same exchange, same bytes."""
    import pyc10d as dist

    general = _count_general(_engine(dist))
    out = []
    for i in range(4):
        base = torch.arange(8, dtype=torch.float32) * (rank + 1) + i
        t = base.clone()[::2] if rank == 0 else base[::2].clone()
        dist.all_reduce(t)
        out.append(t.tolist())
    return [out, general]


def test_lane_and_general_path_exchange_with_each_other() -> None:
    res = run_ranks("shm", 2, _mixed_paths)
    want = [[(torch.arange(8.0)[::2] * 3 + 2 * i).tolist() for i in range(4)]]
    assert [r[0] for r in res] == want * 2
    assert len(res[0][1]) == 4 and res[1][1] == ["allreduce"]  # rank 1: the lane after the first


def _queued_first(rank: int, ws: int) -> list:
    """A sync all_reduce issued while an async one is queued runs after it (general path)."""
    import pyc10d as dist

    engine = _engine(dist)
    t = torch.ones(2)
    dist.all_reduce(t)
    general = _count_general(engine)
    # async and strided (the lane takes contiguous tensors only): queued on the progress thread
    a = torch.full((2000,), float(rank + 1))[::2]
    b = torch.tensor([rank + 1.0, 1.0])  # the warmed key
    if rank == 1:
        time.sleep(0.5)  # rank 0's async call waits for this one: still pending at its next
    work = dist.all_reduce(a, async_op=True)
    dist.all_reduce(b)
    work.wait()
    return [a[0].item(), b.tolist(), general]


def test_sync_call_behind_an_async_one_keeps_issue_order() -> None:
    res = run_ranks("shm", 2, _queued_first)
    for r in res:
        assert r[0] == 3.0 and r[1] == [3.0, 2.0]
    assert res[0][2] == ["allreduce", "allreduce"]  # pending work: the lane stepped aside


def _mismatch(rank: int, ws: int) -> dict:
    """Both shapes warmed on the lane, then the ranks disagree: both name the other's call."""
    import pyc10d as dist

    for n in (2, 3):
        dist.all_reduce(torch.ones(n))
    general = _count_general(_engine(dist))
    try:
        dist.all_reduce(torch.ones(2 if rank == 0 else 3))
    except Exception as e:  # noqa: BLE001
        first = f"{type(e).__name__}: {e}"
    else:
        first = "no error"
    on_general = list(general)
    try:
        dist.all_reduce(torch.ones(2))
    except Exception as e:  # noqa: BLE001
        after = f"{type(e).__name__}: {e}"
    else:
        after = "no error"
    return {"first": first, "after": after, "general": on_general}


def test_lane_ranks_that_disagree_fail_naming_both() -> None:
    res = run_ranks("shm", 2, _mismatch)
    for rank, r in enumerate(res):
        assert r["general"] == [], "the mismatching call should have run on the lane"
        assert "DistBackendError" in r["first"]
        other = 1 - rank
        assert re.search(rf"allreduce #\d+ in group '0': rank {other} called allreduce SUM with "
                         rf"{8 + 4 * other} bytes of float32, rank {rank} called allreduce SUM with "
                         rf"{8 + 4 * rank} bytes", r["first"]), r["first"]
        assert "[flight recorder: " in r["first"]
        assert "unusable after an earlier failure" in r["after"]


def _late_peer(rank: int, ws: int, module: str) -> dict:
    import importlib

    dist = importlib.import_module(module)
    t = torch.ones(2)
    for _ in range(3):
        dist.all_reduce(t)
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:  # never calls the fourth: rank 0 times out on the lane; stays until it has
        store.wait(["timed_out"], timedelta(seconds=20))
        return {}
    general = _count_general(_engine(dist))
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
        torch_type = isinstance(e, torch.distributed.DistBackendError)
    else:
        error, torch_type = "no error", False
    took = time.monotonic() - t0
    store.set("timed_out", "1")
    entries = _engine(dist).recorder.entries()
    return {"error": error, "took": took, "general": general, "last": entries[-1], "before": entries[-2],
            "torch_type": torch_type}


@pytest.mark.parametrize("module", ["pyc10d", "torch.distributed"])
def test_lane_timeout_is_named_and_recorded(module: str) -> None:
    backend = "shm" if module == "pyc10d" else "pyc10d_shm"
    r = run_ranks(backend, 2, _late_peer, module, dist_module=module, pg_timeout=1.5)[0]
    assert r["general"] == []
    # through the plugin: the same error, also torch's type (as the general path raises it)
    assert r["torch_type"] == (module == "torch.distributed")
    assert r["error"].startswith("DistTimeoutError: allreduce #4 in group"), r["error"]
    assert "Timed out" in r["error"] and "rank 1" in r["error"]
    assert 1.2 < r["took"] < 1.5 + bound(2.5)  # at the 1.5 s timeout, not later
    assert r["last"]["seq"] == 4 and r["last"]["op"] == "allreduce" and r["last"]["state"] == "failed"
    assert r["before"]["state"] == "completed" and r["before"]["numel"] == 2 and r["before"]["dtype"] == "float32"


def _dead_peer(rank: int, ws: int, module: str) -> str:
    import importlib

    dist = importlib.import_module(module)
    t = torch.ones(2)
    for _ in range(3):
        dist.all_reduce(t)
    if rank == 1:
        os._exit(0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001
        return failure_after(t0, e)
    return "no error"


@pytest.mark.parametrize("module", ["pyc10d", "torch.distributed"])
def test_lane_names_a_dead_peer_within_a_second(module: str) -> None:
    backend = "shm" if module == "pyc10d" else "pyc10d_shm"
    res = run_ranks(backend, 2, _dead_peer, module, dist_module=module, pg_timeout=20, may_exit=(1,))
    assert exited(res[1])
    took, kind, text = res[0].split(" ", 2)
    assert float(took) < bound(1.5), res[0]  # within a second, on this machine's scale
    assert text.startswith("DistNetworkError: allreduce #4 in group") and "rank 1" in text, text
    assert kind == ("torch" if module == "torch.distributed" else "pyc10d")


def _profiled(rank: int, ws: int) -> list[str]:
    import pyc10d as dist

    t = torch.ones(2)
    dist.all_reduce(t)
    dist.all_reduce(t)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t)
    return sorted({e.name for e in prof.events() if e.name.startswith("pyc10d:")})


def test_profiler_sees_a_warmed_all_reduce() -> None:
    for names in run_ranks("shm", 2, _profiled):
        assert "pyc10d:allreduce" in names


def _other_backends(rank: int, ws: int) -> list:
    import pyc10d as dist

    engine = _engine(dist)
    general = _count_general(engine)
    t = torch.ones(2)
    for _ in range(3):
        dist.all_reduce(t)
    return [t.tolist(), general]


@pytest.mark.parametrize(("backend", "general"), [("tcp", []), ("threaded", ["allreduce"] * 3)])
def test_tcp_runs_synchronous_calls_on_the_lane_and_threaded_on_the_general_path(backend: str,
                                                                                 general: list) -> None:
    """tcp's lane reads the sockets on the calling thread (``transport/tcp/direct``); the
    threaded backend has no lane, so every call takes the general path."""
    for r in run_ranks(backend, 2, _other_backends):
        assert r == [[8.0, 8.0], general]


def _subgroup_broadcast(rank: int, ws: int) -> dict:
    """A broadcast on a subgroup named by its global ``src`` (torch code's usual form) and by
    ``group_src``: both on the lane, with the right root."""
    import pyc10d as dist

    g = dist.new_group([1, 2])
    if rank == 0:
        return {}
    engine = g.engine if hasattr(g, "engine") else g._get_backend()
    general = _count_general(engine)
    got = []
    for i in range(3):
        for kw in ({"src": 2}, {"group_src": 1}, {"src": 1}):
            t = torch.full((3,), float(10 * rank + i))
            dist.broadcast(t, group=g, **kw)
            root = kw.get("src", 1 + kw.get("group_src", 0))
            got.append(torch.equal(t, torch.full((3,), float(10 * root + i))))
    return {"general": general, "right": got}


def test_subgroup_broadcast_by_global_src_takes_the_lane() -> None:
    """(It took the general path until 2026-11-28: 70 us a message against 17 on the lane.)"""
    for r in run_ranks("tcp", 3, _subgroup_broadcast)[1:]:
        assert r["general"] == [], r  # (before the fix: the six calls by ``src``)
        assert all(r["right"]), r


def _sync_works(rank: int, ws: int) -> dict:
    """Synchronous calls through the plugin on the lane, asked for their Work directly
    (``pg.allreduce`` with ``asyncOp=False``, as torch's front end asks): what each answers
    right after the call, and whether the Work keeps the tensors of a call alive."""
    import gc
    import weakref

    import torch.distributed as tdist
    from torch._C._distributed_c10d import AllreduceOptions

    pg = tdist.group.WORLD
    opts = AllreduceOptions()
    opts.asyncOp = False
    general = _count_general(_engine(tdist))
    a, b = torch.full((4,), float(rank + 1)), torch.full((4,), float(10 * (rank + 1)))
    pg.allreduce([a], opts).wait()  # the key's first call opens the arena on the general path
    general.clear()
    out = {}
    wa = pg.allreduce([a], opts)
    out["first"] = (wa.wait(), wa.is_completed(), wa.is_success(), wa.exception(), wa.result()[0] is a,
                    wa.get_future().value()[0] is a)
    wb = pg.allreduce([b], opts)
    out["second"] = (wb.wait(), wb.result()[0] is b, wb.get_future().value()[0] is b)
    out["same_work"] = wa is wb
    c = torch.ones(4)
    wc = pg.allreduce([c], opts)
    out["third"] = (wc.wait(), wc.result()[0] is c)  # (a future would hold its value until the next call)
    gone = weakref.ref(c)
    del c, wa, wb, wc
    gc.collect()
    out["released"] = gone() is None
    out["values"] = a.tolist()
    out["general"] = list(general)
    return out


def test_plugin_sync_calls_answer_one_refilled_work() -> None:
    """A synchronous call the lane ran through the plugin answers the group's one finished
    Work, refilled per call: right for the call just made (wait, result, future), and holding
    no call's tensor alive after torch drops it."""
    for r in run_ranks("pyc10d_shm", 2, _sync_works, dist_module="torch.distributed"):
        assert r["general"] == []
        assert r["first"] == (True, True, True, None, True, True)
        assert r["second"] == (True, True, True)
        assert r["third"] == (True, True)
        assert r["same_work"]
        assert r["released"]
        assert r["values"] == [6.0] * 4  # 1 + 2, then 3 + 3


def _refused_before_the_lane(rank: int, ws: int, module: str) -> list[str]:
    """Calls the table refuses raise on every try, an empty tensor too: the lane never runs
    them (its step is cached per key, so the second try is the one a lane would take)."""
    import importlib

    dist = importlib.import_module(module)
    dist.all_reduce(torch.ones(2))  # the arena / connections open
    errors = []
    calls = [("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(
                 torch.empty((8, 0), dtype=torch.int4), torch.empty((4, 0), dtype=torch.int4))),
             ("all_reduce", lambda: dist.all_reduce(torch.empty((0,), dtype=torch.uint4))),
             ("all_reduce", lambda: dist.all_reduce(torch.zeros(3, dtype=torch.bool), op=dist.ReduceOp.AVG))]
    for name, call in calls:
        for _ in range(3):
            try:
                call()
                errors.append(f"{name}: ran")
            except (RuntimeError, ValueError) as e:
                errors.append("refused" if ("invalid scalar type" in str(e) or "not supported" in str(e))
                              else f"{name}: {e}")
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t)
    errors.append("works" if t.tolist() == [3.0, 3.0] else f"after: {t.tolist()}")
    return errors


@pytest.mark.parametrize("backend,module", [("shm", "pyc10d"), ("tcp", "pyc10d"),
                                            ("pyc10d_tcp", "torch.distributed"),
                                            ("pyc10d_shm", "torch.distributed")])
def test_a_call_the_table_refuses_never_takes_the_lane(backend: str, module: str) -> None:
    for got in run_ranks(backend, 2, _refused_before_the_lane, module, dist_module=module):
        assert got == ["refused"] * 9 + ["works"], got
