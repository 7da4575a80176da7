"""The Reducer's contract: bucket assignment, launch during backward, rebuild, errors, hooks.

Multi-rank cases run their ranks as threads (``threaded`` backend).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's spelling
from torch import nn

import pyc10d
from pyc10d.nn import DistributedDataParallel, GradBucket, compute_bucket_assignment_by_size
from pyc10d.testing import spawn_threads_and_init_comms

pytestmark = pytest.mark.timeout(60)
_LOCK = threading.Lock()


def _run(world_size: int, body: Any) -> dict[int, Any]:
    out: dict[int, Any] = {}

    @spawn_threads_and_init_comms(world_size=world_size, timeout=45)
    def ranks(_self: Any) -> None:
        rank = pyc10d.get_rank()
        out[rank] = body(rank)

    ranks(None)
    return out


def _floats(*numels: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.empty(n, dtype=dtype) for n in numels]


def test_assignment_closes_buckets_at_the_limit_in_index_order() -> None:
    tensors = _floats(10, 10, 10, 10, 10)  # 40 bytes each
    buckets, limits = compute_bucket_assignment_by_size(tensors, [80, 120])
    assert buckets == [[0, 1], [2, 3, 4]]
    assert limits == [80, 120]


def test_assignment_separates_dtypes_and_sparse() -> None:
    tensors = [*_floats(4), *_floats(4, dtype=torch.float64), *_floats(4), torch.empty(3, 3)]
    buckets, _ = compute_bucket_assignment_by_size(tensors, [1000], [False, False, False, True])
    assert buckets == [[0, 2], [1], [3]]


def test_assignment_with_tensor_indices_keeps_fill_order() -> None:
    tensors = _floats(10, 10, 10, 10)
    buckets, _ = compute_bucket_assignment_by_size(tensors, [80], tensor_indices=[3, 2, 1, 0])
    assert buckets == [[3, 2], [1, 0]]


class Chain(nn.Module):
    """Layers registered in one order and used in another (c, a, b)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(16, 16, bias=False)
        self.b = nn.Linear(16, 4, bias=False)
        self.c = nn.Linear(8, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(F.relu(self.c(x)))))


def test_buckets_are_rebuilt_in_arrival_order() -> None:
    def body(rank: int) -> list[list[int]]:
        with _LOCK:
            model = Chain()
        ddp = DistributedDataParallel(model, bucket_cap_mb=200 / 2**20)
        before = ddp.reducer._bucket_param_indices()
        for _ in range(2):
            ddp(torch.randn(4, 8)).sum().backward()
        after = ddp.reducer._bucket_param_indices()
        assert before == [[2], [1], [0]]  # reversed registration: c, b, a
        return after

    results = _run(2, body)
    assert results[0] == results[1] == [[1], [0], [2]]  # gradients arrive b, a, c


