"""torch.profiler ranges for pyc10d's operations, and their cost when no profiler runs.

Every collective and point-to-point call shows in a ``torch.profiler`` trace as
``pyc10d:<op>``; inside it, ``pyc10d:<algorithm>`` where an algorithm was chosen, and
``pyc10d:wait`` for each stretch spent waiting for peers (a receive, a shared-memory phase).
The operation's range carries the shapes and dtype of the tensors it writes (the
in-place collectives' inputs; the output list of an all_gather), their ``bytes``, ``group``,
``seq`` and ``backend`` as arguments; torch writes arguments into a trace only when it records input
shapes (``profile(record_shapes=True)``), as it does for its own operators.

Cost when off: every hook first reads ``torch.autograd.profiler._is_profiler_enabled``, a
module-level bool torch keeps for exactly this (set by every profiler's start and stop), so
a call without a profiler pays one attribute read per hook and nothing else. The per-thread
check (``torch.autograd._profiler_enabled()``) is a C call and says False on a thread the
profiler does not follow (a thread torch.profiler was not started on), which is why the
global flag is read instead; ``_RecordFunctionFast`` itself records nothing on such a thread.

This module sits in ``algorithms/`` because the waits it times happen there; the engine
(``backends/base.py``) opens the operation's range, see ``Engine._run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import profiler as torch_profiler

_Range = torch._C._profiler._RecordFunctionFast
_EMPTY: list = []
_WAIT_NAME = "pyc10d:wait"


def on() -> bool:
    """True while any torch profiler runs in this process (the hooks' one check)."""
    return torch_profiler._is_profiler_enabled


def _tensors(x: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tensors(y, out)
    return out


def op_range(opname: str, tensors: Any, seq: int, group: str, backend: str, **extra: Any) -> Any:
    """The range of one operation (a context manager): ``pyc10d:<opname>`` with its tensors
    (their shapes and dtypes), their total ``bytes``, ``dtype``, ``group``, ``seq``."""
    ts = _tensors(tensors, [])
    meta = {
        "bytes": sum(t.numel() * t.element_size() for t in ts),
        "dtype": str(ts[0].dtype).replace("torch.", "") if ts else "",
        "group": group, "seq": seq, "backend": backend, **extra,
    }
    return _Range(f"pyc10d:{opname}", ts[:16], meta)


def queued(opname: str, tensors: Any, seq: int, group: str, backend: str) -> None:
    """Mark on the issuing thread that operation ``seq`` was queued (``pyc10d:<op> (queued)``,
    a range of no length with the operation's arguments). The group's progress thread may run
    it, and torch.profiler records only the threads it was started on (unless
    ``profile_all_threads``), so without this an ``async_op=True`` call could leave no trace."""
    with op_range(f"{opname} (queued)", tensors, seq, group, backend):
        pass


def wait_range(peer: int | str) -> Any:
    """The range of one wait for peers (``peer``: the rank waited for, or a description)."""
    return _Range(_WAIT_NAME, _EMPTY, {"peer": peer})


_WRAPPED: dict[Callable, Callable] = {}


def algorithm(fn: Callable) -> Callable:
    """``fn`` (an algorithm) wrapped to run inside a ``pyc10d:<name>`` range, ``algorithm``
    its argument. ``select`` returns this instead of ``fn`` only while a profiler runs."""
    wrapped = _WRAPPED.get(fn)
    if wrapped is None:
        name = fn.__name__

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with _Range(f"pyc10d:{name}", _EMPTY, {"algorithm": name}):
                return fn(*args, **kwargs)

        wrapped.__name__ = name
        _WRAPPED[fn] = wrapped
    return wrapped
