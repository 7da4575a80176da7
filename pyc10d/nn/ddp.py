"""``DistributedDataParallel``: the module wrapper around the :class:`Reducer`.

The wrapper makes every rank start from rank 0's parameters and buffers, keeps buffers in
step before each forward, and arms the reducer so that the backward of the forward's output
averages gradients across the group. What it guarantees: N ranks each training on 1/N of a
batch end with the parameters one process gets on the whole batch (up to float rounding).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..collectives import _broadcast_coalesced
from ..groups import _get_default_group
from .comm_hooks import builtin_hook
from .reducer import (
    _DEFAULT_FIRST_BUCKET_BYTES,
    GradBucket,
    Reducer,
    _compute_bucket_assignment_by_size,
    find_output_tensors,
)

_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024
_IGNORE_ATTR = "_ddp_params_and_buffers_to_ignore"


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(x, device) for x in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def _annotation_is(annotation: Any, expected: Any, name: str) -> bool:
    """Whether an annotation (an object, or a string under postponed evaluation) names ``expected``."""
    if annotation is inspect.Parameter.empty or annotation == expected:
        return True
    if isinstance(annotation, str):
        return annotation.replace(" ", "").endswith(name)
    return False


class DistributedDataParallel(nn.Module):
    """Data parallelism over a pyc10d process group, as ``torch.nn.parallel.DistributedDataParallel``.

    Each rank holds a full replica; gradients are averaged across the group during backward
    in buckets of about ``bucket_cap_mb`` MiB, each all-reduced as soon as it is full.
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: list[int | torch.device] | None = None,
        output_device: int | torch.device | None = None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float | None = 25,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
    ) -> None:
        super().__init__()
        self.module = module
        self.process_group = process_group if process_group is not None else _get_default_group()
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = False
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._logging: dict[str, Any] = {"iteration": 0, "has_error": 0, "error": ""}
        devices = {p.device for p in module.parameters()}
        self.is_multi_device_module = len(devices) > 1
        if device_ids is not None and len(device_ids) > 1:
            self._log_and_throw(ValueError, "device_ids can only be None or contain a single element.")
        self.device_ids = None if not device_ids else [torch.device(d) if not isinstance(d, int)
                                                        else torch.device("cuda", d) for d in device_ids]
        self.device = self.device_ids[0] if self.device_ids else next(iter(devices), torch.device("cpu"))
        self.output_device = output_device

        ignored = set(getattr(module, _IGNORE_ATTR, ()))
        self.parameters_to_ignore = ignored
        seen: set[int] = set()
        self._named_params: list[tuple[str, nn.Parameter]] = []
        for name, p in module.named_parameters():
            if name in ignored or not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            self._named_params.append((name, p))
        if not self._named_params:
            self._log_and_throw(
                RuntimeError,
                "DistributedDataParallel is not needed when a module doesn't have any parameter "
                "that requires a gradient.",
            )
        self.modules_buffers = [b for n, b in module.named_buffers() if n not in ignored]

        # Every rank starts from rank 0's state.
        states = [p.detach() for n, p in module.named_parameters() if n not in ignored]
        states += [b.detach() for b in self.modules_buffers]
        if states and self.process_group.size() > 1:
            _broadcast_coalesced(self.process_group, states, _BROADCAST_BUCKET_BYTES, 0)

        cap = _DEFAULT_FIRST_BUCKET_BYTES * 25 if bucket_cap_mb is None else int(bucket_cap_mb * 1024 * 1024)
        self.bucket_bytes_cap = max(cap, 1)
        params = [p for _, p in self._named_params]
        sparse = self._expect_sparse(params)
        first = min(_DEFAULT_FIRST_BUCKET_BYTES, self.bucket_bytes_cap)
        indices, limits = _compute_bucket_assignment_by_size(
            params, [first, self.bucket_bytes_cap], sparse, list(reversed(range(len(params))))
        )
        self.reducer = Reducer(
            params,
            indices,
            limits,
            self.process_group,
            sparse,
            self.bucket_bytes_cap,
            find_unused_parameters,
            gradient_as_bucket_view,
            {i: n for i, (n, _) in enumerate(self._named_params)},
            _DEFAULT_FIRST_BUCKET_BYTES,
        )
        self._comm_hook_registered = False
        if static_graph:
            self._set_static_graph()

    def _expect_sparse(self, params: list[torch.Tensor]) -> list[bool]:
        """Which parameters will get sparse gradients: weights of sparse embeddings."""
        sparse_ids = {
            id(m.weight) for m in self.module.modules()
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse
        }
        return [id(p) in sparse_ids for p in params]

    # ----------------------------------------------------------------- forward
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if sync:
            try:
                self.reducer._rebuild_buckets()
            except RuntimeError as e:
                self._logging.update(has_error=1, error=str(e))
                raise
            self.reducer.prepare_for_forward()
            self._logging["iteration"] += 1
        if self.broadcast_buffers and self.modules_buffers and self.require_forward_param_sync \
                and self.process_group.size() > 1:
            _broadcast_coalesced(
                self.process_group, [b.detach() for b in self.modules_buffers], _BROADCAST_BUCKET_BYTES, 0
            )
        if self.device_ids:
            inputs = _to_device(inputs, self.device_ids[0])
            kwargs = _to_device(kwargs, self.device_ids[0])
        output = self.module(*inputs, **kwargs)
        if sync:
            self.require_forward_param_sync = True
            need_outputs = self.find_unused_parameters or self.static_graph
            self.reducer.prepare_for_backward(find_output_tensors(output) if need_outputs else [])
        else:
            self.require_forward_param_sync = False
            self.reducer.skip_sync()
        if self.output_device is not None and self.device_ids:
            output = _to_device(output, torch.device(self.output_device) if not isinstance(
                self.output_device, int) else torch.device("cuda", self.output_device))
        return output

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; the first one after syncs them all."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # ----------------------------------------------------------------- comm hooks
    def register_comm_hook(self, state: object, hook: Callable[..., torch.futures.Future]) -> None:
        """Reduce each bucket with ``hook(state, bucket) -> Future`` instead of the default all-reduce.

        The future's value (a tensor, or a list whose first element is one) replaces the
        bucket's contents; the default averaging is then the hook's job.
        """
        self._check_comm_hook(hook)
        if self._comm_hook_registered:
            self._log_and_throw(
                RuntimeError, "register_comm_hook or register_builtin_comm_hook can only be called once."
            )
        self.reducer.register_comm_hook(state, hook)
        self._comm_hook_registered = True

    def _register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        """A built-in hook by name (``BuiltinCommHookType.ALLREDUCE`` or ``FP16_COMPRESS``,
        pyc10d's or torch's), reducing over this model's process group."""
        hook = builtin_hook(comm_hook_type)
        if self._comm_hook_registered:
            self._log_and_throw(
                RuntimeError, "register_comm_hook or register_builtin_comm_hook can only be called once."
            )
        self.reducer.register_comm_hook(self.process_group, hook)
        self._comm_hook_registered = True

    def _check_comm_hook(self, hook: Any) -> None:
        if not callable(hook):
            self._log_and_throw(TypeError, "Communication hook must be callable.")
        sig = inspect.signature(hook)
        params = list(sig.parameters.values())
        bucket = sig.parameters.get("bucket", params[1] if len(params) > 1 else None)
        if bucket is not None and not _annotation_is(bucket.annotation, GradBucket, "GradBucket"):
            self._log_and_throw(ValueError, "Communication hook: bucket annotation should be dist.GradBucket.")
        ret = sig.return_annotation
        if ret is not inspect.Signature.empty and not (
            _annotation_is(ret, torch.futures.Future[torch.Tensor], "Future[torch.Tensor]")
            or ret is torch.futures.Future
            or getattr(ret, "__origin__", None) is torch.futures.Future
        ):
            self._log_and_throw(
                ValueError, "Communication hook: return annotation should be torch.futures.Future[torch.Tensor]."
            )

    def _log_and_throw(self, err_type: type[Exception], msg: str) -> None:
        self._logging.update(has_error=1, error=msg)
        raise err_type(msg)

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        """Torch's logging record, with the fields tests read."""
        return {
            **self._logging,
            "world_size": self.process_group.size(),
            "rank": self.process_group.rank(),
            "bucket_cap_bytes": self.bucket_bytes_cap,
            "find_unused_parameters": int(self.find_unused_parameters),
            "gradient_as_bucket_view": int(self.gradient_as_bucket_view),
            "static_graph": int(self.static_graph),
            "is_multi_device_module": int(self.is_multi_device_module),
            "num_buckets": len(self.reducer.buckets),
        }

    # ----------------------------------------------------------------- misc torch API
    def _set_static_graph(self) -> None:
        """The graph is the same every iteration: unused parameters are allowed and found."""
        self.static_graph = True
        self.reducer._set_static_graph()

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module: nn.Module, params_and_buffers_to_ignore: Any) -> None:
        """Names (as in ``named_parameters``/``named_buffers``) DDP will neither sync nor reduce."""
        setattr(module, _IGNORE_ATTR, set(params_and_buffers_to_ignore))
