"""Eager functional collectives run by the thread that waits for them, over real backends.

A large functional collective is queued for the group's progress thread; when its issuing
thread waits before the progress thread took it up, it runs there instead
(``Engine._run_here``). Ranks that wait in different orders, mixing functional ops of both
sizes with in-place ``async_op=True`` calls, must still run every collective in issue
order: on shm an out-of-order one would pair with another op's phase and fail the
descriptor check or hang, on tcp it would wait on another channel.
"""

from __future__ import annotations

import os
import random
import sys
import threading

import pytest
import torch

import pyc10d as dist
import pyc10d.functional as ft_c
from pyc10d.functional import _eager

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _multirank import run_ranks

BIG = 64 * 1024 // 4  # elements: 64 KiB of float32, above the inline limit (async)
SMALL = 3  # inline


def _mixed_waits(rank: int, world: int, seed: int) -> int:
    plan = random.Random(seed)  # the same collectives on every rank...
    rnd = random.Random(seed * 100 + rank)  # ...waited for in an order of each rank's own
    group = dist.group.WORLD
    total = world * (world + 1) / 2
    pending: list[tuple[str, object, torch.Tensor, float]] = []
    inputs = []
    for i in range(40):
        kind = plan.choice(["big", "small", "inplace"])
        count = BIG + i if kind != "small" else SMALL + i
        x = torch.full((count,), float(rank + 1))
        inputs.append(x)
        if kind == "inplace":
            t = x.clone()
            pending.append((kind, dist.all_reduce(t, async_op=True), t, total))
        else:
            pending.append((kind, ft_c.all_reduce(x, "sum", group), x, total))
        if rnd.random() < 0.3:  # wait for a random few, in random order
            rnd.shuffle(pending)
            k = rnd.randint(0, len(pending))
            for item in pending[:k]:
                _check(*item)
            pending = pending[k:]
    rnd.shuffle(pending)
    for item in pending:
        _check(*item)
    for x in inputs:  # the functional ops left their inputs alone
        assert bool((x == rank + 1).all())
    assert _eager.pending_count() == 0
    return len(inputs)


def _check(kind: str, handle: object, tensor: torch.Tensor, total: float) -> None:
    if kind == "inplace":
        handle.wait()  # type: ignore[attr-defined]
        out = tensor
    else:
        out = ft_c.wait_tensor(handle)  # type: ignore[arg-type]
    assert bool((out == total).all()), f"{kind}: got {out[:4]} instead of {total}"


@pytest.mark.timeout(50)
@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_waits_in_different_orders_keep_issue_order(backend: str) -> None:
    assert run_ranks(backend, 2, _mixed_waits, 7, timeout=45) == [40, 40]


def _waited_elsewhere(rank: int, world: int) -> bool:
    """A result waited for by a thread that did not issue it: the progress thread runs it."""
    x = torch.full((BIG,), float(rank + 1))
    y = ft_c.all_reduce(x, "sum", dist.group.WORLD)
    got: list[torch.Tensor] = []
    t = threading.Thread(target=lambda: got.append(ft_c.wait_tensor(y)))
    t.start()
    t.join(20)
    assert got and bool((got[0] == world * (world + 1) / 2).all())
    z = ft_c.wait_tensor(ft_c.all_reduce(x, "sum", dist.group.WORLD))  # and the next one as usual
    return bool((z == world * (world + 1) / 2).all())


@pytest.mark.timeout(40)
@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_result_waited_by_another_thread(backend: str) -> None:
    assert run_ranks(backend, 2, _waited_elsewhere, timeout=30) == [True, True]
