"""torch's collective and abort hooks on the plugin's groups, held against Gloo's.

torch 2.14 fires a group's pre and post hooks from its C++ ``ProcessGroup`` methods, which the
plugin's Python group overrides, so they never fired there (``pyc10d.torch_backend.hooks``);
and the backend ``pg._get_backend(cpu)`` answered had no ``register_abort_hook``. Each test
runs the same body on Gloo and on pyc10d and wants the same record: on 2.13, where torch has
no hooks, both refuse alike.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _multirank import exited, run_ranks

import pyc10d.torch_backend  # registers the backends
from pyc10d.torch_backend.backend import TORCH_BACKEND_NAMES
from pyc10d.torch_version import HAS_ABORT_HOOKS, HAS_COLLECTIVE_HOOKS

pytestmark = pytest.mark.timeout(40)

PLUGIN = ["pyc10d", "pyc10d_tcp"]


def _run(backend: str, fn: Any, *args: Any, world: int = 2, may_exit: tuple[int, ...] = ()) -> list[Any]:
    return run_ranks(backend, world, fn, *args, dist_module="torch.distributed", timeout=30, pg_timeout=20,
                     may_exit=may_exit)


def _shapes(tensors: list[torch.Tensor]) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in tensors]


def _calls_with_hooks(rank: int, ws: int) -> Any:
    """The hooks' record of all_reduce, broadcast, barrier, an async all_reduce, send/recv,
    all_gather, reduce_scatter and a batched isend/irecv; then none after unregistering."""
    pg = dist.group.WORLD
    seen: list[tuple] = []

    def pre(a: Any) -> None:
        seen.append(("pre", str(a.name), a.async_op, _shapes(a.input_tensors), _shapes(a.output_tensors),
                     a.root, a.op_id))

    def post(a: Any) -> None:
        seen.append(("post", str(a.name), a.async_op, isinstance(a.work, dist.Work), a.op_id))

    try:
        pg.register_pre_hook(1, pre)
    except AttributeError as e:
        return ("no hooks", "register_pre_hook" in str(e))
    pg.register_post_hook(2, post)
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.broadcast(t, 1)
    dist.barrier()
    dist.all_reduce(t, async_op=True).wait()
    if rank == 0:
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
    dist.all_gather([torch.zeros(3) for _ in range(ws)], t)
    dist.reduce_scatter_tensor(torch.zeros(3), torch.ones(3 * ws))
    ops = [dist.P2POp(dist.isend, t, 1 - rank), dist.P2POp(dist.irecv, torch.zeros(3), 1 - rank)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    pg.unregister_pre_hook(1)
    pg.unregister_post_hook(2)
    pg.unregister_post_hook(99)  # (an unknown id: nothing, as torch's table)
    before = len(seen)
    dist.all_reduce(t)
    return seen, len(seen) - before, t.tolist()


@pytest.mark.parametrize("backend", PLUGIN)
def test_collective_hooks_fire_as_on_gloo(backend: str) -> None:
    gloo = _run("gloo", _calls_with_hooks)
    ours = _run(backend, _calls_with_hooks)
    if not HAS_COLLECTIVE_HOOKS:  # torch 2.13: no hooks, on Gloo nor here
        assert gloo == ours == [("no hooks", True)] * 2
        return
    for rank in (0, 1):
        seen, after, value = ours[rank]
        assert after == 0 and value == gloo[rank][2], ours[rank]
        names = [s[1].split(".")[-1] for s in seen if s[0] == "pre"]
        assert names == ["ALLREDUCE", "BROADCAST", "BARRIER", "ALLREDUCE", "SEND" if rank == 0 else "RECV",
                         "ALLGATHER", "REDUCE_SCATTER", "SEND", "RECV"], names
        assert seen == gloo[rank][0], f"rank {rank}: pyc10d\n{seen}\ngloo\n{gloo[rank][0]}"


def _hooks_under_ddp(rank: int, ws: int) -> Any:
    """Which calls torch's C++ (DDP's construction and reducer) makes, as the hooks see them."""
    names: list[str] = []
    dist.group.WORLD.register_pre_hook(1, lambda a: names.append(str(a.name).split(".")[-1]))
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    ddp(torch.ones(2, 4)).sum().backward()
    return sorted(set(names))


@pytest.mark.skipif(not HAS_COLLECTIVE_HOOKS, reason="torch before 2.14 has no collective hooks")
def test_hooks_see_the_calls_torch_cpp_makes() -> None:
    ours = _run("pyc10d_tcp", _hooks_under_ddp)
    assert ours == _run("gloo", _hooks_under_ddp) and "ALLREDUCE" in ours[0], ours


def _abort_hook(rank: int, ws: int, how: str) -> Any:
    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    calls: list[str] = []
    try:
        backend.register_abort_hook(7, lambda: calls.append("backend"))
    except (AttributeError, RuntimeError) as e:
        return ("refused", type(e).__name__, str(e))
    backend.register_abort_hook(8, lambda: calls.append("dropped"))
    backend.unregister_abort_hook(8)
    t = torch.ones(2)
    dist.all_reduce(t)
    if how == "abort":
        pg.abort()
        pg.abort()  # (a second abort runs no hook again)
        return calls
    if rank == 1:
        os._exit(3)
    try:
        dist.all_reduce(t)
        return "no error"
    except RuntimeError as e:
        error = str(e)
    pg.abort()  # (already aborted by the failure: the hook ran then, once)
    return calls, "rank 1" in error


@pytest.mark.parametrize("backend", PLUGIN)
def test_abort_hook_runs_once_on_abort(backend: str) -> None:
    ours = _run(backend, _abort_hook, "abort")
    if HAS_ABORT_HOOKS:
        assert ours == [["backend"], ["backend"]], ours
        gloo = _run("gloo", _abort_hook, "abort")  # (Gloo refuses: its C++ base has no abort hooks)
        assert gloo[0][:2] == ("refused", "RuntimeError") and "registerAbortHook" in gloo[0][2], gloo
    else:  # torch 2.13: torch's Backend has no abort hooks; neither does Gloo's nor ours
        assert ours[0][:2] == ("refused", "AttributeError") and "register_abort_hook" in ours[0][2], ours
        assert _run("gloo", _abort_hook, "abort")[0][:2] == ("refused", "AttributeError")


@pytest.mark.skipif(not HAS_ABORT_HOOKS, reason="torch before 2.14 has no abort hooks (test above checks it)")
def test_abort_hook_runs_once_after_a_peer_dies() -> None:
    res = _run("pyc10d_tcp", _abort_hook, "peer", may_exit=(1,))
    assert exited(res[1])
    assert res[0] == (["backend"], True), res[0]


def _backend_surface(rank: int, ws: int) -> Any:
    """For each name of torch's ``Backend``: what ``pg._get_backend(cpu)`` answers for it."""
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    out: dict[str, str] = {}
    for name in sorted(TORCH_BACKEND_NAMES):
        try:
            value = getattr(backend, name)
        except RuntimeError as e:  # a property torch's base refuses (mem_allocator)
            out[name] = f"refused: {e}"
            continue
        except AttributeError as e:
            out[name] = f"missing: {e}"
            continue
        out[name] = "answers"
        if callable(value) and name in ("allocate_tensor", "split", "_start_coalescing", "suspend"):
            try:
                value()
            except RuntimeError as e:
                out[name] = f"refused: {e}"
    t = torch.ones(2)
    backend.allreduce([t]).wait()  # torch's signature, torch's Work
    out["allreduce()"] = str(t.tolist())
    return out


