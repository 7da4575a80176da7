"""World size 1: all_reduce, broadcast and barrier finish at the call (no channel, job or
thread), and still count, record and order like any operation."""

from __future__ import annotations

import pytest
import torch

import pyc10d as dist
from pyc10d.backends.work import CompletedWork

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(params=["tcp", "shm", "threaded"])
def one_rank(request: pytest.FixtureRequest):
    dist.init_process_group(backend=request.param, store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_trivial_operations_finish_at_the_call(one_rank) -> None:
    engine = one_rank._get_backend()
    seq = engine._get_sequence_number_for_group()
    x = torch.arange(4.0)
    for work in (dist.all_reduce(x, async_op=True), dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True),
                 dist.broadcast(x, 0, async_op=True), dist.barrier(async_op=True)):
        assert isinstance(work, CompletedWork) and work.is_completed() and work.is_success()
        assert work.wait() and work.exception() is None
    assert torch.equal(x, torch.arange(4.0))
    assert dist.all_reduce(x, async_op=True).get_future().wait() == [x]
    assert engine._get_sequence_number_for_group() == seq + 5
    rows = engine.recorder.entries()
    assert [r["op"] for r in rows[-5:]] == ["allreduce", "allreduce", "broadcast", "barrier", "allreduce"]
    assert all(r["state"] == "completed" for r in rows[-5:])


def test_what_has_work_to_do_still_does_it(one_rank) -> None:
    x = torch.arange(4.0)
    dist.all_reduce(x, op=dist._make_premul_sum(3.0))  # a factor to apply: the full path
    assert torch.equal(x, torch.arange(4.0) * 3)
    y = torch.ones(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="AVG"):  # the checks run before the short cut
        dist.all_reduce(y, op=dist.ReduceOp.AVG)
    with pytest.raises(RuntimeError, match="invalid root rank"):
        dist.broadcast(y, src=1)


def test_a_pending_operation_keeps_its_place(one_rank) -> None:
    """Behind a queued asynchronous operation the short cut steps aside: operations finish in
    issue order."""
    engine = one_rank._get_backend()
    gate = __import__("threading").Event()
    order = []

    def slow(comm) -> None:
        gate.wait(5)
        order.append("slow")

    first = engine._submit("allreduce", slow, [], None, False)
    second = dist.all_reduce(torch.ones(2), async_op=True)
    assert not isinstance(second, CompletedWork)
    gate.set()
    second.wait()
    assert first.is_completed() and order == ["slow"]
