"""pyc10d as a torch.distributed backend: torch's own API, DDP, DTensor and FSDP2 on it.

Every rank is a forked process running *torch.distributed* (``dist_module="torch.distributed"``)
initialised with ``pyc10d_shm`` / ``pyc10d_tcp``; results are compared with the same function
run on torch's Gloo, or with one process computing on the full batch.
"""

from __future__ import annotations

import copy
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _multirank import run_ranks
from torch._C import _distributed_c10d as c10d

import pyc10d.torch_backend as tb

pytestmark = pytest.mark.timeout(60)

BACKENDS = ["pyc10d_shm", "pyc10d_tcp"]
_GLOO: dict[tuple[str, int], Any] = {}


def _run(backend: str, world_size: int, fn: Any, *args: Any, **kw: Any) -> list[Any]:
    return run_ranks(backend, world_size, fn, *args, dist_module="torch.distributed", **kw)


def _gloo(fn: Any, world_size: int) -> list[Any]:
    """Gloo's answer for ``fn``, computed once per test session."""
    key = (fn.__name__, world_size)
    if key not in _GLOO:
        _GLOO[key] = _run("gloo", world_size, fn)
    return _GLOO[key]


def _wait(work: Any, async_op: bool) -> None:
    if async_op:  # torch's all_reduce_coalesced hands back the Work's future instead
        assert isinstance(work, (dist.Work, torch._C.Future))
        work.wait()