def test_backend_answers_every_name_of_torch_backend() -> None:
    out = _run("pyc10d_tcp", _backend_surface, world=1)[0]
    missing = {k: v for k, v in out.items() if v.startswith("missing")}
    assert not missing, missing
    for name in ("allocate_tensor", "split", "_start_coalescing", "suspend", "mem_allocator"):
        if name in TORCH_BACKEND_NAMES:
            why = out[name]
            assert why.startswith("refused: Backend pyc10d_tcp does not support " + name), why
            assert "rank 0" in why, why
    assert out["allreduce()"] == "[1.0, 1.0]"


def _abort_hook_across_reconfigure(rank: int, ws: int) -> Any:
    """A re-formed group keeps its abort hooks; aborting its old engine does not run them."""
    calls: list[str] = []
    dist.group.WORLD._get_backend(torch.device("cpu")).register_abort_hook(1, lambda: calls.append("abort"))
    dist._reconfigure(uuid=1, handles=[dist._get_reconfigure_handle()]).wait()
    after_reconfigure = list(calls)
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.group.WORLD.abort()
    return after_reconfigure, calls


@pytest.mark.skipif(not HAS_ABORT_HOOKS, reason="torch before 2.14 has no abort hooks nor _reconfigure")
def test_abort_hook_stays_with_a_reconfigured_group() -> None:
    assert _run("pyc10d_tcp", _abort_hook_across_reconfigure, world=1) == [([], ["abort"])]


def _hooks_on_a_served_gloo_group(rank: int, ws: int) -> Any:
    """A subclass of the plugin's group (``GlooServedGroup``) stays itself while it has hooks."""
    pg = dist.group.WORLD
    names: list[str] = []
    plain = type(pg).__name__, pg.getBackendName()
    pg.register_pre_hook(1, lambda a: names.append(str(a.name).split(".")[-1]))
    with_hooks = (type(pg).__name__, isinstance(pg, type(pg).__mro__[1]), pg.getBackendName())
    dist.all_reduce(torch.ones(1))
    pg.unregister_pre_hook(1)
    return plain, with_hooks, type(pg).__name__, names


@pytest.mark.skipif(not HAS_COLLECTIVE_HOOKS, reason="torch before 2.14 has no collective hooks")
def test_hooks_keep_a_subclass_of_the_group_what_it_is() -> None:
    tb = pyc10d.torch_backend
    tb.serve_gloo()
    try:
        res = _run("gloo", _hooks_on_a_served_gloo_group)
    finally:
        tb.stop_serving_gloo()
    (plain, label), with_hooks, after, names = res[0]
    assert plain == after == "GlooServedGroup" and with_hooks == (plain, True, label), res
    assert names == ["ALLREDUCE"], res
