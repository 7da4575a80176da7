"""Eager kernels of the functional collectives, on top of pyc10d's public collectives.

Each kernel allocates a fresh output, starts the collective with ``async_op=True`` and
records its ``Work`` against the output's storage; ``wait`` (the ``wait_tensor`` op, or an
``AsyncCollectiveTensor``'s first use) finishes it. Compute issued between the two overlaps
the communication, which runs on the group's progress thread.

Messages of at most ``INLINE_BYTES`` (``PYC10D_FUNCOL_INLINE_BYTES``, default 16 KiB) run
synchronously on the caller's thread instead: for them the hop to the progress thread and
back costs more than anything they could overlap with. The result is the same either way.

Overlap needs a core for the progress thread. When the launcher says this host runs more
ranks than half its cores (``LOCAL_WORLD_SIZE`` > cores / 2: every rank's caller and progress
thread cannot run at once), the collective would only take the core of the compute it is meant
to hide behind, and the hop costs a wake-up on a busy host (measured on 2 cores, 2 ranks: a
4 MiB all_reduce and a matmul took 20-150% *longer* together than one after the other). Then,
unless ``PYC10D_FUNCOL_INLINE_BYTES`` is set, every size runs inline.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import torch

from .. import collectives as C  # noqa: N812 - the public API, short
from .. import settings, threads
from ..backends import Engine
from ..transport.cpus import oversubscribed
from ..types import AllreduceOptions, as_reduce_op
from . import _buffers
from ._groups import pg_by_name

DEFAULT_INLINE_BYTES = 16 * 1024
#: Set (a number of bytes) or None: chosen from the host at the first collective (``inline_limit``).
INLINE_BYTES: int | None = settings.FUNCOL_INLINE_BYTES.get()
_auto_limit: int | None = None


def inline_limit() -> int:
    """Bytes above which a functional collective runs asynchronously (see the module's doc)."""
    global _auto_limit
    if INLINE_BYTES is not None:
        return INLINE_BYTES
    if _auto_limit is None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
        _auto_limit = sys.maxsize if oversubscribed(2 * local) else DEFAULT_INLINE_BYTES
    return _auto_limit

# storage pointer -> Work of the collective still writing it. The Work holds the output
# tensors, so a pointer cannot be reused while its entry is here.
_pending: dict[int, Any] = {}
_pending_lock = threading.Lock()
threads.renew_after_fork(globals(), _pending_lock=threading.Lock)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _register(outputs: list[torch.Tensor], work: Any) -> None:
    if work is None:
        return
    with _pending_lock:
        for t in outputs:
            if t.numel():
                _pending[_key(t)] = work
    for t in outputs:
        if not t.numel():  # no storage to key on: finish now, nothing to overlap anyway
            work.wait()
            break


def wait(t: torch.Tensor) -> torch.Tensor:
    """Block until the collective writing ``t`` is done (at once when there is none)."""
    if not _pending or not t.numel():
        return t
    key = _key(t)
    work = _pending.get(key)
    if work is not None:
        try:
            work.wait()
        finally:
            with _pending_lock:
                if _pending.get(key) is work:
                    del _pending[key]
    return t


def is_pending(t: torch.Tensor) -> bool:
    """Whether a collective is still writing ``t`` (False for meta tensors and finished work)."""
    return bool(_pending) and t.device.type != "meta" and t.numel() > 0 and _key(t) in _pending


def pending_count() -> int:
    """Collectives started and not yet waited for (a test and debugging aid)."""
    return len(_pending)


def _async(nbytes: int) -> bool:
    return nbytes > inline_limit()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# reduce op name -> (ReduceOp, AllreduceOptions): built once, the engine only reads them
_REDUCE_OPS: dict[str, tuple[Any, AllreduceOptions]] = {}


def _reduce_op(name: str) -> tuple[Any, AllreduceOptions]:
    hit = _REDUCE_OPS.get(name)
    if hit is None:
        op = as_reduce_op(name)
        hit = _REDUCE_OPS[name] = (op, AllreduceOptions(reduceOp=op))
    return hit


def _snapshot(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` outside autograd: the collective's output, taken when it is
    called (torch's semantics: changing the input afterwards does not change the result)."""
    return _buffers.copy_of(t) if t.device.type == "cpu" else t.detach().clone(memory_format=torch.contiguous_format)


def _frozen(t: torch.Tensor) -> torch.Tensor | None:
    """A copy-on-write view of ``t``'s values now (``torch._lazy_clone``: O(1)), or None.

    An asynchronous collective reads its input later, on the progress thread; torch's
    semantics are that of a copy taken at the call. The lazy clone is that copy, paid only if
    the caller writes the input while the collective still holds the clone (once it is done
    the input takes its memory back without a copy). Only for an input that spans its whole
    storage: a write anywhere in the storage would copy all of it. None when torch cannot
    (memory it does not own, such as numpy's or shared memory).
    """
    d = t.detach()
    if d.storage_offset() or not d.is_contiguous() or d.untyped_storage().nbytes() != _nbytes(d):
        return None
    try:
        return torch._lazy_clone(d)
    except RuntimeError:
        return None


def all_reduce(input: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
    a = _async(_nbytes(input))
    pg, (op, opts) = pg_by_name(group_name), _reduce_op(reduce_op)
    engine = getattr(pg, "_engine", None)
    if isinstance(engine, Engine) and input.is_cpu and not input.is_complex():
        # The output is ours, fresh and contiguous: straight to the engine, without the
        # public API's argument checks (its own checks still run). It reads the input
        # itself (out of place): a synchronous call returns before the caller can change
        # it; an asynchronous one reads a copy-on-write clone.
        src = None
        if input.is_contiguous():
            src = _frozen(input) if a else input.detach() if input.requires_grad else input
        out = _buffers.empty_like(input) if src is not None else _snapshot(input)
        work = engine.allreduce([out], opts, _sync=not a, _src=src)
        if not a:
            work.wait()
            return out
    else:
        out = _snapshot(input)
        work = C.all_reduce(out, op, pg, async_op=a)
    _register([out], work)
    return out


def all_reduce_coalesced(inputs: list[torch.Tensor], reduce_op: str, group_name: str) -> list[torch.Tensor]:
    outs = [_snapshot(t) for t in inputs]
    if not outs:
        return outs
    a = _async(sum(_nbytes(t) for t in outs))
    pg, op = pg_by_name(group_name), as_reduce_op(reduce_op)
    work = None
    for dtype in dict.fromkeys(t.dtype for t in outs):  # one coalesced call per dtype
        same = [t for t in outs if t.dtype == dtype]
        work = C.all_reduce_coalesced(same, op, pg, async_op=a)
        if a:
            _register(same, _FutureWork(work))
    return outs


class _FutureWork:
    """A Work-like view of the Future that ``all_reduce_coalesced(async_op=True)`` returns."""

    def __init__(self, fut: Any) -> None:
        self.fut = fut

    def wait(self) -> None:
        self.fut.wait()


def _gathered_shape(input: torch.Tensor, group_size: int) -> list[int]:
    shape = list(input.shape) or [1]
    shape[0] *= group_size
    return shape


def all_gather_into_tensor(input: torch.Tensor, group_size: int, group_name: str) -> torch.Tensor:
    pg = pg_by_name(group_name)
    _check_size(pg, group_size, "all_gather_into_tensor")
    inp = input.detach().contiguous()
    out = _buffers.empty_like(inp, _gathered_shape(inp, group_size))
    _register([out], C.all_gather_into_tensor(out, inp.reshape(-1) if not inp.dim() else inp, pg,
                                              async_op=_async(_nbytes(out))))
    return out


def all_gather_into_tensor_coalesced(inputs: list[torch.Tensor], group_size: int, group_name: str) -> list[torch.Tensor]:
    return [all_gather_into_tensor(t, group_size, group_name) for t in inputs]


def reduce_scatter_tensor(input: torch.Tensor, reduce_op: str, group_size: int, group_name: str) -> torch.Tensor:
    pg = pg_by_name(group_name)
    _check_size(pg, group_size, "reduce_scatter_tensor")
    inp = input.detach().contiguous()
    if not inp.dim() or inp.shape[0] % group_size:
        raise ValueError(
            f"reduce_scatter_tensor: input dim 0 ({inp.shape[0] if inp.dim() else 'scalar'}) "
            f"must be divisible by the group size {group_size}"
        )
    out = _buffers.empty_like(inp, [inp.shape[0] // group_size, *inp.shape[1:]])
    work = C.reduce_scatter_tensor(out, inp, as_reduce_op(reduce_op), pg, async_op=_async(_nbytes(inp)))
    _register([out], work)
    return out


def reduce_scatter_tensor_coalesced(inputs: list[torch.Tensor], reduce_op: str, group_size: int,
                                    group_name: str) -> list[torch.Tensor]:
    return [reduce_scatter_tensor(t, reduce_op, group_size, group_name) for t in inputs]


def all_to_all_single(input: torch.Tensor, output_split_sizes: list[int] | None,
                      input_split_sizes: list[int] | None, group_name: str) -> torch.Tensor:
    pg = pg_by_name(group_name)
    inp = input.detach().contiguous()
    if output_split_sizes is None or len(output_split_sizes) == 0:
        out = _buffers.empty_like(inp)
        out_splits = None
    else:
        out = _buffers.empty_like(inp, [sum(int(s) for s in output_split_sizes), *inp.shape[1:]])
        out_splits = [int(s) for s in output_split_sizes]
    in_splits = [int(s) for s in input_split_sizes] if input_split_sizes else None
    work = C.all_to_all_single(out, inp, out_splits, in_splits, pg, async_op=_async(_nbytes(inp) + _nbytes(out)))
    _register([out], work)
    return out


def broadcast(input: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
    """``src`` is the source's rank within the group (torch's functional op says the same)."""
    out = _snapshot(input)
    work = C.broadcast(out, group=pg_by_name(group_name), async_op=_async(_nbytes(out)), group_src=src)
    _register([out], work)
    return out


def _check_size(pg: Any, group_size: int, opname: str) -> None:
    if pg.size() != group_size:
        raise ValueError(f"{opname}: group_size {group_size} does not match the group's size {pg.size()}")
