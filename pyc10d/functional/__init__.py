"""Functional collectives: ``torch.distributed._functional_collectives`` for pyc10d.

``import pyc10d.functional as ft_c``. Each collective returns a new tensor and leaves its
input alone. In eager mode the result is an :class:`AsyncCollectiveTensor`: the collective
runs while the caller computes, and the first use of the result waits for it. Under
``make_fx`` or ``torch.compile`` the call becomes the ``pyc10d_functional`` op followed by
``pyc10d_functional.wait_tensor``, both visible in the graph.

``group`` may be a ProcessGroup, its name, a list of ranks (tagged groups are found or
created), a 2-D list of ranks, a 1-D DeviceMesh or ``(mesh, dim)``. The ``*_autograd``
variants are differentiable; the others give no gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _preamble
from ..groups import get_rank
from ..types import as_reduce_op
from . import _eager, _inplace
from ._autograd import AllGatherIntoTensor, AllToAllSingle, ReduceScatterTensor
from ._groups import _expand_group, pg_by_name, resolve_group_name
from ._ops import NAMESPACE, ops
from .async_tensor import AsyncCollectiveTensor
from .async_tensor import wrap as _wrap_pending

__all__ = [
    "AsyncCollectiveTensor", "NAMESPACE", "all_gather_into_tensor_coalesced", "all_gather_tensor",
    "all_gather_tensor_autograd", "all_reduce", "all_reduce_coalesced", "all_to_all_single",
    "all_to_all_single_autograd", "broadcast", "permute_tensor", "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd", "reduce_scatter_tensor_coalesced", "wait_tensor",
    "all_gather_single", "all_gather_single_autograd", "all_gather_single_coalesced",
    "reduce_scatter_single", "reduce_scatter_single_autograd", "reduce_scatter_single_coalesced",
    "_expand_group", "_are_we_tracing", "_resolve_group_name",
]

_resolve_group_name = resolve_group_name


_are_we_tracing = _preamble.tracing
_preamble.trace_hook = _inplace.trace


def wrap(t: torch.Tensor) -> torch.Tensor:
    """The eager result: an AsyncCollectiveTensor while its collective runs; the plain tensor
    when it already finished (small messages run inline), so later uses of it skip the
    wrapper's dispatch."""
    return _wrap_pending(t) if _eager.is_pending(t) else t


def _eager_ok(t: torch.Tensor) -> bool:
    """Take the direct path: a plain tensor with data, outside any tracing."""
    return type(t) is torch.Tensor and not t.is_meta and not _are_we_tracing()


def _maybe_wrap(t: torch.Tensor) -> torch.Tensor:
    if _are_we_tracing():
        return ops.wait_tensor(t)
    return _wrap_pending(t) if _eager.is_pending(t) else t


def _op_name(op: Any) -> str:
    return op.lower() if isinstance(op, str) else as_reduce_op(op).op.name.lower()


def wait_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Wait for the collective that produces ``tensor`` and return it."""
    if isinstance(tensor, AsyncCollectiveTensor):
        return tensor.wait()
    if _eager_ok(tensor):  # eager: no op dispatch (and no copy) for a plain tensor
        return _eager.wait(tensor)
    return ops.wait_tensor(tensor)


def all_reduce(self: torch.Tensor, reduceOp: Any, group: Any, tag: str = "") -> torch.Tensor:  # noqa: N803
    name, op = resolve_group_name(group, tag), _op_name(reduceOp)
    if _eager_ok(self):
        return wrap(_eager.all_reduce(self, op, name))
    return _maybe_wrap(ops.all_reduce(self, op, name))


def all_reduce_coalesced(self: list[torch.Tensor], reduceOp: Any, group: Any, tag: str = "") -> list[torch.Tensor]:  # noqa: N803
    name, op = resolve_group_name(group, tag), _op_name(reduceOp)
    if all(_eager_ok(t) for t in self):
        return [wrap(t) for t in _eager.all_reduce_coalesced(self, op, name)]
    return [_maybe_wrap(t) for t in ops.all_reduce_coalesced(self, op, name)]


def _group_size(group: Any, tag: str) -> int:
    return _expand_group(group, tag)[2]


def all_gather_tensor(self: torch.Tensor, gather_dim: int, group: Any, tag: str = "") -> torch.Tensor:
    """Concatenate every rank's ``self`` along ``gather_dim``."""
    name, size = resolve_group_name(group, tag), _group_size(group, tag)
    if _eager_ok(self):
        res = wrap(_eager.all_gather_into_tensor(self, size, name))
    else:
        res = _maybe_wrap(ops.all_gather_into_tensor(self.contiguous(), size, name))
    return _regather(res, gather_dim, size)


def _regather(res: torch.Tensor, gather_dim: int, size: int) -> torch.Tensor:
    if gather_dim == 0:
        return res
    if isinstance(res, AsyncCollectiveTensor):
        res = res.wait()
    return torch.cat(torch.chunk(res, size, dim=0), dim=gather_dim)


def all_gather_tensor_autograd(self: torch.Tensor, gather_dim: int, group: Any, tag: str = "") -> torch.Tensor:
    """``all_gather_tensor`` whose backward reduce-scatters (sums) the gradient."""
    name, size = resolve_group_name(group, tag), _group_size(group, tag)
    res = _maybe_wrap(AllGatherIntoTensor.apply(self, size, name))
    return _regather(res, gather_dim, size)


def _scatter_input(self: torch.Tensor, scatter_dim: int, size: int) -> torch.Tensor:
    if self.size(scatter_dim) % size:
        raise ValueError(f"input dimension {scatter_dim} ({self.size(scatter_dim)}) must be a multiple of group_size {size}")
    if scatter_dim != 0:
        return torch.cat(torch.chunk(self, size, dim=scatter_dim))
    return self


