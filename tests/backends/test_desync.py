"""Ranks that call different collectives fail at once, naming each other: never a wrong
result returned as success, never a wait for the group timeout.

Every message of a collective carries its sender's fingerprint (collective, reduce op, root);
shm arenas compare descriptors. Each case runs on a fresh group and must raise on every rank
within 5 s on the 2-core VM's scale (``_clock.bound``; docs/failures.md: "within a few
seconds"; the group timeout here is 60 s), with a message naming what differs.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
from _clock import bound
from _multirank import BACKENDS, run_ranks
from _refs import Check

import pyc10d as dist

RING = {  # force ring algorithms on small tensors as well
    "pyc10d.algorithms.SMALL_ALLREDUCE": 1024,
    "pyc10d.algorithms.SMALL_BROADCAST": 1024,
    "pyc10d.algorithms.SMALL_REDUCE_SCATTER": 1024,
    "pyc10d.algorithms.segments.SEGMENT_BYTES": 256,
    "pyc10d.backends.shm.SLOT_BYTES": 4096,
}


def _cases(rank: int, ws: int) -> dict:
    red = dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX
    return {
        # name: (call on a group, words the error must contain)
        "reduce op, small all_reduce": (lambda g: dist.all_reduce(torch.ones(4), op=red, group=g), ["SUM", "MAX"]),
        "reduce op, large all_reduce": (lambda g: dist.all_reduce(torch.ones(5000), op=red, group=g), ["SUM", "MAX"]),
        "reduce op, reduce_scatter_tensor": (
            lambda g: dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * ws), op=red, group=g), ["SUM", "MAX"]),
        "collective": (
            lambda g: dist.all_reduce(torch.ones(4), group=g) if rank == 0 else dist.broadcast(torch.ones(4), src=0, group=g),
            ["allreduce", "broadcast"]),
        "every rank its own root": (lambda g: dist.broadcast(torch.ones(4), src=rank, group=g), ["root"]),
        "two roots": (lambda g: dist.broadcast(torch.ones(4), src=0 if rank < 2 else 1, group=g), ["root"]),
        "one extra all_reduce": (
            lambda g: (dist.all_reduce(torch.ones(4), group=g) if rank == 0 else None, dist.barrier(group=g)),
            ["allreduce", "barrier"]),
    }


def _desync(rank: int, ws: int) -> int:
    c = Check(rank)
    for what, (call, words) in _cases(rank, ws).items():
        g = dist.new_group(list(range(ws)), timeout=timedelta(seconds=60))
        t0 = time.monotonic()
        try:
            call(g)
            dist.barrier(group=g)  # a desync found after the call returned fails this instead
        except RuntimeError as e:
            took, msg = time.monotonic() - t0, str(e)
            c.true(took < bound(5.0), f"{what}: took {took:.1f}s")
            c.true("desync" in msg or "differs between ranks" in msg, f"{what}: not reported as a desync: {msg}")
            c.true(all(w in msg for w in words), f"{what}: message lacks {words}: {msg}")
        else:
            c.true(False, f"{what}: no error on rank {rank}")
    t = torch.ones(3)  # the world group was not involved and still works
    dist.all_reduce(t)
    c.true(torch.equal(t, torch.full((3,), float(ws))), "world all_reduce after the desyncs")
    return c.finish()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ring", [False, True], ids=["default", "ring"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_desync_raises_on_every_rank(backend: str, ring: bool) -> None:
    run_ranks(backend, 3, _desync, timeout=60, patches=RING if ring else None)


def _check_off(rank: int, ws: int) -> int:
    c = Check(rank)
    t = torch.ones(4)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)  # undetected when off
    c.true(t.shape == (4,), "ran")
    return c.finish()


@pytest.mark.timeout(60)
def test_desync_check_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYC10D_DESYNC_CHECK", "0")  # read by each group as it is made
    run_ranks("threaded", 2, _check_off, timeout=30)


def _tag_mismatch(rank: int, ws: int) -> int:
    c = Check(rank)
    g = dist.new_group(list(range(ws)), timeout=timedelta(seconds=60))
    t0 = time.monotonic()
    try:
        if rank == 0:
            dist.send(torch.ones(4), dst=1, group=g, tag=1)
        elif rank == 1:
            dist.recv(torch.empty(4), src=0, group=g, tag=2)
        dist.barrier(group=g)
    except RuntimeError as e:
        took, msg = time.monotonic() - t0, str(e)
        c.true(took < bound(5.0), f"tag mismatch: took {took:.1f}s")
        c.true("tag 2 from rank 0" in msg and "sent tag(s) 1" in msg, f"tag mismatch not named: {msg}")
    else:
        c.true(False, f"tag mismatch: no error on rank {rank}")
    return c.finish()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_p2p_tag_mismatch_raises_on_every_rank(backend: str) -> None:
    """rank 0 sends tag 1, rank 1 waits for tag 2: rank 1 names it after PYC10D_P2P_MISMATCH_S
    (2 s) and aborts the group, so rank 0 and rank 2 fail in their next call instead of waiting."""
    run_ranks(backend, 3, _tag_mismatch, timeout=40)
