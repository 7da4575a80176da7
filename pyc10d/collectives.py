"""Tensor collectives of the public API (``dist.all_reduce`` ...), torch signatures and defaults.

Each function resolves its group, translates ranks and checks arguments through
``_preamble`` and hands the low-level call to the group's backend.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
from typing_extensions import deprecated

from ._preamble import (
    as_real,
    check_tensor,
    check_tensor_list,
    ensure_same_dtype,
    group_or_warn,
    group_rank,
    invoke,
    tracing,
)
from .types import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    RedOpType,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    as_reduce_op,
)
from .world import current_world

__all__ = [
    "all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather",
    "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced", "gather", "gather_single",
    "gather_into_tensor", "scatter",
    "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all_single",
    "all_to_all", "barrier", "monitored_barrier", "_broadcast_coalesced", "all_gather_single",
    "reduce_scatter_single", "supports_complex",
]

_COMPLEX_OK = (RedOpType.SUM, RedOpType.AVG, RedOpType.PREMUL_SUM)


def supports_complex(reduceOp: Any) -> bool:  # noqa: N803 - torch's name
    """Whether ``reduceOp`` reduces complex tensors (elementwise on their real view)."""
    return as_reduce_op(reduceOp).op in _COMPLEX_OK


def _complex_view(t: torch.Tensor, op: ReduceOp, opname: str) -> torch.Tensor:
    if t.is_complex():
        if op.op not in _COMPLEX_OK:
            raise ValueError(f"{opname} does not support {op} on complex tensors")
        return torch.view_as_real(t)
    return t


def _lane(group: Any) -> Any:
    """The engine of ``group`` (default: the default group) when it has the lean lane and
    the call is a real run (under a trace the general path records the op), else None."""
    lane = getattr(current_world().default_pg if group is None else group, "_lane", None)
    return None if lane is None or tracing() else lane


def _lane_root(group: Any, src: int | None, group_src: int | None) -> int | None:
    """The root as a rank of ``group`` for the lane (``group_rank``'s translation), or None
    where that translation refuses (a ``src`` outside the group, both given): the general
    path then raises, saying why."""
    try:
        return group_rank(group, src, group_src, "src")
    except ValueError:
        return None


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Any:
    # The lean lane (``backends.lane``) runs it (an asynchronous call: starts it and answers
    # its Work), or says no having done nothing.
    lane = _lane(group)
    if lane is not None:
        done = lane.lean_allreduce(tensor, op, not async_op)
        if done:
            return done if async_op else None
    check_tensor(tensor, "tensor")
    pg = group_or_warn(group, "all_reduce")
    if pg is None:
        return None
    red = as_reduce_op(op)
    opts = AllreduceOptions(reduceOp=red)
    return invoke(pg, "allreduce", [_complex_view(tensor, red, "all_reduce")], opts, async_op=async_op)


def all_reduce_coalesced(tensors: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Any:
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    check_tensor_list(tensors, "tensor")
    ensure_same_dtype(tensors)
    pg = group_or_warn(group, "all_reduce_coalesced")
    if pg is None:
        return None
    red = as_reduce_op(op)
    tensors = [_complex_view(t, red, "all_reduce_coalesced") for t in tensors]
    work = invoke(pg, "allreduce_coalesced", tensors, AllreduceCoalescedOptions(reduceOp=red), async_op=async_op)
    return work.get_future() if async_op else None


def broadcast(tensor: torch.Tensor, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None) -> Any:
    lane = _lane(group)
    root = None if lane is None else _lane_root(group, src, group_src)
    if root is not None:
        done = lane.lean_broadcast(tensor, root, not async_op)
        if done:
            return done if async_op else None
    check_tensor(tensor, "tensor")
    pg = group_or_warn(group, "broadcast")
    if pg is None:
        return None
    opts = BroadcastOptions(rootRank=group_rank(pg, src, group_src, "src"), rootTensor=0)
    return invoke(pg, "broadcast", [as_real(tensor)], opts, async_op=async_op)


def reduce(tensor: torch.Tensor, dst: int | None = None, op: Any = ReduceOp.SUM, group: Any = None,
           async_op: bool = False, group_dst: int | None = None) -> Any:
    check_tensor(tensor, "tensor")
    pg = group_or_warn(group, "reduce")
    if pg is None:
        return None
    red = as_reduce_op(op)
    opts = ReduceOptions(reduceOp=red, rootRank=group_rank(pg, dst, group_dst, "dst"))
    return invoke(pg, "reduce", [_complex_view(tensor, red, "reduce")], opts, async_op=async_op)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    check_tensor_list(tensor_list, "tensor_list")
    check_tensor(tensor, "tensor")
    ensure_same_dtype(tensor_list, tensor)
    pg = group_or_warn(group, "all_gather")
    if pg is None:
        return None
    outs = [as_real(t) for t in tensor_list]
    return invoke(pg, "allgather", [outs], [as_real(tensor)], AllgatherOptions(), async_op=async_op)


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None,
                           async_op: bool = False) -> Any:
    lane = _lane(group)
    if lane is not None:
        done = lane.lean_allgather(output_tensor, input_tensor, not async_op)
        if done:
            return done if async_op else None
    check_tensor(output_tensor, "output_tensor")
    check_tensor(input_tensor, "input_tensor")
    ensure_same_dtype(output_tensor, input_tensor)
    pg = group_or_warn(group, "all_gather_into_tensor")
    if pg is None:
        return None
    return invoke(pg, "_allgather_base", as_real(output_tensor), as_real(input_tensor), AllgatherOptions(),
                  async_op=async_op)


_all_gather_base = all_gather_into_tensor
all_gather_single = all_gather_into_tensor  # torch 2.13's name for it


def all_gather_coalesced(output_tensor_lists: list[list[torch.Tensor]], input_tensor_list: list[torch.Tensor],
                         group: Any = None, async_op: bool = False) -> Any:
    if not isinstance(output_tensor_lists, (list, tuple)) or not all(
        isinstance(x, (list, tuple)) for x in output_tensor_lists
    ):
        raise TypeError(
            "Invalid function argument: output_tensor_lists should be a list of lists of tensors"
        )
    for out in output_tensor_lists:
        check_tensor_list(out, "output_tensor_lists")
    check_tensor_list(input_tensor_list, "input_tensor_list")
    ensure_same_dtype(input_tensor_list)
    for out in output_tensor_lists:
        ensure_same_dtype(out)
    pg = group_or_warn(group, "all_gather_coalesced")
    if pg is None:
        return None
    outs = [[as_real(t) for t in out] for out in output_tensor_lists]
    ins = [as_real(t) for t in input_tensor_list]
    work = invoke(pg, "allgather_coalesced", outs, ins, AllgatherOptions(), async_op=async_op)
    return work.get_future() if async_op else None


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: int | None = None,
           group: Any = None, async_op: bool = False, group_dst: int | None = None) -> Any:
    check_tensor(tensor, "tensor")
    if gather_list:
        check_tensor_list(gather_list, "gather_list")
    ensure_same_dtype(tensor, gather_list)
    pg = group_or_warn(group, "gather")
    if pg is None:
        return None
    root = group_rank(pg, dst, group_dst, "dst")
    outs = [[as_real(t) for t in gather_list]] if pg.rank() == root else []
    if pg.rank() == root and not gather_list:
        raise ValueError("gather: the destination rank must pass gather_list")
    return invoke(pg, "gather", outs, [as_real(tensor)], GatherOptions(rootRank=root), async_op=async_op)


def gather_single(tensor: torch.Tensor, gather_tensor: torch.Tensor | None = None, dst: int | None = None,
                  group: Any = None, async_op: bool = False, group_dst: int | None = None) -> Any:
    """torch 2.14's gather into one tensor on ``dst``: ``gather_tensor`` (the destination's
    only) holds every rank's ``tensor`` in rank order, contiguous, as a flat concatenation or
    a stack; the other ranks pass None."""
    check_tensor(tensor, "tensor")
    pg = group_or_warn(group, "gather_single")
    if pg is None:
        return None
    root = group_rank(pg, dst, group_dst, "dst")
    if pg.rank() == root:
        if gather_tensor is None:
            raise ValueError("gather_tensor must be specified on the destination rank")
        check_tensor(gather_tensor, "gather_tensor")
        ensure_same_dtype(tensor, gather_tensor)
        out = as_real(gather_tensor)
    else:
        out = tensor.new_empty(0)  # unused off the root, as in torch
    return invoke(pg, "gather_single", out, as_real(tensor), GatherOptions(rootRank=root), async_op=async_op)


@deprecated("`pyc10d.gather_into_tensor` is deprecated. Please use `pyc10d.gather_single` instead.",
            category=FutureWarning)
def gather_into_tensor(tensor: torch.Tensor, gather_tensor: torch.Tensor | None = None, dst: int | None = None,
                       group: Any = None, async_op: bool = False, group_dst: int | None = None) -> Any:
    """torch 2.14's deprecated name of ``gather_single``."""
    return gather_single(tensor, gather_tensor, dst, group, async_op, group_dst)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None, src: int | None = None,
            group: Any = None, async_op: bool = False, group_src: int | None = None) -> Any:
    check_tensor(tensor, "tensor")
    if scatter_list:
        check_tensor_list(scatter_list, "scatter_list")
    ensure_same_dtype(tensor, scatter_list)
    pg = group_or_warn(group, "scatter")
    if pg is None:
        return None
    root = group_rank(pg, src, group_src, "src")
    if pg.rank() == root and not scatter_list:
        raise ValueError("scatter: the source rank must pass scatter_list")
    ins = [[as_real(t) for t in scatter_list]] if pg.rank() == root else []
    return invoke(pg, "scatter", [as_real(tensor)], ins, ScatterOptions(rootRank=root), async_op=async_op)


