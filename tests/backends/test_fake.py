"""The fake backend: one process plays rank r of n; every collective returns at once.

Outputs keep the caller's shapes and dtypes; gathers, scatters and all-to-alls fill them
from this rank's own input (as torch's FakeProcessGroup does), reductions and broadcasts
leave tensors as they are. Argument checks are the real backends'.
"""

from __future__ import annotations

import pytest
import torch

import pyc10d as dist
from pyc10d.testing import FakeStore

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def fake():
    def init(rank: int, world_size: int) -> None:
        dist.init_process_group(backend="fake", rank=rank, world_size=world_size, store=FakeStore())

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def test_identity(fake) -> None:
    fake(5, 1024)  # any world size, one process
    assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (5, 1024, "fake")
    assert dist.group.WORLD._get_backend().getBackendName() == "fake"


def test_reductions_and_broadcasts_leave_tensors_alone(fake) -> None:
    fake(1, 4)
    t = torch.arange(6.0)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.broadcast(t, src=3)
    dist.reduce(t, dst=0)
    dist.all_reduce_coalesced([t, t.clone()])
    dist.barrier()
    dist.monitored_barrier()
    assert torch.equal(t, torch.arange(6.0))


def test_gathers_fill_outputs_with_own_input(fake) -> None:
    fake(1, 4)
    x = torch.arange(6.0).view(2, 3)
    outs = [torch.empty(2, 3) for _ in range(4)]
    dist.all_gather(outs, x)
    assert all(torch.equal(o, x) for o in outs)
    flat = torch.empty(8, 3)
    dist.all_gather_into_tensor(flat, x)
    assert torch.equal(flat, x.repeat(4, 1))
    outs = [torch.empty(2, 3) for _ in range(4)]
    dist.gather(x, outs, dst=1)
    assert all(torch.equal(o, x) for o in outs)
    dist.gather(x, None, dst=0)  # non-root: nothing to fill


def test_scatters_keep_this_ranks_chunk(fake) -> None:
    fake(2, 4)
    chunks = [torch.full((3,), float(r)) for r in range(4)]
    out = torch.empty(3)
    dist.scatter(out, chunks, src=2)
    assert torch.equal(out, chunks[2])
    out = torch.full((3,), -1.0)
    dist.scatter(out, None, src=0)
    assert torch.equal(out, torch.full((3,), -1.0))
    dist.reduce_scatter(out, chunks)
    assert torch.equal(out, chunks[2])
    out = torch.empty(3)
    dist.reduce_scatter_tensor(out, torch.cat(chunks))
    assert torch.equal(out, chunks[2])


def test_all_to_all_copies_inputs(fake) -> None:
    fake(0, 3)
    ins = [torch.full((2,), float(i)) for i in range(3)]
    outs = [torch.empty(2) for _ in range(3)]
    dist.all_to_all(outs, ins)
    assert all(torch.equal(o, i) for o, i in zip(outs, ins))
    inp, out = torch.arange(6.0), torch.empty(6)
    dist.all_to_all_single(out, inp)
    assert torch.equal(out, inp)


def test_point_to_point_completes_without_a_peer(fake) -> None:
    fake(0, 2)
    t = torch.ones(3)
    dist.send(t, 1)
    dist.recv(t, 1)
    assert dist.isend(t, 1).is_completed()
    work = dist.irecv(t, 1)
    assert work.is_completed() and work.source_rank() == 1
    assert torch.equal(t, torch.ones(3))


def test_async_work_is_done_at_once(fake) -> None:
    fake(0, 8)
    t = torch.ones(2)
    work = dist.all_reduce(t, async_op=True)
    assert work.is_completed() and work.is_success()
    assert work.get_future().wait() == [t]


def test_subgroups(fake) -> None:
    fake(3, 8)
    g = dist.new_group([1, 3, 5])
    assert (dist.get_rank(g), dist.get_world_size(g), dist.get_backend(g)) == (1, 3, "fake")
    outs = [torch.empty(2) for _ in range(3)]
    dist.all_gather(outs, torch.ones(2), group=g)
    assert all(torch.equal(o, torch.ones(2)) for o in outs)
    with pytest.warns(UserWarning, match="does not belong"):
        dist.all_reduce(torch.ones(1), group=dist.new_group([0, 1]))


def test_argument_checks_are_the_real_ones(fake) -> None:
    fake(0, 4)
    with pytest.raises(RuntimeError, match="allgather"):
        dist.all_gather([torch.empty(2)] * 3, torch.ones(2))  # 3 outputs for 4 ranks
    with pytest.raises(RuntimeError, match="world_size times input"):
        dist.all_gather_into_tensor(torch.empty(5), torch.ones(2))
    with pytest.raises(RuntimeError, match="invalid root rank: 4"):
        dist.broadcast(torch.ones(1), src=4)


def test_model_code_and_make_fx(fake) -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    fake(3, 8)

    def step(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        shards = torch.empty(8 * w.numel())
        dist.all_gather_into_tensor(shards, w)
        y = x @ shards.view(8 * w.shape[0], -1)
        dist.all_reduce(y)
        return y

    w, x = torch.randn(2, 4), torch.randn(5, 16)
    assert step(w, x).shape == (5, 4)
    gm = make_fx(step)(w, x)
    assert "mm" in str(gm.graph)
