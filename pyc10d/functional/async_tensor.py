"""``AsyncCollectiveTensor``: the result of an eager functional collective, waited on first use.

It wraps the output tensor the collective is still writing. Reading its shape, dtype or
device does not wait (a wrapper subclass carries that metadata); the first operation that
touches its data waits for the collective, exactly once, under a per-tensor lock (so two
threads using it at once both see the finished data) and then runs on the plain tensor.
Results of operations on it are plain tensors. ``wait()`` returns the plain tensor.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from . import _eager


class AsyncCollectiveTensor(torch.Tensor):
    elem: torch.Tensor
    completed: bool
    __slots__ = ["elem", "completed", "_wait_lock"]

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> AsyncCollectiveTensor:
        r: AsyncCollectiveTensor = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=elem.device, requires_grad=False,
        )
        r.elem = elem
        r.completed = False
        r._wait_lock = threading.Lock()
        return r

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"AsyncCollectiveTensor({self.trigger_wait()})"

    def trigger_wait(self) -> torch.Tensor:
        """Finish the collective (once) and return the plain output tensor."""
        if not self.completed:
            with self._wait_lock:
                if not self.completed:
                    _eager.wait(self.elem)
                    self.completed = True
        return self.elem

    def wait(self) -> torch.Tensor:
        return self.trigger_wait()

    def _get_acs_underlying_tensor(self) -> torch.Tensor:
        """The output tensor without waiting (torch's name)."""
        return self.elem

    def tolist(self) -> Any:
        return self.trigger_wait().tolist()

    def numpy(self, *, force: bool = False) -> Any:
        return self.trigger_wait().numpy(force=force)

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], meta: Any, outer_size: Any,
                             outer_stride: Any) -> AsyncCollectiveTensor:
        return AsyncCollectiveTensor(inner["elem"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        def unwrap(e: AsyncCollectiveTensor) -> torch.Tensor:
            return e.trigger_wait()

        args = tree_map_only(AsyncCollectiveTensor, unwrap, args)
        kwargs = tree_map_only(AsyncCollectiveTensor, unwrap, kwargs or {})
        return func(*args, **kwargs)


class _FromTorchTensor(torch.autograd.Function):
    """Wrap a differentiable output: gradients pass straight through the wrapper."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return AsyncCollectiveTensor(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def wrap(t: torch.Tensor) -> torch.Tensor:
    """An AsyncCollectiveTensor for ``t`` (through autograd when ``t`` needs a gradient)."""
    if t.requires_grad:
        return _FromTorchTensor.apply(t)
    return AsyncCollectiveTensor(t)