def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: Any = ReduceOp.SUM,
                   group: Any = None, async_op: bool = False) -> Any:
    check_tensor(output, "output")
    check_tensor_list(input_list, "input_list")
    ensure_same_dtype(output, input_list)
    pg = group_or_warn(group, "reduce_scatter")
    if pg is None:
        return None
    red = as_reduce_op(op)
    return invoke(pg, "reduce_scatter", [output], [list(input_list)], ReduceScatterOptions(reduceOp=red),
                  async_op=async_op)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None,
                          async_op: bool = False) -> Any:
    lane = _lane(group)
    if lane is not None:
        done = lane.lean_reduce_scatter(output, input, op, not async_op)
        if done:
            return done if async_op else None
    check_tensor(output, "output")
    check_tensor(input, "input")
    ensure_same_dtype(output, input)
    pg = group_or_warn(group, "reduce_scatter_tensor")
    if pg is None:
        return None
    red = as_reduce_op(op)
    return invoke(pg, "_reduce_scatter_base", _complex_view(output, red, "reduce_scatter_tensor"),
                  _complex_view(input, red, "reduce_scatter_tensor"), ReduceScatterOptions(reduceOp=red),
                  async_op=async_op)


_reduce_scatter_base = reduce_scatter_tensor
reduce_scatter_single = reduce_scatter_tensor  # torch 2.13's name for it


