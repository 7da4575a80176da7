"""torch's collective hooks (``pg.register_pre_hook`` / ``register_post_hook``) on the plugin's group.

torch 2.14 keeps a group's pre and post hooks in its C++ ``ProcessGroup`` and fires them from
the C++ collective methods of that class (``ProcessGroup::allreduce`` calls ``firePreHook``,
dispatches to the device's ``Backend``, then ``firePostHook``). Gloo's group is that C++ class
around a ``ProcessGroupGloo`` backend, so its hooks fire. The plugin's group is a Python
subclass of ``ProcessGroup`` whose methods override the collectives (``group.py``): torch's
Python API and its C++ callers (through pybind's trampoline) reach those overrides, never the
C++ methods that fire the hooks, and Python has no way to fire the C++ table. So hooks
registered through the C++ ``register_pre_hook`` were stored and never called.

Here the group keeps its own hooks (``CollectiveHooks``) and fires them around every
collective and point-to-point call, with torch's ``PreHookArgs`` / ``PostHookArgs`` filled as
Gloo fills them (name, async_op, input and output tensors, root, op id, the Work). A group
with no hooks pays nothing: registering the first hook switches the group to its hooked
class (``variant_of``), whose methods wrap the plain ones; removing the last switches back.
The plain methods are the lean lane's (microseconds a call), which a check per call would tax.

Hooks attached from torch's C++ (``NanCheckHook.attach``, ``FlightRecorderHook.attach``) go
into the C++ table and are not seen: only Python's ``register_*_hook`` calls reach these.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch._C import _distributed_c10d as _c10d


@dataclasses.dataclass
class PreHookArgs:
    """torch's ``PreHookArgs`` fields, for a torch whose class cannot be made from Python."""

    name: Any = None
    async_op: bool = False
    input_tensors: list[torch.Tensor] = dataclasses.field(default_factory=list)
    output_tensors: list[torch.Tensor] = dataclasses.field(default_factory=list)
    root: int = -1
    op_id: int = 0


@dataclasses.dataclass
class PostHookArgs:
    """torch's ``PostHookArgs`` fields, for a torch whose class cannot be made from Python."""

    name: Any = None
    async_op: bool = False
    work: Any = None
    op_id: int = 0


def _torch_args(cls_name: str) -> type | None:
    """torch's own argument class when Python can make one and set its fields, else None."""
    cls = getattr(_c10d, cls_name, None)
    if cls is None:
        return None
    try:
        probe = cls()
        probe.op_id = 0
    except (TypeError, AttributeError, RuntimeError):
        return None
    return cls


def _op_name(name: str) -> Any:
    """torch's ``HookOpName`` member of that name (a string where torch has none)."""
    enum = getattr(_c10d, "HookOpName", None)
    return getattr(enum, name, name) if enum is not None else name


