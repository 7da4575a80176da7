"""Differentiable collectives: each backward is the collective's adjoint.

* all_gather (concatenate every rank's shard) <-> reduce_scatter SUM (each rank gets the
  sum of everyone's gradient for its shard);
* all_to_all_single with splits (out, in) <-> all_to_all_single with splits (in, out).

They are ``torch.autograd.Function``s over the plain ops of :mod:`._ops`, so a traced
forward graph and a traced backward graph each show the plain collective and its
``wait_tensor`` (what ``torch.compile`` then runs), and eager mode starts the collective
asynchronously like every other functional op.
"""

from __future__ import annotations

from typing import Any

import torch

from ._ops import ops


class AllGatherIntoTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, group_size: int, group_name: str) -> torch.Tensor:
        ctx.group_size, ctx.group_name = group_size, group_name
        return ops.all_gather_into_tensor(input.contiguous(), group_size, group_name)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        out = ops.reduce_scatter_tensor(grad.contiguous(), "sum", ctx.group_size, ctx.group_name)
        return ops.wait_tensor(out), None, None


class ReduceScatterTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, reduce_op: str, group_size: int, group_name: str) -> torch.Tensor:
        if reduce_op.lower() != "sum":
            raise RuntimeError(f"reduce_scatter_tensor_autograd: only sum is differentiable, got {reduce_op!r}")
        ctx.group_size, ctx.group_name = group_size, group_name
        return ops.reduce_scatter_tensor(input.contiguous(), reduce_op, group_size, group_name)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out = ops.all_gather_into_tensor(grad.contiguous(), ctx.group_size, ctx.group_name)
        return ops.wait_tensor(out), None, None, None


class AllToAllSingle(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, output_split_sizes: list[int], input_split_sizes: list[int],
                group_name: str) -> torch.Tensor:
        ctx.splits = (list(output_split_sizes), list(input_split_sizes))
        ctx.group_name = group_name
        return ops.all_to_all_single(input.contiguous(), output_split_sizes, input_split_sizes, group_name)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        out = ops.all_to_all_single(grad.contiguous(), in_splits, out_splits, ctx.group_name)
        return ops.wait_tensor(out), None, None, None
