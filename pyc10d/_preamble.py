"""The preamble every public collective shares, written once.

Resolves ``group`` (default group when None), warns and returns for non-members as torch
does, translates global ranks to group ranks, checks dtypes agree, and runs the backend call
synchronously (on the caller's thread when the group is idle) or returns its Work.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .backends import Engine
from .groups import _get_default_group, _rank_not_in_group, get_group_rank, get_rank
from .world import current_world


def group_or_warn(group: Any, opname: str) -> Any:
    """The group to run on, or None (after a warning) when this rank is not a member."""
    if _rank_not_in_group(group):
        world = current_world()
        key = f"{opname}:{id(group)}"
        if key not in world.warned:
            world.warned.add(key)
            warnings.warn(
                f"Running {opname} on global rank {get_rank()} which does not belong to the given group.",
                UserWarning,
                stacklevel=3,
            )
        return None
    return _get_default_group() if group is None else group


def group_rank(pg: Any, global_rank: int | None, group_rank_: int | None, what: str) -> int:
    """Translate ``src``/``dst`` (global) or ``group_src``/``group_dst`` (group-local)."""
    if global_rank is not None and group_rank_ is not None:
        raise ValueError(f"Can only specify one of {what} or group_{what}")
    if group_rank_ is not None:
        return group_rank_
    if global_rank is None:
        return 0
    if pg is current_world().default_pg:
        return global_rank
    return get_group_rank(pg, global_rank)


#: How an in-place collective is recorded when it is called under ``make_fx`` or
#: ``torch.compile``: ``hook(pg, method, args, async_op)``. ``pyc10d.functional`` installs it
#: (as the traced functional ops); this layer only knows that one may be there.
trace_hook: Callable[..., Any] | None = None


class _Kernel(threading.local):
    active = False  # a class default: a thread that never ran a kernel reads False, no miss


_kernel = _Kernel()


def tracing() -> bool:
    """True under torch.compile, make_fx or any dispatch mode (fake, functional, proxy),
    except inside an operator's kernel: that is the real run, never a trace."""
    # ``is_compiling`` first: under dynamo it folds to True before the C call is traced.
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0:
        return not _kernel.active
    return False


@contextlib.contextmanager
def kernel_scope() -> Iterator[None]:
    """Mark the calling thread as running an operator's kernel (see ``tracing``)."""
    outer = _kernel.active
    _kernel.active = True
    try:
        yield
    finally:
        _kernel.active = outer


def invoke(pg: Any, method: str, *args: Any, async_op: bool = False, **kwargs: Any) -> Any:
    """Call ``pg.method``; wait unless ``async_op``. pyc10d engines run idle sync calls inline.

    Under tracing the call is handed to ``trace_hook``, so a traced graph records the
    collective instead of the tracer silently running (or skipping) it.
    """
    if tracing():
        if trace_hook is None:
            raise RuntimeError(f"{method}: in-place collectives can only be traced once pyc10d.functional is imported")
        return trace_hook(pg, method, args, async_op)
    engine = getattr(pg, "_engine", None)
    if isinstance(engine, Engine):
        if not async_op:
            kwargs["_sync"] = True
        work = getattr(engine, method)(*args, **kwargs)
    else:
        work = getattr(pg, method)(*args, **kwargs)
    if async_op:
        return work
    if work is not None:
        work.wait()
    return None


_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16,
            getattr(torch, "bcomplex32", torch.complex32): torch.bfloat16 if hasattr(torch, "bcomplex32")
            else torch.float16}  # (bcomplex32: torch 2.14's)


def _real_pair(a: torch.dtype, b: torch.dtype) -> bool:
    return _REAL_OF.get(a) == b or _REAL_OF.get(b) == a


def ensure_same_dtype(*tensors: Any) -> None:
    flat: list[torch.Tensor] = []
    for t in tensors:
        if isinstance(t, torch.Tensor):
            flat.append(t)
        elif t is not None:
            for x in t:
                flat.extend(x if isinstance(x, (list, tuple)) else [x])
    if not flat:
        return
    first = flat[0].dtype
    for t in flat[1:]:
        if t.dtype != first and not _real_pair(t.dtype, first):
            raise ValueError(
                f"Invalid usage of tensors with different dtypes: found {first} and {t.dtype}"
            )


def as_real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def check_tensor(t: Any, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"Invalid function argument. Expected parameter `{name}` of type torch.Tensor but got {type(t)} instead.")


def check_tensor_list(ts: Any, name: str) -> None:
    if not isinstance(ts, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in ts):
        raise TypeError(f"Invalid function argument. Expected parameter `{name}` of type List[torch.Tensor] but got {type(ts)} instead.")
