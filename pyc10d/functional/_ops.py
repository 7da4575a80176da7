"""The functional collectives as torch operators: the names a traced graph shows.

Every op is defined once here, in the ``pyc10d_functional`` namespace, with

* a schema (groups travel as their name, a string, so graphs hold no Python objects),
* a fake kernel (shapes only), used for meta tensors, ``make_fx(tracing_mode="fake")`` and
  ``torch.compile``,
* the eager kernel from :mod:`._eager` for real tensors, and
* an autograd kernel that runs below autograd and hands back outputs without a gradient:
  these ops are not differentiable (the ``*_autograd`` functions in :mod:`._autograd` are).

A graph reads ``pyc10d_functional.all_reduce`` ... followed by ``pyc10d_functional.wait_tensor``
on its result; a compiled program calls the same ops, so it moves bytes the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._preamble import kernel_scope
from . import _eager, _inductor

NAMESPACE = "pyc10d_functional"

_lib = torch.library.Library(NAMESPACE, "DEF")

_SCHEMAS: dict[str, str] = {
    "all_reduce": "(Tensor input, str reduce_op, str group_name) -> Tensor",
    "all_reduce_coalesced": "(Tensor[] inputs, str reduce_op, str group_name) -> Tensor[]",
    "all_gather_into_tensor": "(Tensor input, int group_size, str group_name) -> Tensor",
    "all_gather_into_tensor_coalesced": "(Tensor[] inputs, int group_size, str group_name) -> Tensor[]",
    "reduce_scatter_tensor": "(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor",
    "reduce_scatter_tensor_coalesced":
        "(Tensor[] inputs, str reduce_op, int group_size, str group_name) -> Tensor[]",
    "all_to_all_single":
        "(Tensor input, SymInt[] output_split_sizes, SymInt[] input_split_sizes, str group_name) -> Tensor",
    "broadcast": "(Tensor input, int src, str group_name) -> Tensor",
    "wait_tensor": "(Tensor tensor) -> Tensor",
}


def _gathered(input: torch.Tensor, group_size: int) -> torch.Tensor:
    shape = list(input.shape) or [1]
    shape[0] *= group_size
    return input.new_empty(shape)


def _scattered(input: torch.Tensor, group_size: int) -> torch.Tensor:
    shape = list(input.shape)
    torch._check(len(shape) > 0 and shape[0] % group_size == 0,
                 lambda: f"reduce_scatter_tensor: dim 0 of {shape} is not divisible by {group_size}")
    shape[0] = shape[0] // group_size
    return input.new_empty(shape)


def _a2a(input: torch.Tensor, output_split_sizes: list[Any], input_split_sizes: list[Any]) -> torch.Tensor:
    if not output_split_sizes:
        return input.new_empty(input.shape)
    return input.new_empty([sum(output_split_sizes), *input.shape[1:]])


_FAKE: dict[str, Callable[..., Any]] = {
    "all_reduce": lambda input, reduce_op, group_name: torch.empty_like(input),
    "all_reduce_coalesced": lambda inputs, reduce_op, group_name: [torch.empty_like(t) for t in inputs],
    "all_gather_into_tensor": lambda input, group_size, group_name: _gathered(input, group_size),
    "all_gather_into_tensor_coalesced":
        lambda inputs, group_size, group_name: [_gathered(t, group_size) for t in inputs],
    "reduce_scatter_tensor": lambda input, reduce_op, group_size, group_name: _scattered(input, group_size),
    "reduce_scatter_tensor_coalesced":
        lambda inputs, reduce_op, group_size, group_name: [_scattered(t, group_size) for t in inputs],
    "all_to_all_single": lambda input, out_splits, in_splits, group_name: _a2a(input, out_splits, in_splits),
    "broadcast": lambda input, src, group_name: torch.empty_like(input),
    "wait_tensor": lambda tensor: torch.empty_like(tensor),
}

_EAGER: dict[str, Callable[..., Any]] = {
    "all_reduce": _eager.all_reduce,
    "all_reduce_coalesced": _eager.all_reduce_coalesced,
    "all_gather_into_tensor": _eager.all_gather_into_tensor,
    "all_gather_into_tensor_coalesced": _eager.all_gather_into_tensor_coalesced,
    "reduce_scatter_tensor": _eager.reduce_scatter_tensor,
    "reduce_scatter_tensor_coalesced": _eager.reduce_scatter_tensor_coalesced,
    "all_to_all_single": _eager.all_to_all_single,
    "broadcast": _eager.broadcast,
}


def _below_autograd(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    return kernel


def _as_kernel(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The eager kernel runs the collective for real, whatever modes are active above it."""

    def kernel(*args: Any) -> Any:
        with kernel_scope():
            return fn(*args)

    return kernel


def _fake(kernel: Callable[..., Any]) -> Callable[..., Any]:
    def fake(*args: Any) -> Any:
        _inductor.maybe_register_lowerings(getattr(torch.ops, NAMESPACE))
        return kernel(*args)

    return fake


def _wait_copy(tensor: torch.Tensor) -> torch.Tensor:
    """The op form of wait: a copy, because an operator's output may not alias its input
    (AOT autograd and inductor plan buffers on that promise). Eager code never pays for
    it: ``AsyncCollectiveTensor`` waits without going through the op."""
    return _eager.wait(tensor).clone()


_EAGER["wait_tensor"] = _wait_copy

for _name, _schema in _SCHEMAS.items():
    _lib.define(_name + _schema)
    _lib.impl(_name, _as_kernel(_EAGER[_name]), "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{_name}", _fake(_FAKE[_name]), lib=_lib)
    if _name == "wait_tensor":  # gradients flow through a wait unchanged
        torch.library.register_autograd(f"{NAMESPACE}::wait_tensor", lambda ctx, grad: grad, lib=_lib)
    else:
        _lib.impl(_name, _below_autograd(getattr(getattr(torch.ops, NAMESPACE), _name).default), "Autograd")

ops = getattr(torch.ops, NAMESPACE)