def all_to_all_single(output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group: Any = None, async_op: bool = False) -> Any:
    if not async_op and output_split_sizes is None and input_split_sizes is None:
        lane = _lane(group)
        if lane is not None and lane.lean_alltoall(output, input):
            return None
    check_tensor(output, "output")
    check_tensor(input, "input")
    ensure_same_dtype(output, input)
    if not (output.is_contiguous() and input.is_contiguous()):
        raise ValueError("all_to_all_single: Tensors must be contiguous")
    pg = group_or_warn(group, "all_to_all_single")
    if pg is None:
        return None
    if input.is_complex():
        input, output = torch.view_as_real(input), torch.view_as_real(output)
    return invoke(pg, "alltoall_base", output, input, _split_list(output_split_sizes),
                  _split_list(input_split_sizes), AllToAllOptions(), async_op=async_op)


def _split_list(sizes: Any) -> list[int]:
    """Split sizes as a list of ints; torch also takes a tensor of them (None: even split)."""
    if sizes is None:
        return []
    return [int(s) for s in (sizes.tolist() if isinstance(sizes, torch.Tensor) else sizes)]


def all_to_all(output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor], group: Any = None,
               async_op: bool = False) -> Any:
    check_tensor_list(output_tensor_list, "output_tensor_list")
    check_tensor_list(input_tensor_list, "input_tensor_list")
    ensure_same_dtype(output_tensor_list, input_tensor_list)
    pg = group_or_warn(group, "all_to_all")
    if pg is None:
        return None
    return invoke(pg, "alltoall", [as_real(t) for t in output_tensor_list], [as_real(t) for t in input_tensor_list],
                  AllToAllOptions(), async_op=async_op)


def barrier(group: Any = None, async_op: bool = False, device_ids: list[int] | None = None) -> Any:
    if not device_ids:
        lane = _lane(group)
        if lane is not None:
            done = lane.lean_barrier(not async_op)
            if done:
                return done if async_op else None
    pg = group_or_warn(group, "barrier")
    if pg is None:
        return None
    return invoke(pg, "barrier", BarrierOptions(device_ids=list(device_ids or [])), async_op=async_op)


def monitored_barrier(group: Any = None, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
    """Barrier where rank 0 names every rank that did not arrive within ``timeout``."""
    pg = group_or_warn(group, "monitored_barrier")
    if pg is None:
        return None
    return pg._get_backend().monitored_barrier(timeout, wait_all_ranks)


def _broadcast_coalesced(process_group: Any, tensors: list[torch.Tensor], buffer_size: int, src: int = 0) -> None:
    """Broadcast many tensors in few messages: pack same-dtype runs into buckets of ``buffer_size`` bytes."""
    bucket: list[torch.Tensor] = []
    size = 0

    def flush() -> None:
        nonlocal bucket, size
        if not bucket:
            return
        packed = torch.cat([t.detach().reshape(-1) for t in bucket])
        invoke(process_group, "broadcast", [packed], BroadcastOptions(rootRank=src))
        offset = 0
        for t in bucket:
            t.detach().copy_(packed[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        bucket, size = [], 0

    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and (t.dtype != bucket[0].dtype or size + nbytes > buffer_size):
            flush()
        bucket.append(t)
        size += nbytes
    flush()