def test_buckets_launch_during_backward() -> None:
    """The first bucket is reduced while later gradients have not been computed yet."""

    def body(rank: int) -> list[bool]:
        with _LOCK:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 16, bias=False),
                                  nn.ReLU(), nn.Linear(16, 4, bias=False))
        ddp = DistributedDataParallel(model, bucket_cap_mb=200 / 2**20)
        seen: list[tuple[int, bool, list[bool]]] = []

        def hook(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
            seen.append((bucket.index(), bucket.is_last(), [p.grad is None for p in model.parameters()]))
            assert all(g.data_ptr() >= bucket.buffer().data_ptr() for g in bucket.gradients())
            assert len(bucket.parameters()) == len(bucket.gradients())
            fut = pyc10d.all_reduce(bucket.buffer(), async_op=True).get_future()
            return fut.then(lambda f: f.value()[0] / 2)

        ddp.register_comm_hook(None, hook)
        ddp(torch.randn(4, 8)).sum().backward()
        assert [s[0] for s in seen] == [0, 1, 2]
        assert [s[1] for s in seen] == [False, False, True]
        return seen[0][2]

    for grads_missing in _run(2, body).values():
        assert any(grads_missing)  # some .grad still unset when bucket 0 went out


def test_unused_parameter_without_find_unused_fails_next_forward() -> None:
    class Unused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(4, 4)
            self.unused = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    def body(rank: int) -> str:
        ddp = DistributedDataParallel(Unused())
        ddp(torch.randn(2, 4)).sum().backward()
        with pytest.raises(RuntimeError, match="Expected to have finished reduction") as err:
            ddp(torch.randn(2, 4))
        assert ddp._get_ddp_logging_data()["has_error"]
        return str(err.value)

    for msg in _run(2, body).values():
        assert "2 3" in msg  # the unused weight and bias, by index


def test_sparse_embedding_gradients_are_averaged() -> None:
    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.emb = nn.Embedding(20, 6, sparse=True)
            self.fc = nn.Linear(6, 3)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.fc(self.emb(idx).mean(1))

    g = torch.Generator().manual_seed(3)
    idx, target = torch.randint(0, 20, (4, 5), generator=g), torch.randn(4, 3, generator=g)
    ref = Bag()
    F.mse_loss(ref(idx), target).backward()

    def body(rank: int) -> dict[str, torch.Tensor]:
        with _LOCK:
            model = Bag()
        ddp = DistributedDataParallel(model)
        F.mse_loss(ddp(idx.chunk(2)[rank]), target.chunk(2)[rank]).backward()
        assert model.emb.weight.grad.is_sparse
        return {n: p.grad.to_dense() for n, p in model.named_parameters()}

    for grads in _run(2, body).values():
        for n, p in ref.named_parameters():
            torch.testing.assert_close(grads[n], p.grad.to_dense())


def test_construction_broadcasts_rank0_state_and_forward_syncs_buffers() -> None:
    def body(rank: int) -> list[torch.Tensor]:
        model = nn.BatchNorm1d(3)
        with torch.no_grad():
            model.weight.fill_(rank + 1.0)
        model.running_mean.fill_(float(rank))
        ddp = DistributedDataParallel(model)
        assert torch.equal(model.weight, torch.ones(3))
        model.running_mean.fill_(float(rank) + 5)  # drifts; the next forward re-syncs from rank 0
        ddp.eval()
        ddp(torch.randn(2, 3))
        return [model.weight.detach().clone(), model.running_mean.clone()]

    for weight, mean in _run(3, body).values():
        assert torch.equal(weight, torch.ones(3))
        assert torch.equal(mean, torch.full((3,), 5.0))


def test_comm_hook_checks() -> None:
    def body(rank: int) -> None:
        ddp = DistributedDataParallel(nn.Linear(2, 2))
        with pytest.raises(TypeError, match="Communication hook must be callable"):
            ddp.register_comm_hook(None, 1)  # type: ignore[arg-type]

        def bad_return(state: object, bucket: GradBucket) -> int:
            return 0

        with pytest.raises(ValueError, match="return annotation should be torch.futures.Future"):
            ddp.register_comm_hook(None, bad_return)  # type: ignore[arg-type]

    _run(2, body)


@pytest.mark.parametrize(
    "kwargs", [{}, {"gradient_as_bucket_view": True}, {"static_graph": True}], ids=["plain", "as_view", "static"]
)
def test_global_and_local_unused_parameters(kwargs: dict[str, Any]) -> None:
    """CPU half of the seed's test_global_local_unused_params_grad (its GPU half needs 2 GPUs).

    A parameter unused on one rank but used on another gets the average (the absent rank
    counting zero); a parameter no rank used keeps ``grad is None``.
    """

    class Task(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.Parameter(torch.ones(2, 2))

        def forward(self, x: Any) -> torch.Tensor:
            return self.p + x

    class GlobalLocalUnused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.t0, self.t1, self.task_unused = Task(), Task(), Task()

        def forward(self, x: Any, rank: int) -> torch.Tensor:
            return self.t0(x) if rank == 0 else self.t1(x)

    def body(rank: int) -> list[Any]:
        model = DistributedDataParallel(GlobalLocalUnused(), find_unused_parameters=True, **kwargs)
        out = []
        for _ in range(2):
            for p in model.parameters():
                p.grad = None
            model(8, rank).mean().backward()
            m = model.module
            out.append([m.t0.p.grad, m.t1.p.grad, m.task_unused.p.grad])
        return out

    for iterations in _run(2, body).values():
        for t0_grad, t1_grad, unused_grad in iterations:
            torch.testing.assert_close(t0_grad, torch.full((2, 2), 0.125))  # (0.25 + 0) / 2
            torch.testing.assert_close(t1_grad, torch.full((2, 2), 0.125))
            assert unused_grad is None
