"""The fused ops as torch operators, in pyc10d's own namespace ``pyc10d_symm_mem``.

torch registers them as ``torch.ops.symm_mem.*`` (CUDA only); pyc10d cannot take that
namespace without clashing with torch, so code written for torch swaps
``torch.ops.symm_mem`` for ``torch.ops.pyc10d_symm_mem`` and nothing else. Fake kernels
give shapes and strides only (the same as the eager results'), for meta tensors and tracing.
"""

from __future__ import annotations

import torch

from .._preamble import kernel_scope
from . import collectives, fused
from .fused import _group_size

NAMESPACE = "pyc10d_symm_mem"

_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define(
    "fused_all_gather_matmul(Tensor A_shard, Tensor[] Bs, int gather_dim, str group_name) -> (Tensor, Tensor[])")
_lib.define(
    "fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor")

_lib.define("two_shot_all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> Tensor(a!)")
_lib.define("one_shot_all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor")


def _ag_mm(A_shard: torch.Tensor, Bs: list[torch.Tensor], gather_dim: int,  # noqa: N803
           group_name: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    with kernel_scope():
        return fused.fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name)


def _mm_rs(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,  # noqa: N803
           group_name: str) -> torch.Tensor:
    with kernel_scope():
        return fused.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)


def _ag_mm_fake(A_shard: torch.Tensor, Bs: list[torch.Tensor], gather_dim: int,  # noqa: N803
                group_name: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    n = _group_size(group_name)
    shape = tuple(A_shard.movedim(gather_dim, 0).shape)
    gathered = A_shard.new_empty((n, *shape))
    outs = [A_shard.new_empty((n, *shape[:-1], B.shape[-1]), dtype=torch.promote_types(A_shard.dtype, B.dtype))
            for B in Bs]
    return (gathered.flatten(0, 1).movedim(0, gather_dim),
            [out.flatten(0, 1).movedim(0, gather_dim) for out in outs])


def _mm_rs_fake(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,  # noqa: N803
                group_name: str) -> torch.Tensor:
    shape = list(A.shape[:-1]) + [B.shape[-1]]
    shape[scatter_dim] //= _group_size(group_name)
    return A.new_empty(shape, dtype=torch.promote_types(A.dtype, B.dtype))


def _two_shot(input: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
    with kernel_scope():
        return collectives.two_shot_all_reduce_(input, reduce_op, group_name)


def _one_shot(input: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
    with kernel_scope():
        return collectives.one_shot_all_reduce(input, reduce_op, group_name)


_lib.impl("two_shot_all_reduce_", _two_shot, "CompositeExplicitAutograd")
_lib.impl("one_shot_all_reduce", _one_shot, "CompositeExplicitAutograd")
torch.library.register_fake(f"{NAMESPACE}::two_shot_all_reduce_", lambda input, reduce_op, group_name: input,
                            lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::one_shot_all_reduce",
                            lambda input, reduce_op, group_name: torch.empty_like(input), lib=_lib)
_lib.impl("fused_all_gather_matmul", _ag_mm, "CompositeExplicitAutograd")
_lib.impl("fused_matmul_reduce_scatter", _mm_rs, "CompositeExplicitAutograd")
torch.library.register_fake(f"{NAMESPACE}::fused_all_gather_matmul", _ag_mm_fake, lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::fused_matmul_reduce_scatter", _mm_rs_fake, lib=_lib)

ops = getattr(torch.ops, NAMESPACE)