def reduce_scatter_tensor(self: torch.Tensor, reduceOp: Any, scatter_dim: int, group: Any, tag: str = "") -> torch.Tensor:  # noqa: N803
    """Reduce every rank's ``self`` and give each rank its block along ``scatter_dim``."""
    name, size, op = resolve_group_name(group, tag), _group_size(group, tag), _op_name(reduceOp)
    inp = _scatter_input(self, scatter_dim, size)
    if _eager_ok(inp):
        return wrap(_eager.reduce_scatter_tensor(inp, op, size, name))
    return _maybe_wrap(ops.reduce_scatter_tensor(inp.contiguous(), op, size, name))


def reduce_scatter_tensor_autograd(self: torch.Tensor, reduceOp: Any, scatter_dim: int, group: Any,  # noqa: N803
                                   tag: str = "") -> torch.Tensor:
    """``reduce_scatter_tensor`` (sum) whose backward all-gathers the gradient."""
    name, size, op = resolve_group_name(group, tag), _group_size(group, tag), _op_name(reduceOp)
    inp = _scatter_input(self, scatter_dim, size)
    return _maybe_wrap(ReduceScatterTensor.apply(inp, op, size, name))


def all_gather_into_tensor_coalesced(self: list[torch.Tensor], group: Any, tag: str = "") -> list[torch.Tensor]:
    name, size = resolve_group_name(group, tag), _group_size(group, tag)
    if all(_eager_ok(t) for t in self):
        return [wrap(t) for t in _eager.all_gather_into_tensor_coalesced(self, size, name)]
    return [_maybe_wrap(t) for t in ops.all_gather_into_tensor_coalesced(self, size, name)]


def reduce_scatter_tensor_coalesced(inputs: list[torch.Tensor], reduceOp: Any, scatter_dim: list[int],  # noqa: N803
                                    group: Any, tag: str = "") -> list[torch.Tensor]:
    name, size, op = resolve_group_name(group, tag), _group_size(group, tag), _op_name(reduceOp)
    if len(scatter_dim) != len(inputs):
        raise ValueError(f"reduce_scatter_tensor_coalesced: {len(inputs)} inputs but {len(scatter_dim)} scatter dims")
    inputs = [_scatter_input(t, d, size) for t, d in zip(inputs, scatter_dim)]
    if all(_eager_ok(t) for t in inputs):
        return [wrap(t) for t in _eager.reduce_scatter_tensor_coalesced(inputs, op, size, name)]
    return [_maybe_wrap(t) for t in ops.reduce_scatter_tensor_coalesced(inputs, op, size, name)]


def _splits(sizes: Any) -> list[int]:
    if sizes is None:
        return []
    return [int(s) if not isinstance(s, torch.SymInt) else s for s in
            (sizes.tolist() if isinstance(sizes, torch.Tensor) else sizes)]


def _check_splits(output_split_sizes: Any, input_split_sizes: Any) -> None:
    if (output_split_sizes is None) != (input_split_sizes is None):
        raise ValueError("all_to_all_single: output_split_sizes and input_split_sizes must both be given or both be None")


def all_to_all_single(self: torch.Tensor, output_split_sizes: list[int] | None, input_split_sizes: list[int] | None,
                      group: Any, tag: str = "") -> torch.Tensor:
    """Rank i sends block j of its dim 0 (``input_split_sizes[j]`` rows) to rank j."""
    _check_splits(output_split_sizes, input_split_sizes)
    name = resolve_group_name(group, tag)
    outs, ins = _splits(output_split_sizes), _splits(input_split_sizes)
    if _eager_ok(self):
        return wrap(_eager.all_to_all_single(self, outs, ins, name))
    return _maybe_wrap(ops.all_to_all_single(self.contiguous(), outs, ins, name))


def all_to_all_single_autograd(self: torch.Tensor, output_split_sizes: list[int] | None,
                               input_split_sizes: list[int] | None, group: Any, tag: str = "") -> torch.Tensor:
    """``all_to_all_single`` whose backward sends the gradient back the way the data came."""
    _check_splits(output_split_sizes, input_split_sizes)
    name = resolve_group_name(group, tag)
    return _maybe_wrap(AllToAllSingle.apply(self, _splits(output_split_sizes), _splits(input_split_sizes), name))


def broadcast(self: torch.Tensor, src: int, group: Any, tag: str = "") -> torch.Tensor:
    """Every rank gets group rank ``src``'s ``self``."""
    name = resolve_group_name(group, tag)
    if _eager_ok(self):
        return wrap(_eager.broadcast(self, src, name))
    return _maybe_wrap(ops.broadcast(self, src, name))


def permute_tensor(self: torch.Tensor, src_dst: list[int], group: Any, tag: str = "") -> torch.Tensor:
    """Group rank ``i`` sends ``self`` to group rank ``src_dst[i]``; returns what this rank got."""
    name = resolve_group_name(group, tag)
    size = _group_size(group, tag)
    me = get_rank(pg_by_name(name))
    out_splits, in_splits = [0] * size, [0] * size
    for src, dst in enumerate(src_dst):
        if src == me:
            in_splits[dst] = self.numel()
        if dst == me:
            out_splits[src] = self.numel()
    return all_to_all_single(self, out_splits, in_splits, name)


# torch 2.13's names for the same operations.
all_gather_single = all_gather_tensor
all_gather_single_autograd = all_gather_tensor_autograd
all_gather_single_coalesced = all_gather_into_tensor_coalesced
reduce_scatter_single = reduce_scatter_tensor
reduce_scatter_single_autograd = reduce_scatter_tensor_autograd
reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
