"""The in-place API (``pyc10d.all_reduce(t)`` ...) under ``make_fx`` / ``torch.compile``.

Traced, an in-place collective becomes the functional op, its ``wait_tensor`` and a
``copy_`` of the result into the caller's tensor(s): the graph shows the communication,
as torch's traced ``c10d`` ops do, and replaying it mutates the same tensors. Collectives
without a functional op of their own are expressed through one: reduce as an all-reduce
kept on the root, gather, scatter and all_to_all of lists as an all_to_all_single with the
matching splits. The rest (barrier, the coalesced all-gather, point-to-point) raise an
error naming themselves instead of vanishing from the graph.
"""

from __future__ import annotations

from typing import Any

import torch

from ..backends.work import CompletedWork
from ..types import RedOpType, as_reduce_op
from ._ops import ops


def _op(opts: Any) -> str:
    red = as_reduce_op(opts.reduceOp)
    if red.op == RedOpType.PREMUL_SUM:
        raise RuntimeError("tracing: PREMUL_SUM has no functional form")
    return red.op.name.lower()


def _into(dst: torch.Tensor, result: torch.Tensor) -> None:
    dst.copy_(ops.wait_tensor(result).reshape(dst.shape))


def _allreduce(pg: Any, tensors: list[torch.Tensor], opts: Any) -> list[torch.Tensor]:
    for t in tensors:
        _into(t, ops.all_reduce(t, _op(opts), pg.group_name))
    return tensors


def _broadcast(pg: Any, tensors: list[torch.Tensor], opts: Any) -> list[torch.Tensor]:
    for t in tensors:
        _into(t, ops.broadcast(t, opts.rootRank, pg.group_name))
    return tensors


def _allgather_base(pg: Any, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> list[torch.Tensor]:
    _into(out, ops.all_gather_into_tensor(inp.contiguous(), pg.size(), pg.group_name))
    return [out]


def _allgather(pg: Any, outs: list[list[torch.Tensor]], inps: list[torch.Tensor], opts: Any) -> list[torch.Tensor]:
    if len(inps) != 1:
        raise RuntimeError("allgather: tracing supports one input tensor per rank")
    gathered = ops.wait_tensor(ops.all_gather_into_tensor(inps[0].contiguous().reshape(-1), pg.size(), pg.group_name))
    for o, piece in zip(outs[0], gathered.chunk(pg.size())):
        o.copy_(piece.reshape(o.shape))
    return outs[0]


def _reduce_scatter_base(pg: Any, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> list[torch.Tensor]:
    _into(out, ops.reduce_scatter_tensor(inp.contiguous(), _op(opts), pg.size(), pg.group_name))
    return [out]


def _reduce_scatter(pg: Any, outs: list[torch.Tensor], ins: list[list[torch.Tensor]], opts: Any) -> list[torch.Tensor]:
    packed = torch.cat([t.reshape(-1) for t in ins[0]])
    _into(outs[0], ops.reduce_scatter_tensor(packed, _op(opts), pg.size(), pg.group_name))
    return outs


def _alltoall_base(pg: Any, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
                   opts: Any) -> list[torch.Tensor]:
    _into(out, ops.all_to_all_single(inp.contiguous(), out_splits, in_splits, pg.group_name))
    return [out]


def _allreduce_coalesced(pg: Any, tensors: list[torch.Tensor], opts: Any) -> list[torch.Tensor]:
    outs = ops.all_reduce_coalesced(list(tensors), _op(opts), pg.group_name)
    for t, o in zip(tensors, outs):
        _into(t, o)
    return list(tensors)


def _a2a(pg: Any, parts: list[torch.Tensor], in_splits: list[int], out_splits: list[int],
         like: torch.Tensor) -> torch.Tensor:
    flat = torch.cat([t.reshape(-1) for t in parts]) if parts else like.new_empty(0)
    return ops.wait_tensor(ops.all_to_all_single(flat, out_splits, in_splits, pg.group_name))


def _split_into(outs: list[torch.Tensor], result: torch.Tensor) -> None:
    for o, piece in zip(outs, result.split([o.numel() for o in outs])):
        o.copy_(piece.reshape(o.shape))


def _reduce(pg: Any, tensors: list[torch.Tensor], opts: Any) -> list[torch.Tensor]:
    reduced = ops.wait_tensor(ops.all_reduce(tensors[0], _op(opts), pg.group_name))
    if pg.rank() == opts.rootRank:
        tensors[0].copy_(reduced)
    return tensors


def _scatter(pg: Any, outs: list[torch.Tensor], ins: list[list[torch.Tensor]], opts: Any) -> list[torch.Tensor]:
    n, root, out = pg.size(), opts.rootRank, outs[0]
    out_splits = [out.numel() if i == root else 0 for i in range(n)]
    parts = list(ins[0]) if pg.rank() == root else []
    in_splits = [t.numel() for t in parts] if parts else [0] * n
    out.copy_(_a2a(pg, parts, in_splits, out_splits, out).reshape(out.shape))
    return outs


def _gather(pg: Any, outs: list[list[torch.Tensor]], ins: list[torch.Tensor], opts: Any) -> list[torch.Tensor]:
    n, root, inp = pg.size(), opts.rootRank, ins[0]
    in_splits = [inp.numel() if i == root else 0 for i in range(n)]
    gather_list = list(outs[0]) if pg.rank() == root else []
    out_splits = [t.numel() for t in gather_list] if gather_list else [0] * n
    _split_into(gather_list, _a2a(pg, [inp], in_splits, out_splits, inp))
    return gather_list


def _alltoall(pg: Any, outs: list[torch.Tensor], ins: list[torch.Tensor], opts: Any) -> list[torch.Tensor]:
    _split_into(list(outs), _a2a(pg, list(ins), [t.numel() for t in ins], [o.numel() for o in outs], outs[0]))
    return list(outs)


_TRACED = {
    "reduce": _reduce,
    "scatter": _scatter,
    "gather": _gather,
    "alltoall": _alltoall,
    "allreduce": _allreduce,
    "broadcast": _broadcast,
    "_allgather_base": _allgather_base,
    "allgather": _allgather,
    "_reduce_scatter_base": _reduce_scatter_base,
    "reduce_scatter": _reduce_scatter,
    "alltoall_base": _alltoall_base,
    "allreduce_coalesced": _allreduce_coalesced,
}


def trace(pg: Any, method: str, args: tuple[Any, ...], async_op: bool) -> Any:
    """Record the in-place collective ``method`` as functional ops (see the module docstring)."""
    fn = _TRACED.get(method)
    if fn is None:
        raise RuntimeError(
            f"{method}: this in-place collective cannot be traced by make_fx or torch.compile; "
            f"call it outside the traced function or use pyc10d.functional"
        )
    outputs = fn(pg, *args)
    return CompletedWork(method, outputs) if async_op else None
