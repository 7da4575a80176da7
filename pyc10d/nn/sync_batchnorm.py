"""``SyncBatchNorm``: batch normalisation over the whole batch split across ranks.

In training, each rank's batch statistics are combined across the process group, so the
output and the gradients equal those of ``BatchNorm`` applied to the concatenated batch:

* forward: every rank gathers (count, mean, M2) of every rank in one ``all_gather`` and
  combines them with Chan's parallel formula (stable, unlike sum and sum of squares);
* backward: the input gradient needs the global means of ``dy`` and ``dy * x_hat``, one
  ``all_reduce`` of 2C numbers. The weight and bias gradients stay local sums, which DDP
  then averages, as for any parameter.

In eval mode, or on a group of one, it is plain ``BatchNorm``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's spelling
from torch import nn

from ..collectives import all_gather_into_tensor, all_reduce
from ..groups import _get_default_group, is_initialized


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _per_channel(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return v.view(1, -1, *([1] * (x.dim() - 2)))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
        running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
        eps: float, momentum: float, group: Any,
    ) -> torch.Tensor:
        channels = x.shape[1]
        dims = _reduce_dims(x)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        count = xf.numel() // channels if channels else 0
        local_mean = xf.mean(dims) if count else torch.zeros(channels, dtype=xf.dtype, device=x.device)
        local_m2 = ((xf - _per_channel(local_mean, xf)) ** 2).sum(dims)
        mine = torch.cat([torch.tensor([float(count)], dtype=xf.dtype, device=x.device), local_mean, local_m2])
        world = group.size()
        everyone = torch.empty(world * mine.numel(), dtype=mine.dtype, device=mine.device)
        all_gather_into_tensor(everyone, mine, group=group)
        everyone = everyone.view(world, -1)
        counts, means, m2s = everyone[:, :1], everyone[:, 1:1 + channels], everyone[:, 1 + channels:]
        total = counts.sum()
        if total <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got input size {list(x.shape)}"
            )
        mean = (counts * means).sum(0) / total
        m2 = (m2s + counts * (means - mean) ** 2).sum(0)
        var = m2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                unbiased = (m2 / (total - 1)).to(running_var.dtype)
                running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
        xhat = (xf - _per_channel(mean, xf)) * _per_channel(invstd, xf)
        out = xhat
        if weight is not None:
            out = out * _per_channel(weight.to(xf.dtype), xf)
        if bias is not None:
            out = out + _per_channel(bias.to(xf.dtype), xf)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.group, ctx.total, ctx.has_bias, ctx.in_dtype = group, total, bias is not None, x.dtype
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        xhat, invstd, weight = ctx.saved_tensors
        dims = _reduce_dims(xhat)
        gy = grad_out.to(xhat.dtype)
        sum_dy = gy.sum(dims)
        sum_dy_xhat = (gy * xhat).sum(dims)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            both = torch.cat([sum_dy, sum_dy_xhat])
            all_reduce(both, group=ctx.group)
            channels = sum_dy.numel()
            mean_dy = both[:channels] / ctx.total
            mean_dy_xhat = both[channels:] / ctx.total
            scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
            grad_input = (gy - _per_channel(mean_dy, gy) - xhat * _per_channel(mean_dy_xhat, gy)) \
                * _per_channel(scale, gy)
            grad_input = grad_input.to(ctx.in_dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = sum_dy_xhat.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(weight.dtype if weight is not None else sum_dy.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """``BatchNorm`` whose training statistics span every rank of ``process_group``."""

    def __init__(
        self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
        track_running_stats: bool = True, process_group: Any = None,
        device: Any = None, dtype: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:  # torch's name
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # torch's name
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        use_running = not self.training or self.track_running_stats
        running_mean = self.running_mean if use_running else None
        running_var = self.running_var if use_running else None
        group = None
        if bn_training and self.training and is_initialized():
            group = self.process_group if self.process_group is not None else _get_default_group()
        if group is None or group.size() == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                bn_training, factor, self.eps)
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, running_mean, running_var, self.eps, factor, group
        )

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group: Any = None) -> nn.Module:
        """Replace every ``BatchNorm*D`` in ``module`` by a ``SyncBatchNorm`` with its state."""
        out = module
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_group)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out
