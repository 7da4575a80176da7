"""Translation of torch's option objects and reduce ops into pyc10d's.

torch hands a plugin its own C++-backed option objects (``torch.distributed.AllreduceOptions``
...). pyc10d's engines take the same fields under the same names, but a pyc10d engine must not
depend on torch's pybind types: a reduce op is compared with ``RedOpType`` and carries its
pre-multiply factor, a timeout is a ``timedelta``. This module is the one place the two meet.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as tdist

from ..types import (
    UNSET_TIMEOUT,
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
)

_TORCH_UNSET = timedelta(milliseconds=-1)  # torch's "no timeout given" (kUnsetTimeout)
#: torch's reduce op kinds the lean lane serves, to pyc10d's ``ReduceOp`` members
#: (``backends.lane.LANE_OPS``; PREMUL_SUM carries a factor and takes the general path).
#: Keyed by the enum's value: hashing torch's pybind enum costs a microsecond, its value less.
_LANE_OPS = {getattr(tdist.ReduceOp.RedOpType, t.name).value: getattr(ReduceOp, t.name)
             for t in RedOpType if t not in (RedOpType.PREMUL_SUM, RedOpType.UNUSED)}
_SUM = ReduceOp.SUM


def lane_ok(opts: Any, cls: type) -> bool:
    """Whether a call with torch's ``opts`` may take the engine's lean lane: options of
    torch's ``cls`` (not a subclass that may mean more), no timeout of its own. (An
    asynchronous call, ``opts.asyncOp``, is started there; see ``LaneOps._start_step``.)"""
    return opts.__class__ is cls and opts.timeout == _TORCH_UNSET


_TORCH_SUM = tdist.ReduceOp.RedOpType.SUM


def lane_op(opts: Any) -> ReduceOp | None:
    """pyc10d's member for the reduce op of torch's ``opts``; None: the lane does not serve it.

    SUM, the op nearly every call carries, is one comparison of torch's ``ReduceOp`` with its
    kind (0.6 us a call hot, a diagnostic); reading the kind's value through ``.op.value``
    makes two more pybind objects (1.8 us)."""
    red = opts.reduceOp
    if red == _TORCH_SUM:
        return _SUM
    return _LANE_OPS.get(red.op.value)


def reduce_op(op: Any) -> ReduceOp:
    """pyc10d's ``ReduceOp`` for torch's (a ``ReduceOp``, a ``RedOpType`` or an int).

    The enum values are the same in both libraries; ``PREMUL_SUM`` keeps its factor.
    """
    if isinstance(op, ReduceOp):
        return op
    kind = getattr(op, "op", op)  # torch's ReduceOp wraps its RedOpType in ``.op``
    value = int(getattr(kind, "value", kind))
    red = ReduceOp(RedOpType(value))
    if red.op == RedOpType.PREMUL_SUM:
        red.factor = getattr(op, "factor", None)
    return red


def timeout(opts: Any) -> timedelta:
    """The per-call timeout; torch's "unset" (-1 ms) lets the engine use its group default."""
    value = getattr(opts, "timeout", None)
    return value if isinstance(value, timedelta) else UNSET_TIMEOUT


def is_sync(opts: Any) -> bool:
    """True when torch says the caller will wait at once (``async_op=False``).

    The engine may then run the operation on the caller's thread, skipping the hop to the
    progress thread; asynchronous calls (and callers that say nothing) keep the queue.
    """
    return getattr(opts, "asyncOp", True) is False


def allreduce(opts: Any) -> AllreduceOptions:
    if opts is None or isinstance(opts, AllreduceOptions):
        return opts or AllreduceOptions()
    if not hasattr(opts, "reduceOp"):  # ``pg.allreduce(tensors, ReduceOp.MAX)``
        return AllreduceOptions(reduceOp=reduce_op(opts))
    return AllreduceOptions(timeout=timeout(opts), reduceOp=reduce_op(opts.reduceOp))


def allreduce_coalesced(opts: Any) -> AllreduceCoalescedOptions:
    if opts is None or isinstance(opts, AllreduceCoalescedOptions):
        return opts or AllreduceCoalescedOptions()
    return AllreduceCoalescedOptions(timeout=timeout(opts), reduceOp=reduce_op(opts.reduceOp))


def broadcast(opts: Any) -> BroadcastOptions:
    if opts is None or isinstance(opts, BroadcastOptions):
        return opts or BroadcastOptions()
    return BroadcastOptions(timeout=timeout(opts), rootRank=opts.rootRank, rootTensor=opts.rootTensor)


def reduce(opts: Any) -> ReduceOptions:
    if opts is None or isinstance(opts, ReduceOptions):
        return opts or ReduceOptions()
    return ReduceOptions(
        timeout=timeout(opts), reduceOp=reduce_op(opts.reduceOp), rootRank=opts.rootRank,
        rootTensor=opts.rootTensor,
    )


def allgather(opts: Any) -> AllgatherOptions:
    if opts is None or isinstance(opts, AllgatherOptions):
        return opts or AllgatherOptions()
    return AllgatherOptions(timeout=timeout(opts))


def gather(opts: Any) -> GatherOptions:
    if opts is None or isinstance(opts, GatherOptions):
        return opts or GatherOptions()
    return GatherOptions(timeout=timeout(opts), rootRank=opts.rootRank)


def scatter(opts: Any) -> ScatterOptions:
    if opts is None or isinstance(opts, ScatterOptions):
        return opts or ScatterOptions()
    return ScatterOptions(timeout=timeout(opts), rootRank=opts.rootRank)


def reduce_scatter(opts: Any) -> ReduceScatterOptions:
    if opts is None or isinstance(opts, ReduceScatterOptions):
        return opts or ReduceScatterOptions()
    return ReduceScatterOptions(timeout=timeout(opts), reduceOp=reduce_op(opts.reduceOp))


def alltoall(opts: Any) -> AllToAllOptions:
    if opts is None or isinstance(opts, AllToAllOptions):
        return opts or AllToAllOptions()
    return AllToAllOptions(timeout=timeout(opts))


def barrier(opts: Any) -> BarrierOptions:
    if opts is None or isinstance(opts, BarrierOptions):
        return opts or BarrierOptions()
    return BarrierOptions(timeout=timeout(opts))
