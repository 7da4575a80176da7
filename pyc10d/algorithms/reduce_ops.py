"""Reduction kernels: vectorised torch ops applied in place, never per element in Python."""

from __future__ import annotations

import torch

from ..types import RedOpType, ReduceOp

_BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)


# The elementwise kernel of each reduction, out of place: (any dtype but bool, bool). AVG and
# PREMUL_SUM sum here (``finish`` divides; ``premultiply`` scaled the input before). A table,
# not an if chain: on an 8-byte all_reduce the chain cost as much as the kernel's dispatch.
_KERNELS = {
    RedOpType.SUM: (torch.add, torch.logical_or), RedOpType.AVG: (torch.add, torch.logical_or),
    RedOpType.PREMUL_SUM: (torch.add, torch.logical_or),
    RedOpType.PRODUCT: (torch.mul, torch.logical_and),
    RedOpType.MIN: (torch.minimum, torch.minimum), RedOpType.MAX: (torch.maximum, torch.maximum),
    RedOpType.BAND: (torch.bitwise_and, torch.bitwise_and),
    RedOpType.BOR: (torch.bitwise_or, torch.bitwise_or),
    RedOpType.BXOR: (torch.bitwise_xor, torch.bitwise_xor),
}


def kernel(op: ReduceOp, dtype: torch.dtype):  # a torch function
    """The function ``f(a, b, out=out)`` computing ``out = a (op) b`` for ``dtype``."""
    kernels = _KERNELS.get(op.op)
    if kernels is None:
        raise ValueError(f"unsupported reduction operation {op!r}")
    return kernels[dtype is torch.bool]


def reduce_pair(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, op: ReduceOp) -> None:
    """``out = a (op) b`` elementwise; ``out`` may be ``a``."""
    kernel(op, out.dtype)(a, b, out=out)


def reduce_into(acc: torch.Tensor, other: torch.Tensor, op: ReduceOp) -> None:
    """``acc = acc (op) other`` elementwise. AVG and PREMUL_SUM accumulate as sums."""
    reduce_pair(acc, acc, other, op)


def premultiply(t: torch.Tensor, op: ReduceOp) -> torch.Tensor:
    """For PREMUL_SUM, scale the local input by the op's factor before summing."""
    if op.op != RedOpType.PREMUL_SUM or op.factor is None:
        return t
    factor = op.factor
    if isinstance(factor, torch.Tensor):
        factor = factor.to(t.device)
    return t.mul_(factor)


def finish(t: torch.Tensor, op: ReduceOp, world_size: int) -> None:
    """AVG divides the sum by the number of contributions."""
    if op.op == RedOpType.AVG:
        t.div_(world_size)