# -- torch.distributed's collectives -----------------------------------------------------------
def _collectives(rank: int, ws: int) -> dict[str, Any]:
    """Every collective torch's API offers, sync and with ``async_op=True``."""
    out: dict[str, Any] = {}
    for a in (False, True):
        k = "async" if a else "sync"
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
            t = torch.arange(5.0) + rank
            _wait(dist.all_reduce(t, op=op, async_op=a), a)
            out[f"{k} all_reduce {op}"] = t
        for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
            t = torch.tensor([rank + 1, 6, 7 * rank], dtype=torch.int32)
            _wait(dist.all_reduce(t, op=op, async_op=a), a)
            out[f"{k} all_reduce int {op}"] = t
        ts = [torch.full((2,), rank + 1.0), torch.full((3,), rank * 2.0)]
        _wait(dist.all_reduce_coalesced(ts, async_op=a), a)
        out[f"{k} all_reduce_coalesced"] = ts
        t = torch.full((3,), float(rank))
        _wait(dist.broadcast(t, src=ws - 1, async_op=a), a)
        out[f"{k} broadcast"] = t
        t = torch.arange(4.0) * (rank + 1)
        _wait(dist.reduce(t, dst=1, async_op=a), a)
        out[f"{k} reduce"] = t if rank == 1 else None
        outs = [torch.zeros(2) for _ in range(ws)]
        _wait(dist.all_gather(outs, torch.full((2,), rank + 0.5), async_op=a), a)
        out[f"{k} all_gather"] = outs
        o = torch.zeros(ws * 3)
        _wait(dist.all_gather_into_tensor(o, torch.full((3,), rank * 3.0), async_op=a), a)
        out[f"{k} all_gather_into_tensor"] = o
        o = torch.zeros(2)
        _wait(dist.reduce_scatter(o, [torch.full((2,), float(rank * 10 + i)) for i in range(ws)], async_op=a), a)
        out[f"{k} reduce_scatter"] = o
        o = torch.zeros(2)
        _wait(dist.reduce_scatter_tensor(o, torch.arange(2.0 * ws) * (rank + 1), async_op=a), a)
        out[f"{k} reduce_scatter_tensor"] = o
        o = torch.zeros(ws)
        _wait(dist.all_to_all_single(o, torch.arange(float(ws)) + 10 * rank, async_op=a), a)
        out[f"{k} all_to_all_single"] = o
        # uneven splits: rank r sends i + 1 rows to rank i
        o = torch.zeros(ws * (rank + 1))
        inp = torch.cat([torch.full((i + 1,), float(rank * 100 + i)) for i in range(ws)])
        work = dist.all_to_all_single(o, inp, output_split_sizes=[rank + 1] * ws,
                                      input_split_sizes=[i + 1 for i in range(ws)], async_op=a)
        _wait(work, a)
        out[f"{k} all_to_all_single uneven"] = o
        outs = [torch.zeros(1) for _ in range(ws)]
        _wait(dist.all_to_all(outs, [torch.tensor([rank * 10.0 + i]) for i in range(ws)], async_op=a), a)
        out[f"{k} all_to_all"] = outs
        g = [torch.zeros(2) for _ in range(ws)] if rank == 0 else None
        _wait(dist.gather(torch.full((2,), rank * 7.0), g, dst=0, async_op=a), a)
        out[f"{k} gather"] = g
        s = torch.zeros(2)
        sl = [torch.full((2,), i * 3.0) for i in range(ws)] if rank == ws - 1 else None
        _wait(dist.scatter(s, sl, src=ws - 1, async_op=a), a)
        out[f"{k} scatter"] = s
        _wait(dist.barrier(async_op=a), a)
    ts = [torch.full((2,), rank + 1.0), torch.full((3,), float(rank))]
    with dist.distributed_c10d._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    out["_coalescing_manager all_reduce"] = ts
    outs = [[torch.zeros(2), torch.zeros(1)] for _ in range(ws)]
    dist.all_gather_coalesced(outs, [torch.full((2,), rank + 0.5), torch.tensor([rank * 3.0])])
    out["all_gather_coalesced"] = outs
    # the object collectives ride on the tensor ones
    objs: list[Any] = [None] * ws
    dist.all_gather_object(objs, {"rank": rank, "tag": "x" * rank})
    out["all_gather_object"] = objs
    lst: list[Any] = [rank, str(rank)]
    dist.broadcast_object_list(lst, src=ws - 1)
    out["broadcast_object_list"] = lst
    got: list[Any] | None = [None] * ws if rank == 0 else None
    dist.gather_object(("g", rank), got, dst=0)
    out["gather_object"] = got
    one: list[Any] = [None]
    dist.scatter_object_list(one, [{"i": i} for i in range(ws)] if rank == 1 else None, src=1)
    out["scatter_object_list"] = one
    # point to point: a ring, blocking and non-blocking, then "from any source"
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    r = torch.zeros(2)
    if rank % 2 == 0:
        dist.send(torch.full((2,), float(rank)), dst=nxt)
        dist.recv(r, src=prv)
    else:
        dist.recv(r, src=prv)
        dist.send(torch.full((2,), float(rank)), dst=nxt)
    out["send/recv"] = r
    r = torch.zeros(1)
    works = [dist.isend(torch.tensor([rank + 0.25]), dst=nxt), dist.irecv(r, src=prv)]
    for w in works:
        w.wait()
    out["isend/irecv"] = r
    r = torch.zeros(1)
    ops = [dist.P2POp(dist.isend, torch.tensor([rank * 2.0]), nxt), dist.P2POp(dist.irecv, r, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch_isend_irecv"] = r
    if rank == 0:
        r = torch.zeros(1)
        out["recv any source"] = (dist.recv(r), r)
    elif rank == ws - 1:
        dist.send(torch.tensor([42.0]), dst=0)
    return out


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_collectives_equal_gloo(backend: str, world_size: int) -> None:
    got = _run(backend, world_size, _collectives)
    want = _gloo(_collectives, world_size)
    for rank, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys()
        for key in w:
            assert _same(g[key], w[key]), f"rank {rank} {key}: {g[key]} != gloo's {w[key]}"
    # and a few by hand, so that agreeing with Gloo is not the only evidence
    n = world_size
    assert torch.equal(got[0]["sync all_reduce RedOpType.SUM"], torch.arange(5.0) * n + n * (n - 1) / 2)
    assert torch.equal(got[1]["async reduce"], torch.arange(4.0) * n * (n + 1) / 2)
    assert got[0]["recv any source"][0] == n - 1


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# -- the low-level methods, by every name torch has used ---------------------------------------
def _low_level(rank: int, ws: int) -> dict[str, Any]:
    """Call the group's methods directly with torch's option objects (old and new names)."""
    pg = dist.group.WORLD
    out: dict[str, Any] = {"type": type(pg).__name__, "engine": pg.engine.backend_name}
    o = torch.zeros(2 * ws)
    pg._allgather_base(o, torch.full((2,), float(rank)), c10d.AllgatherOptions()).wait()
    out["_allgather_base"] = o
    outs, ins = [torch.zeros(ws), torch.zeros(2 * ws)], [torch.tensor([rank + 1.0]), torch.full((2,), -rank - 1.0)]
    pg.allgather_into_tensor_coalesced(outs, ins, c10d.AllgatherOptions()).wait()
    out["allgather_into_tensor_coalesced"] = outs
    opts = c10d.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    o = torch.zeros(1)
    pg._reduce_scatter_base(o, torch.arange(float(ws)) * (rank + 1), opts).wait()
    out["_reduce_scatter_base max"] = o
    outs = [torch.zeros(1), torch.zeros(2)]
    pg.reduce_scatter_tensor_coalesced(outs, [torch.ones(ws), torch.ones(2 * ws) * rank], c10d.ReduceScatterOptions()).wait()
    out["reduce_scatter_tensor_coalesced"] = outs
    o = torch.zeros(ws)
    pg.alltoall_base(o, torch.arange(float(ws)) + rank * 10, [], [], c10d.AllToAllOptions()).wait()
    out["alltoall_base"] = o
    ts = [torch.ones(3) * rank, torch.ones(1)]
    opts = c10d.AllreduceCoalescedOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    pg.allreduce_coalesced(ts, opts).wait()
    out["allreduce_coalesced max"] = ts
    t = torch.full((2,), float(rank))
    opts = c10d.ReduceOptions()
    opts.rootRank, opts.reduceOp = 0, dist.ReduceOp.MIN
    pg.reduce([t], opts).wait()
    out["reduce min"] = t if rank == 0 else None
    if rank == 0:
        r = torch.zeros(1)
        w = pg.recv_anysource([r], 7)
        w.wait()
        out["recv_anysource"] = (w._source_rank(), r)
    elif rank == 1:
        pg.send([torch.tensor([9.0])], 0, 7).wait()
    pg.monitored_barrier(timedelta(seconds=10), True)
    f = pg.allreduce([torch.ones(2) * rank], c10d.AllreduceOptions()).get_future()
    out["future"] = f.then(lambda fut: fut.value()[0] + 1).wait()
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_low_level_methods(backend: str) -> None:
    ws = 3
    res = _run(backend, ws, _low_level)
    kind = backend.split("_")[1]
    for rank, r in enumerate(res):
        assert r["type"] == "TorchProcessGroup" and r["engine"] == kind
        assert torch.equal(r["_allgather_base"], torch.arange(float(ws)).repeat_interleave(2))
        assert torch.equal(r["allgather_into_tensor_coalesced"][0], torch.arange(1.0, ws + 1))
        assert torch.equal(r["allgather_into_tensor_coalesced"][1], -torch.arange(1.0, ws + 1).repeat_interleave(2))
        assert r["_reduce_scatter_base max"].item() == rank * ws
        assert torch.equal(r["reduce_scatter_tensor_coalesced"][0], torch.tensor([float(ws)]))
        assert torch.equal(r["reduce_scatter_tensor_coalesced"][1], torch.full((2,), float(sum(range(ws)))))
        assert torch.equal(r["alltoall_base"], torch.arange(float(ws)) * 10 + rank)
        assert torch.equal(r["allreduce_coalesced max"][0], torch.full((3,), ws - 1.0))
        assert torch.equal(r["future"], torch.full((2,), sum(range(ws)) + 1.0))
    assert torch.equal(res[0]["reduce min"], torch.zeros(2))
    assert res[0]["recv_anysource"][0] == 1 and res[0]["recv_anysource"][1].item() == 9.0


def _functional(rank: int, ws: int) -> list[torch.Tensor]:
    """torch's functional collectives reach the group from C++ (by its name)."""
    import torch.distributed._functional_collectives as ft

    w = dist.group.WORLD
    results = [
        ft.all_reduce(torch.full((3,), rank + 1.0), "sum", w),
        ft.all_gather_tensor(torch.full((2,), float(rank)), 0, w),
        ft.reduce_scatter_tensor(torch.arange(2.0 * ws), "sum", 0, w),
        ft.all_to_all_single(torch.arange(float(ws)) + 10 * rank, None, None, w),
        ft.all_gather_into_tensor_coalesced([torch.full((2,), float(rank))], w)[0],
        ft.reduce_scatter_tensor_coalesced([torch.arange(2.0 * ws)], "sum", [0], w)[0],
        ft.broadcast(torch.full((2,), float(rank)), 1, w),
    ]
    return [(t.wait() if isinstance(t, ft.AsyncCollectiveTensor) else t).clone() for t in results]


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_collectives_equal_gloo(backend: str) -> None:
    assert _same(_run(backend, 2, _functional), _gloo(_functional, 2))


def _subgroup(rank: int, ws: int) -> list[float]:
    g = dist.new_group([0, 2])
    t = torch.tensor([rank + 1.0])
    if rank in (0, 2):
        dist.all_reduce(t, group=g)
    return t.tolist()


def test_new_group_runs_on_pyc10d() -> None:
    assert _run("pyc10d_tcp", 3, _subgroup) == [[4.0], [2.0], [4.0]]


def _init_over_tcp(rank: int, ws: int, port: int) -> tuple[float, str]:
    dist.init_process_group("pyc10d", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    kind = dist.group.WORLD.engine.backend_name
    dist.destroy_process_group()
    return t.item(), kind


def test_init_method_tcp_rendezvous_through_torchs_tcpstore() -> None:
    """torch's own TCPStore (behind a PrefixStore) carries pyc10d's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert _run("unused", 3, _init_over_tcp, port, init=False) == [(6.0, "shm")] * 3


def _auto_kind(rank: int, ws: int) -> str:
    return dist.group.WORLD.engine.backend_name


def test_registration_and_auto_picks_shm_on_one_host() -> None:
    for name in tb.BACKENDS:
        assert name in dist.Backend.backend_list
        assert dist.Backend.backend_capability[name] == ["cpu"]
    assert _run("pyc10d", 2, _auto_kind) == ["shm", "shm"]


def test_store_adapter_speaks_pyc10d() -> None:
    """The adapter gives pyc10d's transports torch's store, with pyc10d's timeout error."""
    from pyc10d.store.base import StoreTimeoutError

    store = tb.TorchStoreAdapter(dist.PrefixStore("p", dist.HashStore()), timedelta(seconds=5))
    store.set("a", "1")
    assert store.get("a") == b"1" and store.multi_get(["a"]) == [b"1"]
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.compare_set("c", "", "x") == b"x" and store.compare_set("c", "y", "z") == b"x"
    assert store.check(["a", "c"]) and not store.check(["missing"])
    assert store.delete_key("a") and not store.check(["a"])
    with pytest.raises(StoreTimeoutError, match="wait timeout after 50ms, keys: missing"):
        store.wait(["c", "missing"], timedelta(milliseconds=50))


def test_store_adapter_names_the_tcpstore_host() -> None:
    """Through torch's prefixes to its TCPStore: the host pyc10d's tcp transport routes
    towards to pick the address it advertises (None would mean "local": loopback)."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    nested = dist.PrefixStore("outer", dist.PrefixStore("inner", server))
    assert tb.TorchStoreAdapter(nested, timedelta(seconds=5)).host == "127.0.0.1"
    assert tb.TorchStoreAdapter(dist.HashStore(), timedelta(seconds=5)).host is None


def test_store_adapter_says_when_a_file_is_shared(tmp_path: Path) -> None:
    """A torch FileStore under the prefixes: ranks of other hosts may share it."""
    filed = dist.PrefixStore("p", dist.FileStore(str(tmp_path / "f"), 1))
    assert tb.TorchStoreAdapter(filed, timedelta(seconds=5)).shared_file
    assert not tb.TorchStoreAdapter(dist.HashStore(), timedelta(seconds=5)).shared_file


# -- errors keep pyc10d's wording --------------------------------------------------------------
def _desync(rank: int, ws: int, functional: bool) -> str:
    try:
        if functional:
            import torch.distributed._functional_collectives as ft

            fn = ft.all_reduce if rank == 0 else ft.broadcast
            (fn(torch.ones(2), "sum", dist.group.WORLD) if rank == 0 else fn(torch.ones(2), 0, dist.group.WORLD)).wait()
        elif rank == 0:
            dist.all_reduce(torch.ones(2))
        else:
            dist.broadcast(torch.ones(2), src=0, async_op=True).wait()
    except Exception as e:  # noqa: BLE001 - the message is the result
        result = f"{type(e).__name__}: {e}"
    else:
        result = "no error"
    # stay alive until every rank has its error: an early exit would be reported as a death
    store = dist.distributed_c10d._get_default_store()
    store.add("desync/done", 1)
    while store.add("desync/done", 0) < ws:
        time.sleep(0.01)
    return result


@pytest.mark.parametrize("backend", BACKENDS)
def test_desync_error_keeps_pyc10d_wording(backend: str) -> None:
    res = _run(backend, 2, _desync, False, pg_timeout=10)
    assert all("DistBackendError" in r and "desync" in r for r in res), res
    assert "rank 0 is running allreduce SUM, rank 1 is running broadcast (root 0)" in res[1]


def test_desync_error_through_functional_collectives() -> None:
    res = _run("pyc10d_shm", 2, _desync, True, pg_timeout=10)
    assert all("desync" in r for r in res), res


# -- DDP, DTensor, FSDP2 ----------------------------------------------------------------------
def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batch(ws: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(4 * ws, 6, generator=g), torch.randn(4 * ws, 3, generator=g)


def _train_reference(model: torch.nn.Module, ws: int, steps: int) -> list[list[torch.Tensor]]:
    """One process on the full batch: the gradients every rank must see."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    grads = []
    for step in range(steps):
        x, y = _batch(ws, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return grads


def _ddp(rank: int, ws: int, hook: bool) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    model = _mlp()
    want = _train_reference(copy.deepcopy(model), ws, 5)
    ddp = DistributedDataParallel(model)
    if hook:
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(5):
        x, y = _batch(ws, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[rank * 4:(rank + 1) * 4]), y[rank * 4:(rank + 1) * 4]).backward()
        for p, g in zip(model.parameters(), want[step]):
            torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)
        opt.step()


@pytest.mark.parametrize("backend", BACKENDS)
def test_ddp_with_comm_hook_equals_one_process(backend: str) -> None:
    _run(backend, 2, _ddp, True)


def test_ddp_default_reducer_equals_one_process() -> None:
    """No hook: DDP's C++ reducer calls ``allreduce`` on the group through torch's trampoline."""
    _run("pyc10d_shm", 3, _ddp, False)


def _dtensor(rank: int, ws: int) -> bool:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (ws,))
    full = torch.arange(4.0 * ws * 3).view(4 * ws, 3)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    assert torch.equal(sharded.to_local(), full[4 * rank:4 * (rank + 1)])
    return torch.equal(sharded.redistribute(mesh, [Replicate()]).to_local(), full)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtensor_shard_to_replicate(backend: str) -> None:
    assert _run(backend, 2, _dtensor) == [True, True]


def _fsdp2(rank: int, ws: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ws,))
    model = _mlp()
    want = _train_reference(copy.deepcopy(model), ws, 5)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(5):
        x, y = _batch(ws, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rank * 4:(rank + 1) * 4]), y[rank * 4:(rank + 1) * 4]).backward()
        for p, g in zip(model.parameters(), want[step]):
            torch.testing.assert_close(p.grad.full_tensor(), g, rtol=1e-5, atol=1e-6)
        opt.step()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fsdp2_equals_one_process(backend: str) -> None:
    _run(backend, 2, _fsdp2)
