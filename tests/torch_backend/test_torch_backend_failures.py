"""The plugin fails as pyc10d's own API does: a lost peer is named, in torch's error types.

torch's C++ (DDP's reducer, FSDP2) waits on the futures of pyc10d's works. A future completed
with ``set_exception`` looks *successful* to C++ (the exception is its value), and DDP's
reducer took the first tensor of that value: every survivor died of SIGSEGV. These tests kill
a rank under torch's DDP and check that every survivor raises, names the dead rank, and lives.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _multirank import run_ranks
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import pyc10d
import pyc10d.torch_backend  # registers the backends
from pyc10d.torch_backend.errors import to_torch

pytestmark = pytest.mark.timeout(45)

BACKENDS = ["pyc10d_shm", "pyc10d_tcp"]


def _run(backend: str, fn: Any, *args: Any, world: int = 3, pg_timeout: float = 20) -> list[Any]:
    return run_ranks(backend, world, fn, *args, dist_module="torch.distributed", may_exit=(1,),
                     timeout=30, pg_timeout=pg_timeout)


def _ddp_until_rank1_dies(rank: int, ws: int, hook: str) -> tuple[str, str, float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    if hook == "allreduce_hook":  # a Python hook: torch chains it on the work's future
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    died = 0.0
    try:
        for step in range(40):
            if step == 3:
                if rank == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                died = time.monotonic()
            ddp(torch.randn(8, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
    except RuntimeError as e:
        return (type(e).__name__, str(e), time.monotonic() - died)
    return ("finished", "", 0.0)


@pytest.mark.parametrize("hook", ["builtin", "allreduce_hook"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_ddp_survivors_raise_and_name_the_dead_rank(backend: str, hook: str) -> None:
    pg_timeout = 60
    res = _run(backend, _ddp_until_rank1_dies, hook, pg_timeout=pg_timeout)  # a survivor killed by a signal fails here
    for rank in (0, 2):
        kind, msg, took = res[rank]
        assert kind == "RuntimeError", res[rank]
        assert "rank 1" in msg and "allreduce" in msg, msg
        # named from the death, not at the timeout: a third of it (a 3x slower machine: seconds)
        assert took < pg_timeout / 3, f"rank {rank} named the death after {took:.1f}s"


def _all_reduce_until_rank1_dies(rank: int, ws: int) -> dict[str, Any]:
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        os._exit(17)
    out: dict[str, Any] = {}
    work = dist.all_reduce(t, async_op=True)
    try:
        work.wait()
    except Exception as e:  # noqa: BLE001
        out["wait"] = e
    out["exception"] = work.exception()
    try:
        work.get_future().wait()
    except Exception as e:  # noqa: BLE001
        out["future"] = e
    try:
        dist.all_reduce(t)  # the group is broken: the next call fails at once, same types
    except Exception as e:  # noqa: BLE001
        out["next"] = e
    return {k: (isinstance(v, dist.DistBackendError), isinstance(v, pyc10d.DistNetworkError), str(v))
            for k, v in out.items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_wait_exception_and_future_agree(backend: str) -> None:
    res = _run(backend, _all_reduce_until_rank1_dies)
    for rank in (0, 2):
        got = res[rank]
        assert set(got) == {"wait", "exception", "future", "next"}, got
        for how in ("wait", "exception", "next"):  # torch's type and pyc10d's at once
            assert got[how][:2] == (True, True), (how, got[how])
        assert "rank 1" in got["wait"][2], got["wait"]
        assert got["exception"][2] == got["wait"][2]
        # C++ sees the future failed; its text carries pyc10d's message
        assert got["wait"][2].split(" [flight recorder")[0] in got["future"][2], got["future"]


def test_to_torch_keeps_the_error_and_adds_torch_type() -> None:
    e = pyc10d.DistNetworkError("allreduce #3 in group 'g': rank 1 died")
    e.ranks = [1]  # type: ignore[attr-defined]
    t = to_torch(e)
    assert isinstance(t, dist.DistBackendError) and isinstance(t, pyc10d.DistNetworkError)
    assert str(t) == str(e) and t.ranks == [1] and type(e) is pyc10d.DistNetworkError
    timeout = to_torch(pyc10d.DistTimeoutError("Timed out"))
    assert isinstance(timeout, dist.DistBackendError) and isinstance(timeout, TimeoutError)
    assert isinstance(to_torch(pyc10d.DistStoreError("x")), dist.DistStoreError)
    plain = ValueError("bad input")
    assert to_torch(plain) is plain
    assert type(to_torch(pyc10d.DistNetworkError("a"))) is type(t)  # one class per pyc10d type


def _after_destroy(rank: int, ws: int) -> tuple[bool, str]:
    pg = dist.distributed_c10d._get_default_group()
    assert isinstance(pg, pyc10d.torch_backend.TorchProcessGroup)
    dist.destroy_process_group()
    try:
        pg.allreduce([torch.ones(2)])
    except dist.DistBackendError as e:
        return (True, str(e))
    return (False, "")


def test_a_destroyed_group_raises_torch_type() -> None:
    res = run_ranks("pyc10d_shm", 2, _after_destroy, dist_module="torch.distributed")
    for ok, msg in res:
        assert ok and "destroyed" in msg, msg


def _waiters_released(rank: int, ws: int, how: str) -> dict[str, Any]:
    """Rank 0 leaves three operations waiting for rank 1, which never joins: a sync all_reduce
    on a thread, a recv on another, an async all_reduce (its Work and its future); then
    ``how`` (``abort`` / ``shutdown``) must release every one of them at once."""
    import threading

    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        store.wait(["done"])
        return {}
    pg = dist.distributed_c10d._get_default_group()
    out: dict[str, Any] = {}

    def run(name: str, fn: Any) -> None:
        t0 = time.monotonic()
        try:
            fn()
            out[name] = ("returned", time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001
            out[name] = (f"{type(e).__name__}: {e}", time.monotonic() - t0)

    threads = [threading.Thread(target=run, args=("sync", lambda: dist.all_reduce(torch.ones(4)))),
               threading.Thread(target=run, args=("recv", lambda: dist.recv(torch.ones(4), src=1)))]
    for t in threads:
        t.start()
    time.sleep(0.3)
    work = dist.all_reduce(torch.ones(4), async_op=True)
    fut = work.get_future()
    time.sleep(0.2)
    start = time.monotonic()
    getattr(pg, how)()
    run("wait", work.wait)
    run("future", fut.wait)
    for t in threads:
        t.join(10)
    out["released_s"] = time.monotonic() - start
    store.set("done", "1")
    return out


@pytest.mark.parametrize("how", ["abort", "shutdown"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_abort_and_shutdown_release_every_waiter(backend: str, how: str) -> None:
    pg_timeout = 60
    res = run_ranks(backend, 2, _waiters_released, how, dist_module="torch.distributed", timeout=30,
                    pg_timeout=pg_timeout)
    got = res[0]
    assert set(got) == {"sync", "recv", "wait", "future", "released_s"}, got
    for name in ("sync", "recv", "wait", "future"):
        assert got[name][0].split(":")[0] in ("DistBackendError", "DistNetworkError", "RuntimeError"), got[name]
        assert "returned" not in got[name][0]
    # nothing waited the group timeout out: a third of it (a 3x slower machine: a few seconds)
    assert got["released_s"] < pg_timeout / 3, got


def _under_detail(rank: int, ws: int) -> dict[str, Any]:
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL
    t = torch.full((3,), rank + 1.0)
    dist.all_reduce(t)
    o = torch.zeros(2 * ws)
    dist.all_gather_into_tensor(o, torch.full((2,), float(rank)))
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    ddp(torch.full((3, 4), float(rank))).sum().backward()
    grad = ddp.module.weight.grad.clone()
    try:
        dist.all_reduce(torch.ones(3 + rank))  # shapes differ between the ranks
        mismatch = "no error"
    except dist.DistBackendError as e:
        mismatch = str(e)
    return {"sum": t.tolist(), "gather": o.tolist(), "grad": grad, "mismatch": mismatch}


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_distributed_debug_detail(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch wraps a C++ backend in its checking wrapper under DETAIL, and hands a Python
    ProcessGroup (the plugin's) through as it is: pyc10d's own checks name the mismatch."""
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    before = dist.get_debug_level()
    dist.set_debug_level_from_env()  # torch reads it on import: the forked ranks inherit this
    try:
        res = run_ranks(backend, 2, _under_detail, dist_module="torch.distributed", timeout=30, pg_timeout=10)
    finally:
        dist.set_debug_level(before)
    want_grad = torch.full((2, 4), 1.5)  # d(sum of outputs)/dW averaged over inputs 0 and 1
    for got in res:
        assert got["sum"] == [3.0, 3.0, 3.0] and got["gather"] == [0.0, 0.0, 1.0, 1.0]
        assert torch.equal(got["grad"], want_grad), got["grad"]
        assert "allreduce" in got["mismatch"] and "12 bytes" in got["mismatch"] and "16 bytes" in got["mismatch"], got
