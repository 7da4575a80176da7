"""DDP on N ranks trains to the parameters of one process on the whole batch.

Each test trains a model for 20 SGD steps twice: once in one process on a global batch of
12, once under ``DistributedDataParallel`` with each of N ranks (threads, ``threaded``
backend) taking its 12/N slice, and compares parameters (and BatchNorm running stats) at
the end. Buckets are tiny (``bucket_cap_mb`` of a few KiB) so that they split the model
unevenly and several all-reduces overlap backward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as tdist
import torch.nn.functional as F  # noqa: N812 - torch's spelling
from torch import nn

import pyc10d
from pyc10d.nn import DistributedDataParallel, SyncBatchNorm
from pyc10d.nn.comm_hooks import (
    BuiltinCommHookType,
    PowerSGDState,
    allreduce_hook,
    bf16_compress_hook,
    fp16_compress_hook,
    powerSGD_hook,
)
from pyc10d.testing import spawn_threads_and_init_comms

pytestmark = pytest.mark.timeout(60)

STEPS = 20
BATCH = 12
LR = 0.05
_INIT_LOCK = threading.Lock()
SMALL_BUCKET_MB = 200 / 2**20  # 200 bytes: three or more uneven buckets for these models


class MLP(nn.Module):
    def __init__(self, unused_branch: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 4)
        self.unused = nn.Linear(32, 4) if unused_branch else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _batch(step: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, *shape, generator=g), torch.randn(BATCH, 4, generator=g)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "num_batches" not in k}


def _reference(make: Callable[[], nn.Module], shape: tuple[int, ...], micro: int = 1) -> dict[str, torch.Tensor]:
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        for m in range(micro):
            x, y = _batch(step * micro + m, shape)
            F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return _state(model)


def _run(world_size: int, body: Callable[[int], None]) -> None:
    @spawn_threads_and_init_comms(world_size=world_size, timeout=45)
    def ranks(_self: Any) -> None:
        body(pyc10d.get_rank())

    ranks(None)


def _train_ddp(
    rank: int, world_size: int, make: Callable[[], nn.Module], shape: tuple[int, ...],
    micro: int = 1, hook: Any = None, hook_state: Any = None, sync_bn: bool = False,
    builtin: Any = None, **ddp_kwargs: Any,
) -> dict[str, torch.Tensor]:
    with _INIT_LOCK:  # models seed torch's global generator: one rank-thread at a time
        model = make()
    if sync_bn:
        model = SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = DistributedDataParallel(model, bucket_cap_mb=SMALL_BUCKET_MB, **ddp_kwargs)
    if hook is not None:
        ddp.register_comm_hook(hook_state() if callable(hook_state) else hook_state, hook)
    if builtin is not None:
        ddp._register_builtin_comm_hook(builtin)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(STEPS):
        for m in range(micro):
            x, y = _batch(step * micro + m, shape)
            xs, ys = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
            if m < micro - 1:
                with ddp.no_sync():
                    F.mse_loss(ddp(xs), ys).backward()
            else:
                F.mse_loss(ddp(xs), ys).backward()
        opt.step()
        opt.zero_grad()
    assert len(ddp.reducer.buckets) >= 3, ddp.reducer._bucket_param_indices()
    return _state(model)


def _check(world_size: int, make: Callable[[], nn.Module], shape: tuple[int, ...], atol: float = 2e-5,
           rtol: float = 1.3e-5, micro: int = 1, **kwargs: Any) -> None:
    expected = _reference(make, shape, micro)
    results: dict[int, dict[str, torch.Tensor]] = {}

    def body(rank: int) -> None:
        results[rank] = _train_ddp(rank, world_size, make, shape, micro=micro, **kwargs)

    _run(world_size, body)
    assert sorted(results) == list(range(world_size))
    for rank, got in results.items():
        assert got.keys() == expected.keys()
        for k in expected:
            torch.testing.assert_close(got[k], expected[k], atol=atol, rtol=rtol, msg=lambda m, k=k, r=rank: f"rank {r} {k}: {m}")


WORLD_SIZES = [2, 3]
#: For the grids of hooks and modes: 2 ranks in make test (the tests above run 3 there too, so
#: odd world sizes are covered); 3 ranks in make test-full.
WORLD_SIZES_SHORT = [2, pytest.param(3, marks=pytest.mark.full)]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_mlp(world_size: int) -> None:
    _check(world_size, MLP, (8,))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_mlp_gradient_as_bucket_view(world_size: int) -> None:
    _check(world_size, MLP, (8,), gradient_as_bucket_view=True)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_mlp_find_unused_parameters(world_size: int) -> None:
    _check(world_size, lambda: MLP(unused_branch=True), (8,), find_unused_parameters=True)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_mlp_static_graph(world_size: int) -> None:
    _check(world_size, lambda: MLP(unused_branch=True), (8,), static_graph=True)


@pytest.mark.parametrize("world_size", WORLD_SIZES_SHORT)
@pytest.mark.parametrize("as_view", [False, True])
def test_mlp_no_sync_accumulation(world_size: int, as_view: bool) -> None:
    _check(world_size, MLP, (8,), micro=3, gradient_as_bucket_view=as_view)


@pytest.mark.parametrize("world_size", WORLD_SIZES_SHORT)
@pytest.mark.parametrize(
    "hook,atol",
    [(allreduce_hook, 2e-5), (fp16_compress_hook, 2e-3), (bf16_compress_hook, 2e-2)],
    ids=["allreduce", "fp16", "bf16"],
)
def test_mlp_builtin_hooks(world_size: int, hook: Any, atol: float) -> None:
    _check(world_size, MLP, (8,), atol=atol, rtol=atol, hook=hook)


@pytest.mark.parametrize("world_size", WORLD_SIZES_SHORT)
@pytest.mark.parametrize(
    "kind,atol",
    [(BuiltinCommHookType.ALLREDUCE, 2e-5), (BuiltinCommHookType.FP16_COMPRESS, 2e-3),
     (tdist.BuiltinCommHookType.FP16_COMPRESS, 2e-3)],
    ids=["allreduce", "fp16", "torch-fp16"],
)
def test_mlp_registered_builtin_hook(world_size: int, kind: Any, atol: float) -> None:
    """``_register_builtin_comm_hook`` by type, pyc10d's enum or torch's."""
    _check(world_size, MLP, (8,), atol=atol, rtol=atol, builtin=kind)


def test_builtin_hook_counts_as_the_one_hook() -> None:
    def body(rank: int) -> None:
        ddp = DistributedDataParallel(MLP())
        ddp._register_builtin_comm_hook(BuiltinCommHookType.FP16_COMPRESS)
        with pytest.raises(RuntimeError, match="register_comm_hook or register_builtin_comm_hook can only be called once"):
            ddp.register_comm_hook(None, allreduce_hook)
        with pytest.raises(ValueError, match="unknown built-in communication hook"):
            DistributedDataParallel(MLP())._register_builtin_comm_hook("FP16")

    _run(2, body)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_mlp_powersgd_full_rank_is_exact(world_size: int) -> None:
    """With rank >= min(n, m) PowerSGD's P Q^T is the exact average (error feedback sums to 0)."""
    def state() -> PowerSGDState:  # one per rank: it holds the rank's error feedback
        return PowerSGDState(None, matrix_approximation_rank=32, start_powerSGD_iter=3, min_compression_rate=0)

    _check(world_size, MLP, (8,), atol=1e-4, rtol=1e-4, hook=powerSGD_hook, hook_state=state)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_convnet_sync_batchnorm(world_size: int) -> None:
    """SyncBatchNorm on N ranks equals BatchNorm on the whole batch, running stats included."""
    _check(world_size, ConvNet, (3, 6, 6), sync_bn=True)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_convnet_sync_batchnorm_static_graph_as_view(world_size: int) -> None:
    _check(world_size, ConvNet, (3, 6, 6), sync_bn=True, static_graph=True, gradient_as_bucket_view=True)
