"""``torch.distributed.shrink_group`` on the plugin's groups (``pyc10d.torch_backend.shrink``):
4 ranks, one SIGKILLed; the survivors shrink through torch's own function and all-reduce."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from _clock import bound
from _multirank import exited, run_ranks
from _shrink_common import (
    GROUP_TIMEOUT_S,
    SHRINK_BOUND_S,
    die_then_fail,
    store_host_dies_then_shrink,
    timed_shrink,
)

import pyc10d.torch_backend  # noqa: F401 - registers the backends
from pyc10d.testing import find_free_port
from pyc10d.torch_backend import TorchProcessGroup

BACKENDS = ["pyc10d_shm", "pyc10d_tcp"]


def _shrink_sub_then_world(rank: int, ws: int) -> dict[str, Any]:
    sub = dist.new_group([1, 2, 3])
    out: dict[str, Any] = {"error": die_then_fail(dist, rank, 2)}
    if rank in (1, 3):
        small, out["sub_s"] = timed_shrink(dist, [1], group=sub, shrink_flags=c10d.SHRINK_ABORT)
        t = torch.full((3,), float(rank))
        dist.all_reduce(t, group=small)
        # (Not ``get_process_group_ranks(small)``: torch 2.13 removes the excluded *group* ranks
        # from the parent's *global* ones there, [2, 3] here; the group itself is right.)
        out["sub"] = (t.tolist(), small.rank(), small.size(), small.group_desc,
                      isinstance(small, TorchProcessGroup))
    world, out["world_s"] = timed_shrink(dist, [2])
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    out["world"] = (t.tolist(), world is c10d._get_default_group(), dist.get_rank(), dist.get_world_size(),
                    world.group_desc, isinstance(world, TorchProcessGroup), dist.get_backend())
    return out


@pytest.mark.timeout(40)
@pytest.mark.parametrize("backend", BACKENDS)
def test_survivors_shrink_through_torch(backend: str) -> None:
    res = run_ranks(backend, 4, _shrink_sub_then_world, dist_module="torch.distributed", may_exit=(2,),
                    timeout=35, pg_timeout=20)
    assert exited(res[2])
    for rank in (0, 1, 3):
        out = res[rank]
        assert "rank 2" in out["error"], out["error"]
        assert out["world_s"] < bound(SHRINK_BOUND_S), out
        new = {0: 0, 1: 1, 3: 2}[rank]
        assert out["world"] == ([7.0] * 5, True, new, 3, "default:shrunken", True, backend), out
    for rank, new in ((1, 0), (3, 1)):
        out = res[rank]
        assert out["sub_s"] < bound(SHRINK_BOUND_S), out
        assert out["sub"][:3] == ([4.0] * 3, new, 2), out
        assert out["sub"][3].endswith(":shrunk") and out["sub"][4], out


def _store_host_dies(rank: int, ws: int, backend: str, port: int) -> dict[str, Any]:
    """Rank 0 hosts torch's TCPStore and dies: the shrink needs no store (torch's own path
    would clone it); a new group, which rendezvouses, fails on the lost store."""
    out = store_host_dies_then_shrink(dist, rank, ws, backend, port, shrink_flags=c10d.SHRINK_ABORT)
    t0 = time.monotonic()
    try:
        dist.new_group([0, 1, 2])  # (a member rendezvouses; a non-member asks nothing)
        out["new_group"] = "no error"
    except RuntimeError as e:
        out["new_group"] = f"{type(e).__name__}: {e}"
    out["new_group_s"] = time.monotonic() - t0
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(45)
@pytest.mark.parametrize("backend", BACKENDS)
def test_shrink_when_the_store_host_died(backend: str) -> None:
    res = run_ranks(backend, 4, _store_host_dies, backend, find_free_port(), init=False,
                    dist_module="torch.distributed", may_exit=(0,), timeout=40)
    assert exited(res[0])
    for rank in (1, 2, 3):
        out = res[rank]
        assert "rank 0" in out["error"], out["error"]
        assert out["shrink_s"] < bound(SHRINK_BOUND_S), out
        assert out["sum"] == ([6.0] * 3, rank - 1, 3), out
        assert out["new_group"].startswith("DistNetworkError"), out
        # fails on the lost store, not after the group's timeout: half of it, far above a 3x
        # slower machine's time
        assert out["new_group_s"] < GROUP_TIMEOUT_S / 2, out


def _other_devices(rank: int, ws: int) -> list[str]:
    pg = c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    out = [f"{backend.supports_shrinking} {backend.supports_splitting} {backend.rank()} {backend.size()}"]
    try:
        pg._get_backend(torch.device("cuda"))
    except RuntimeError as e:
        out.append(str(e))
    try:
        dist.shrink_group([rank])
    except RuntimeError as e:
        out.append(str(e))
    dist.barrier()
    return out


@pytest.mark.timeout(30)
def test_backend_lookup_and_refusals() -> None:
    res = run_ranks("pyc10d_tcp", 2, _other_devices, dist_module="torch.distributed", timeout=25)
    for rank, out in enumerate(res):
        assert out[0] == f"True False {rank} 2", out
        assert "device type cuda" in out[1], out
        assert out[2].startswith(f"Current rank {rank} is in the exclusion list"), out
