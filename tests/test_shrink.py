"""``pyc10d.shrink_group``: 4 ranks, one SIGKILLed; the survivors shrink the broken group
without it (no store, no rendezvous) and all-reduce on the shrunk group, renumbered."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import torch
from _clock import bound
from _multirank import exited, run_ranks
from _shrink_common import SHRINK_BOUND_S, die_then_fail, store_host_dies_then_shrink, timed_shrink

import pyc10d as dist
from pyc10d.distributed_c10d import SHRINK_ABORT, SHRINK_DEFAULT
from pyc10d.testing import find_free_port

BACKENDS = ["shm", "tcp"]


def _shrink_sub_then_world(rank: int, ws: int) -> dict[str, Any]:
    """A subgroup of global ranks [1, 2, 3] loses its rank 1 (global 2): ranks 1 and 3 shrink it
    (SHRINK_ABORT); then every survivor shrinks the world (SHRINK_DEFAULT), which aborts the
    other groups and renumbers the world."""
    sub = dist.new_group([1, 2, 3])
    out: dict[str, Any] = {"error": die_then_fail(dist, rank, 2)}
    if rank in (1, 3):
        small, out["sub_s"] = timed_shrink(dist, [1], group=sub, shrink_flags=SHRINK_ABORT)
        t = torch.full((3,), float(rank))
        dist.all_reduce(t, group=small)
        out["sub"] = (t.tolist(), small.rank(), small.size(), dist.get_process_group_ranks(small),
                      small.group_desc, dist.get_rank())  # the world is not renumbered
    world, out["world_s"] = timed_shrink(dist, [2])
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)  # the default group: the shrunk world
    out["world"] = (t.tolist(), world is dist.group.WORLD, dist.get_rank(), dist.get_world_size(),
                    dist.get_process_group_ranks(world), world.group_desc)
    if rank in (1, 3):
        try:  # aborted with the old world: the ranks it was made of mean something else now
            dist.all_reduce(torch.ones(1), group=small)
            out["old_sub"] = "no error"
        except RuntimeError as e:
            out["old_sub"] = str(e)
    # A group of the renumbered world derives from the shrunk one (no store either).
    pair = dist.new_group([0, 2])
    if dist.get_rank() in (0, 2):
        t = torch.full((2,), float(dist.get_rank() + 10))
        dist.all_reduce(t, group=pair)
        out["pair"] = t.tolist()
    return out


@pytest.mark.timeout(40)
@pytest.mark.parametrize("backend", BACKENDS)
def test_survivors_shrink_a_subgroup_then_the_world(backend: str) -> None:
    res = run_ranks(backend, 4, _shrink_sub_then_world, may_exit=(2,), timeout=35, pg_timeout=20)
    assert exited(res[2])
    for rank in (0, 1, 3):
        out = res[rank]
        assert "rank 2" in out["error"], out["error"]
        assert out["world_s"] < bound(SHRINK_BOUND_S), out
        new = {0: 0, 1: 1, 3: 2}[rank]
        assert out["world"] == ([7.0] * 5, True, new, 3, [0, 1, 2], "default:shrunken"), out
    for rank, new in ((1, 0), (3, 1)):
        out = res[rank]
        assert out["sub_s"] < bound(SHRINK_BOUND_S), out
        assert out["sub"] == ([4.0] * 3, new, 2, [1, 3], "1:shrunk", rank), out
        assert "aborted" in out["old_sub"] or "destroyed" in out["old_sub"], out["old_sub"]
    assert res[0]["pair"] == res[3]["pair"] == [22.0, 22.0]


def _shrink_with_store_host_dead(rank: int, ws: int, backend: str, port: int) -> dict[str, Any]:
    """Rank 0 hosts the TCPStore and dies: shrinking and what derives from the world need no
    store; a group of another backend (a rendezvous) fails naming the store."""
    out = store_host_dies_then_shrink(dist, rank, ws, backend, port)
    pair = dist.new_group([0, 1])  # derived: no store
    if dist.get_rank() < 2:
        t = torch.ones(2)
        dist.all_reduce(t, group=pair)
        out["pair"] = t.tolist()
    other = "tcp" if backend == "shm" else "shm"
    t0 = time.monotonic()
    try:
        dist.new_group([0, 1, 2], backend=other)
        out["other"] = "no error"
    except RuntimeError as e:
        out["other"] = f"{type(e).__name__}: {e}"
    out["other_s"] = time.monotonic() - t0
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(45)
@pytest.mark.parametrize("backend", BACKENDS)
def test_shrink_needs_no_store_when_its_host_died(backend: str) -> None:
    res = run_ranks(backend, 4, _shrink_with_store_host_dead, backend, find_free_port(), init=False,
                    may_exit=(0,), timeout=40)
    assert exited(res[0])
    for rank in (1, 2, 3):
        out = res[rank]
        assert "rank 0" in out["error"], out["error"]
        assert out["shrink_s"] < bound(SHRINK_BOUND_S), out
        assert out["sum"] == ([6.0] * 3, rank - 1, 3), out
        assert out["other"].startswith(("DistStoreError", "DistNetworkError", "DistTimeoutError")), out
        assert "store" in out["other"].lower(), out["other"]
    assert res[1]["pair"] == res[2]["pair"] == [2.0, 2.0]


def _bad_inputs(rank: int, ws: int) -> list[str]:
    out = []
    for args, kwargs in (((2,), {}), (([],), {}), (([1],), {"shrink_flags": 7}), ((["1"],), {}),
                         (([2],), {}), (([1, 1],), {}), (([0, 1],), {}), (([rank],), {})):
        try:
            dist.shrink_group(*args, **kwargs)
            out.append("no error")
        except (TypeError, ValueError, RuntimeError) as e:
            out.append(f"{type(e).__name__}: {e}")
    solo = dist.new_group([rank])
    try:
        dist.shrink_group([0], group=solo)
    except ValueError as e:
        out.append(f"{type(e).__name__}: {e}")
    dist.barrier()  # nothing was broken by the refusals
    return out


@pytest.mark.timeout(30)
def test_bad_inputs_raise_as_torch() -> None:
    res = run_ranks("tcp", 2, _bad_inputs, timeout=25)
    for rank, out in enumerate(res):
        assert out[0].startswith("TypeError: ranks_to_exclude must be a list, but got int"), out
        assert out[1].startswith("ValueError: ranks_to_exclude cannot be empty"), out
        assert out[2].startswith("ValueError: Invalid shrink_flags value: 7"), out
        assert out[3].startswith("TypeError: All elements in ranks_to_exclude must be integers"), out
        assert out[4].startswith("ValueError: Rank 2 at index 0 is out of bounds for group size 2"), out
        assert out[5].startswith("ValueError: Duplicate rank 1 found in ranks_to_exclude at index 1"), out
        assert out[6].startswith("ValueError: Cannot exclude all 2 ranks from process group"), out
        assert out[7].startswith(f"RuntimeError: Current rank {rank} is in the exclusion list"), out
        assert out[8].startswith("ValueError: Cannot shrink a process group with size 1"), out


def test_flags_are_torchs() -> None:
    import torch.distributed.distributed_c10d as c10d

    assert (SHRINK_DEFAULT, SHRINK_ABORT) == (c10d.SHRINK_DEFAULT, c10d.SHRINK_ABORT)
    assert dist.shrink_group.__name__ == "shrink_group"


def _leave_or_die(rank: int, ws: int, backend: str, store_path: str, hosts: list[int] | None) -> Any:
    """Rank 2 goes (threads: it returns; processes: SIGKILL), the others shrink the world."""
    if hosts is not None:  # ranks told they are on different hosts: ``auto`` builds ``hier``
        from pyc10d.backends import shm

        shm.host_identity = lambda: f"h{hosts[rank]}/boot/0"
    dist.init_process_group(backend, store=dist.FileStore(store_path, ws), rank=rank, world_size=ws,
                            timeout=timedelta(seconds=20))
    engine = dist.get_backend()
    if backend == "threaded":
        t = torch.ones(2)
        dist.all_reduce(t)
        if rank == 2:
            return None  # (the harness then destroys its world)
    else:
        die_then_fail(dist, rank, 2)
    world, took = timed_shrink(dist, [2], shrink_flags=SHRINK_ABORT)
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    out = (engine, type(world._get_backend()).__name__, t.tolist(), dist.get_rank(), took)
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(40)
@pytest.mark.parametrize("backend,hosts", [("threaded", None), ("auto", [0, 0, 1, 1])], ids=["threaded", "hier"])
def test_every_backend_shrinks(tmp_path, backend: str, hosts: list[int] | None) -> None:
    res = run_ranks(backend, 4, _leave_or_die, backend, str(tmp_path / "store"), hosts, init=False,
                    may_exit=(2,), timeout=35)
    engine, kind = ("threaded", "ThreadedBackend") if backend == "threaded" else ("hier", "HierBackend")
    for rank, new in ((0, 0), (1, 1), (3, 2)):
        assert res[rank][:4] == (engine, kind, [7.0] * 3, new), res[rank]
        assert res[rank][4] < bound(SHRINK_BOUND_S), res[rank]
