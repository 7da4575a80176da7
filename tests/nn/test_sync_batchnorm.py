"""SyncBatchNorm equals BatchNorm on the concatenated batch: outputs, input and weight grads."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import pyc10d
from pyc10d.nn import SyncBatchNorm
from pyc10d.testing import spawn_threads_and_init_comms

pytestmark = pytest.mark.timeout(60)


def _run(world_size: int, body: Any) -> dict[int, Any]:
    out: dict[int, Any] = {}

    @spawn_threads_and_init_comms(world_size=world_size, timeout=45)
    def ranks(_self: Any) -> None:
        out[pyc10d.get_rank()] = body(pyc10d.get_rank())

    ranks(None)
    return out


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("shape", [(12, 4), (6, 4, 5), (6, 4, 3, 3)], ids=["1d", "seq", "2d"])
@pytest.mark.parametrize("affine", [True, False])
def test_matches_batchnorm_on_whole_batch(world_size: int, shape: tuple[int, ...], affine: bool) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * 3 + 1
    w = torch.randn(*shape, generator=g)  # weights the outputs so the gradient is not trivial
    ref = nn.BatchNorm1d(4, affine=affine) if len(shape) < 4 else nn.BatchNorm2d(4, affine=affine)
    if affine:
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
            ref.bias.uniform_(-1, 1)
    xr = x.clone().requires_grad_()
    (ref(xr) * w).sum().backward()

    def body(rank: int) -> dict[str, Any]:
        bn = SyncBatchNorm.convert_sync_batchnorm(
            nn.BatchNorm1d(4, affine=affine) if len(shape) < 4 else nn.BatchNorm2d(4, affine=affine)
        )
        assert isinstance(bn, SyncBatchNorm)
        if affine:
            with torch.no_grad():
                bn.weight.copy_(ref.weight)
                bn.bias.copy_(ref.bias)
        xs = x.chunk(world_size)[rank].clone().requires_grad_()
        y = bn(xs)
        (y * w.chunk(world_size)[rank]).sum().backward()
        return {"y": y.detach(), "dx": xs.grad, "mean": bn.running_mean, "var": bn.running_var,
                "dw": bn.weight.grad if affine else None, "db": bn.bias.grad if affine else None}

    results = _run(world_size, body)
    with torch.no_grad():
        y_full = nn.functional.batch_norm(x, None, None, ref.weight, ref.bias, True, 0.0, ref.eps)
    for rank, r in results.items():
        torch.testing.assert_close(r["y"], y_full.chunk(world_size)[rank], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(r["dx"], xr.grad.chunk(world_size)[rank], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(r["mean"], ref.running_mean)
        torch.testing.assert_close(r["var"], ref.running_var)
    if affine:  # weight/bias grads are local sums: their sum over ranks is the whole-batch grad
        torch.testing.assert_close(sum(r["dw"] for r in results.values()), ref.weight.grad, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(sum(r["db"] for r in results.values()), ref.bias.grad, atol=1e-4, rtol=1e-5)


def test_eval_mode_and_no_group_are_plain_batchnorm() -> None:
    bn = SyncBatchNorm(3)
    x = torch.randn(5, 3)
    ref = nn.BatchNorm1d(3)
    torch.testing.assert_close(bn(x), ref(x))  # no process group initialised: local statistics
    bn.eval()
    ref.eval()
    torch.testing.assert_close(bn(x), ref(x))
    with pytest.raises(ValueError, match="expected at least 2D input"):
        bn(torch.randn(3))
