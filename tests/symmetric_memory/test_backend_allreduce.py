"""``dist.all_reduce`` of a symmetric tensor on the shm backend reduces out of the peers'
memory (``two_shot_all_reduce_``); a rank passing an ordinary tensor instead is an error
naming both calls, not a hang."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _multirank import run_ranks

import pyc10d as dist
import pyc10d.symmetric_memory as symm
from pyc10d.backends import shm

pytestmark = pytest.mark.timeout(60)


def _body(rank: int, ws: int) -> str:
    name = dist.group.WORLD.group_name
    symm.enable_symm_mem_for_group(name)
    numel = shm.SYMMETRIC_MIN_BYTES // 4 * 3 + 5  # above the threshold, not a multiple of ws
    t = symm.empty_strided_p2p((numel,), (1,), torch.float32, "cpu", name)
    calls = []
    engine = dist.group.WORLD._get_backend()
    real = engine.symmetric_allreduce
    assert real is not None  # the group's engine learnt of its symmetric memory

    def spy(x, op, group):
        plan = real(x, op, group)
        calls.append(plan is not None)
        return plan

    engine.symmetric_allreduce = spy
    try:
        for op, want in ((dist.ReduceOp.SUM, ws * (ws + 1) / 2), (dist.ReduceOp.MAX, ws),
                         (dist.ReduceOp.AVG, (ws + 1) / 2), (dist.ReduceOp.MIN, 1)):
            t.copy_(torch.arange(numel, dtype=torch.float32) * 0 + rank + 1)
            dist.all_reduce(t, op=op)
            assert torch.all(t == want), (op, t[:4])
        # asked by the lane (which it declines) and by the general path, for each of the four
        assert calls == [True] * 8, calls
        ordinary = torch.full((numel,), float(rank))
        dist.all_reduce(ordinary)
        assert calls[-1] is False and torch.all(ordinary == ws * (ws - 1) / 2)
    finally:
        engine.symmetric_allreduce = real
    # one rank symmetric, the others not: every rank fails naming the two calls
    try:
        dist.all_reduce(t if rank == 0 else torch.ones(numel))
    except RuntimeError as e:
        assert "allreduce_symmetric" in str(e), e
        return "raised"
    return "no error"


@pytest.mark.parametrize("chunk", [None, 4096], ids=["one-chunk", "many-chunks"])
@pytest.mark.parametrize("ws", [2, 3])
def test_all_reduce_of_symmetric_tensor(ws: int, chunk: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if chunk:
        monkeypatch.setenv("PYC10D_SYMM_CHUNK_BYTES", str(chunk))
    assert run_ranks("shm", ws, _body, timeout=40) == ["raised"] * ws


def _avg_of_random_values(rank: int, ws: int) -> tuple[torch.Tensor, torch.Tensor]:
    name = dist.group.WORLD.group_name
    symm.enable_symm_mem_for_group(name)
    numel = shm.SYMMETRIC_MIN_BYTES // 4 * 3 + 5
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    t = symm.empty_strided_p2p((numel,), (1,), torch.float32, "cpu", name)
    t.copy_(x)
    plain = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    dist.all_reduce(plain, op=dist.ReduceOp.AVG)
    return t.clone(), plain


@pytest.mark.parametrize("ws", [2, 3])
def test_avg_divided_once_and_the_same_on_every_rank(ws: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The symmetric path divides an AVG itself, chunk by chunk (the arena divides after):
    its result must match the arena's to rounding and be bit-identical across ranks."""
    monkeypatch.setenv("PYC10D_SYMM_CHUNK_BYTES", "4096")
    results = run_ranks("shm", ws, _avg_of_random_values, timeout=40)
    numel = results[0][0].numel()
    want = sum(torch.randn(numel, generator=torch.Generator().manual_seed(r)) for r in range(ws)) / ws
    for sym, plain in results:
        assert torch.equal(sym, results[0][0])
        torch.testing.assert_close(sym, plain)
        torch.testing.assert_close(sym, want)
