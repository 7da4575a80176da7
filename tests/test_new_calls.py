"""torch 2.14's new calls: ``gather_single`` (and its deprecated ``gather_into_tensor``),
``set_timeout`` and ``get_backend_impl`` / ``pg.get_backend(device)``.

On pyc10d's own API they exist on both torches; through the plugin (``torch.distributed``
initialised with ``pyc10d_shm`` / ``pyc10d_tcp``) only torch 2.14 makes these calls, so those
cases need it (``pyc10d.torch_version``). Gloo has no ``gather_single``: the reference is the
ranks' inputs themselves.
"""

from __future__ import annotations

import importlib
import time
import warnings
from datetime import timedelta
from typing import Any

import pytest
import torch
from _multirank import BACKENDS, failure_after, run_ranks

import pyc10d as dist
from pyc10d.torch_version import AT_LEAST_2_14

pytestmark = pytest.mark.timeout(60)
PLUGIN = ["pyc10d_shm", "pyc10d_tcp"]
needs_2_14 = pytest.mark.skipif(not AT_LEAST_2_14, reason="torch 2.13's API makes no such call")


def _gather_single(rank: int, ws: int, module: str) -> dict[str, Any]:
    d = importlib.import_module(module)
    out: dict[str, Any] = {}
    mine = torch.tensor([[rank, 10.0 * rank], [-rank, 0.5]])
    flat = torch.full((4 * ws,), -1.0) if rank == 0 else None
    d.gather_single(mine, flat, dst=0)
    out["flat"] = None if flat is None else flat.tolist()
    stacked = torch.full((ws, 2, 2), -1.0) if rank == ws - 1 else None
    d.gather_single(mine, stacked, dst=ws - 1, async_op=True).wait()
    out["stacked"] = None if stacked is None else stacked.tolist()
    sub = d.new_group([1, 2])
    if rank in (1, 2):
        into = torch.full((2,), -1.0) if rank == 2 else None
        d.gather_single(torch.tensor([float(rank)]), into, group=sub, group_dst=1)
        out["group_dst"] = None if into is None else into.tolist()
    errors = {}
    for name, bad in (("missing", None), ("size", torch.zeros(3)),
                      ("contiguous", torch.zeros(2 * ws, 2).t()), ("dtype", torch.zeros(4 * ws, dtype=torch.int64))):
        if rank == 0:
            try:
                d.gather_single(mine, bad, dst=0)
                errors[name] = "no error"
            except (ValueError, RuntimeError) as e:
                errors[name] = f"{type(e).__name__}: {e}"
    out["errors"] = errors
    t = torch.tensor([float(rank)])
    d.all_reduce(t)  # the group still works (no rank sent anything for the refused calls)
    out["after"] = t.item()
    return out


def _check_gather_single(results: list[dict[str, Any]], ws: int) -> None:
    rows = [[[r, 10.0 * r], [-r, 0.5]] for r in range(ws)]
    assert results[0]["flat"] == [x for row in rows for pair in row for x in pair]
    assert results[ws - 1]["stacked"] == rows
    assert results[2]["group_dst"] == [1.0, 2.0]
    assert all(r["flat"] is None for r in results[1:]) and results[1]["group_dst"] is None
    errors = results[0]["errors"]
    assert "gather_tensor must be specified on the destination rank" in errors["missing"]
    assert "gather_tensor" in errors["size"] and "world_size" in errors["size"], errors
    assert "contiguous" in errors["contiguous"], errors
    assert "no error" not in errors["dtype"], errors
    assert {r["after"] for r in results} == {sum(range(ws))}


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_single(backend: str) -> None:
    _check_gather_single(run_ranks(backend, 3, _gather_single, "pyc10d", timeout=40), 3)


@needs_2_14
@pytest.mark.parametrize("backend", PLUGIN)
def test_gather_single_through_torch(backend: str) -> None:
    results = run_ranks(backend, 3, _gather_single, "torch.distributed", dist_module="torch.distributed", timeout=40)
    _check_gather_single(results, 3)


def _timeout_after_set(rank: int, ws: int, module: str) -> str | None:
    """The group starts with 30 s; set_timeout(1 s), then rank 1 stays out of an all_reduce."""
    d = importlib.import_module(module)
    t = torch.ones(1)
    d.all_reduce(t)  # under the old timeout: fine
    d.set_timeout(timedelta(seconds=1))
    if rank == 1:
        time.sleep(4)
        return None
    t0 = time.monotonic()
    try:
        d.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - reported, the test asserts what it was
        return failure_after(t0, e)
    return "completed"


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_timeout_takes_effect_on_the_next_call(backend: str) -> None:
    got = run_ranks(backend, 2, _timeout_after_set, "pyc10d", pg_timeout=30, timeout=40)[0]
    seconds, _, rest = got.split(" ", 2)
    assert "Timed out" in rest and float(seconds) < 3.0, got


@needs_2_14
@pytest.mark.parametrize("backend", PLUGIN)
def test_set_timeout_through_torch(backend: str) -> None:
    got = run_ranks(backend, 2, _timeout_after_set, "torch.distributed", dist_module="torch.distributed",
                    pg_timeout=30, timeout=40)[0]
    seconds, kind, rest = got.split(" ", 2)
    assert kind == "torch" and "Timed out" in rest and float(seconds) < 3.0, got


def _backend_impl(rank: int, ws: int, module: str) -> dict[str, Any]:
    d = importlib.import_module(module)
    pg = d.group.WORLD
    impl = d.get_backend_impl()
    out = {
        "same": impl is pg.get_backend(torch.device("cpu")) or type(impl) is type(pg.get_backend(torch.device("cpu"))),
        "rank_size": (impl.rank(), impl.size()),
        "healthy": impl.failure() is None,  # a pyc10d engine's own call
    }
    if module == "pyc10d":
        out["by_name"] = d.get_backend_impl(d.group.WORLD.group_name) is impl
        out["is_engine"] = impl is pg._get_backend()
    other = d.new_group([0])
    if rank:
        try:
            d.get_backend_impl(other)
            out["outside"] = "no error"
        except ValueError as e:
            out["outside"] = str(e)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_backend_impl(backend: str) -> None:
    results = run_ranks(backend, 2, _backend_impl, "pyc10d", timeout=40)
    for rank, r in enumerate(results):
        assert r["same"] and r["by_name"] and r["is_engine"] and r["healthy"], r
        assert r["rank_size"] == (rank, 2)
    assert results[1]["outside"] == "Invalid process group specified"


@needs_2_14
@pytest.mark.parametrize("backend", PLUGIN)
def test_get_backend_impl_through_torch(backend: str) -> None:
    results = run_ranks(backend, 2, _backend_impl, "torch.distributed", dist_module="torch.distributed", timeout=40)
    for rank, r in enumerate(results):
        assert r["same"] and r["healthy"] and r["rank_size"] == (rank, 2), r
    assert results[1]["outside"] == "Invalid process group specified"


def _deprecated_name(rank: int, ws: int) -> list[str]:
    into = torch.zeros(ws) if rank == 0 else None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dist.gather_into_tensor(torch.tensor([rank + 1.0]), into, dst=0)
    assert into is None or into.tolist() == [1.0, 2.0]
    return [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]


def test_gather_into_tensor_is_the_deprecated_name() -> None:
    for messages in run_ranks("tcp", 2, _deprecated_name, timeout=40):
        assert messages == ["`pyc10d.gather_into_tensor` is deprecated. Please use `pyc10d.gather_single` instead."]