class CollectiveHooks:
    """One group's pre and post hooks, by id (a second hook with an id replaces the first,
    removing an unknown id does nothing: as torch's C++ table), and its op ids."""

    def __init__(self) -> None:
        self.pre: dict[int, Callable[[Any], None]] = {}
        self.post: dict[int, Callable[[Any], None]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._pre_cls = _torch_args("PreHookArgs") or PreHookArgs
        self._post_cls = _torch_args("PostHookArgs") or PostHookArgs

    def __bool__(self) -> bool:
        return bool(self.pre or self.post)

    def next_id(self) -> int:
        """The id that pairs a call's pre and post hooks: the group's hooked calls, from 0."""
        with self._lock:
            return next(self._ids)

    def fire_pre(self, name: Any, async_op: bool, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                 root: int, op_id: int) -> None:
        if not self.pre:
            return
        args = self._pre_cls()
        args.name, args.async_op, args.root, args.op_id = name, async_op, root, op_id
        args.input_tensors, args.output_tensors = inputs, outputs
        for hook in list(self.pre.values()):
            hook(args)

    def fire_post(self, name: Any, async_op: bool, work: Any, op_id: int) -> None:
        if not self.post:
            return
        args = self._post_cls()
        args.name, args.async_op, args.op_id, args.work = name, async_op, op_id, work
        for hook in list(self.post.values()):
            hook(args)


# -- what each call hands its hooks: (inputs, outputs, root, async_op), as Gloo's group does ----
_NO_ROOT = -1


def _flat(lists: Any) -> list[torch.Tensor]:
    if isinstance(lists, torch.Tensor):
        return [lists]
    out: list[torch.Tensor] = []
    for item in lists or []:
        out.extend([item] if isinstance(item, torch.Tensor) else item)
    return out


def _async(opts: Any) -> bool:
    return bool(getattr(opts, "asyncOp", True))


def _root(opts: Any) -> int:
    return int(getattr(opts, "rootRank", _NO_ROOT))


def _inputs_only(tensors: Any, opts: Any = None) -> tuple:
    return _flat(tensors), [], _NO_ROOT, _async(opts)


def _rooted_inputs(tensors: Any, opts: Any = None) -> tuple:
    return _flat(tensors), [], _root(opts), _async(opts)


def _gathering(outputs: Any, inputs: Any, opts: Any = None) -> tuple:
    return _flat(inputs), _flat(outputs), _NO_ROOT, _async(opts)


def _rooted_gathering(outputs: Any, inputs: Any, opts: Any = None) -> tuple:
    return _flat(inputs), _flat(outputs), _root(opts), _async(opts)


def _all_to_all_single(output: Any, input: Any, output_split_sizes: Any = None, input_split_sizes: Any = None,
                       opts: Any = None) -> tuple:
    return [input], [output], _NO_ROOT, _async(opts)


def _send(tensors: Any, dstRank: int, tag: int = 0) -> tuple:  # noqa: N803 - torch's name
    return _flat(tensors), [], dstRank, True  # (a send is always started asynchronously, as on Gloo)


def _recv(tensors: Any, srcRank: int, tag: int = 0) -> tuple:  # noqa: N803 - torch's name
    return [], _flat(tensors), srcRank, True


def _recv_anysource(tensors: Any, tag: int = 0) -> tuple:
    return [], _flat(tensors), _NO_ROOT, True


def _barrier(opts: Any = None) -> tuple:
    return [], [], _NO_ROOT, _async(opts)


#: method of the group -> (torch's HookOpName member, what its hooks are handed).
HOOKED: dict[str, tuple[str, Callable[..., tuple]]] = {
    "allreduce": ("ALLREDUCE", _inputs_only),
    "allreduce_coalesced": ("ALLREDUCE", _inputs_only),
    "broadcast": ("BROADCAST", _rooted_inputs),
    "reduce": ("REDUCE", _rooted_inputs),
    "allgather": ("ALLGATHER", _gathering),
    "all_gather_single": ("ALLGATHER", _gathering),
    "_allgather_base": ("ALLGATHER", _gathering),
    "all_gather_single_coalesced": ("ALLGATHER", _gathering),
    "allgather_into_tensor_coalesced": ("ALLGATHER", _gathering),
    "allgather_coalesced": ("ALLGATHER", _gathering),
    "reduce_scatter": ("REDUCE_SCATTER", _gathering),
    "reduce_scatter_single": ("REDUCE_SCATTER", _gathering),
    "_reduce_scatter_base": ("REDUCE_SCATTER", _gathering),
    "reduce_scatter_single_coalesced": ("REDUCE_SCATTER", _gathering),
    "reduce_scatter_tensor_coalesced": ("REDUCE_SCATTER", _gathering),
    "all_to_all_single": ("ALLTOALL", _all_to_all_single),
    "alltoall_base": ("ALLTOALL", _all_to_all_single),
    "alltoall": ("ALLTOALL", _gathering),
    "gather": ("GATHER", _rooted_gathering),
    "gather_single": ("GATHER", _rooted_gathering),
    "scatter": ("SCATTER", _rooted_gathering),
    "send": ("SEND", _send),
    "recv": ("RECV", _recv),
    "recv_anysource": ("RECV", _recv_anysource),
    "barrier": ("BARRIER", _barrier),
}


def _hooked(name: str, op: str, describe: Callable[..., tuple]) -> Callable[..., Any]:
    """The variant's ``name``: the plain class's method (looked up at call time, so that what
    a subclass or a decorator put there after the variant was made is what runs), between the
    group's pre and post hooks."""
    op_name = _op_name(op)

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        hooks: CollectiveHooks = self.collective_hooks
        op_id = hooks.next_id()
        inputs, outputs, root, async_op = describe(*args, **kwargs)
        hooks.fire_pre(op_name, async_op, inputs, outputs, root, op_id)
        work = getattr(self.hooks_plain, name)(self, *args, **kwargs)
        hooks.fire_post(op_name, async_op, work, op_id)
        return work

    call.__name__ = call.__qualname__ = name
    return call


def plain_of(pg: Any) -> type:
    """The class ``pg`` runs as without hooks (its own, or the one its hooked variant wraps)."""
    cls = type(pg)
    return cls.__dict__.get("hooks_plain", cls)


def variant_of(plain: type) -> type:
    """``plain`` with every call of ``HOOKED`` firing the group's hooks around it: the class a
    group with hooks runs as. Made on the first hook of a group of that class and kept on it
    (each class its own: ``GlooServedGroup``'s variant is not ``TorchProcessGroup``'s)."""
    variant = plain.__dict__.get("hooks_variant")
    if variant is None:
        methods = {name: _hooked(name, op, describe) for name, (op, describe) in HOOKED.items() if hasattr(plain, name)}
        variant = type(plain.__name__, (plain,), {
            **methods, "hooks_plain": plain, "__module__": plain.__module__, "__qualname__": plain.__qualname__,
            "__doc__": f"{plain.__name__} with collective hooks registered ({__name__})."})
        type.__setattr__(plain, "hooks_variant", variant)
    return variant


def _switch(pg: Any) -> None:
    """Run ``pg`` as its hooked variant while it has hooks, as its plain class otherwise."""
    plain = plain_of(pg)
    pg.__class__ = variant_of(plain) if pg.collective_hooks else plain


def _hooks_of(pg: Any) -> CollectiveHooks:
    hooks = pg.collective_hooks
    if hooks is None:
        hooks = pg.collective_hooks = CollectiveHooks()
    return hooks


def register_pre_hook(pg: Any, hook_id: int, hook: Callable[[Any], None]) -> None:
    """torch's ``ProcessGroup.register_pre_hook``: ``hook(PreHookArgs)`` before every call."""
    _hooks_of(pg).pre[int(hook_id)] = hook
    _switch(pg)


def unregister_pre_hook(pg: Any, hook_id: int) -> None:
    _hooks_of(pg).pre.pop(int(hook_id), None)
    _switch(pg)


def register_post_hook(pg: Any, hook_id: int, hook: Callable[[Any], None]) -> None:
    """torch's ``ProcessGroup.register_post_hook``: ``hook(PostHookArgs)`` after every call
    returned its Work."""
    _hooks_of(pg).post[int(hook_id)] = hook
    _switch(pg)


def unregister_post_hook(pg: Any, hook_id: int) -> None:
    _hooks_of(pg).post.pop(int(hook_id), None)
    _switch(pg)
