"""Reduce operations, per-collective option objects and defaults.

Names and fields follow torch.distributed (``AllreduceOptions.reduceOp``,
``BroadcastOptions.rootRank`` ...) so code that builds option objects by hand runs as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from typing import Any

DEFAULT_TIMEOUT = timedelta(minutes=30)
UNSET_TIMEOUT = timedelta(milliseconds=-1)


class RedOpType(Enum):
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8
    UNUSED = 9


class ReduceOp:
    """A reduction; ``ReduceOp.SUM`` etc. compare equal to their ``RedOpType``.

    ``PREMUL_SUM`` carries a factor that every input is multiplied by before summing
    (build one with :func:`_make_premul_sum`).
    """

    SUM: ReduceOp
    AVG: ReduceOp
    PRODUCT: ReduceOp
    MIN: ReduceOp
    MAX: ReduceOp
    BAND: ReduceOp
    BOR: ReduceOp
    BXOR: ReduceOp
    PREMUL_SUM: ReduceOp
    UNUSED: ReduceOp
    RedOpType = RedOpType

    def __init__(self, op: RedOpType | ReduceOp = RedOpType.SUM, factor: Any = None) -> None:
        if isinstance(op, ReduceOp):
            op, factor = op.op, op.factor if factor is None else factor
        self.op = op
        self.factor = factor

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReduceOp):
            return self.op == other.op
        if isinstance(other, RedOpType):
            return self.op == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.op)

    def __repr__(self) -> str:
        return f"<ReduceOp.{self.op.name}>"

    @property
    def name(self) -> str:
        return self.op.name

    def __int__(self) -> int:
        return self.op.value


for _t in RedOpType:
    setattr(ReduceOp, _t.name, ReduceOp(_t))


def as_reduce_op(op: Any) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, RedOpType):
        return ReduceOp(op)
    if isinstance(op, int):
        return ReduceOp(RedOpType(op))
    if isinstance(op, str):
        return ReduceOp(RedOpType[op.upper()])
    raise TypeError(f"not a reduce op: {op!r}")


def _make_premul_sum(factor: Any) -> ReduceOp:
    return ReduceOp(RedOpType.PREMUL_SUM, factor)


@dataclass
class _Opts:
    timeout: timedelta = field(default_factory=lambda: UNSET_TIMEOUT)


@dataclass
class AllreduceOptions(_Opts):
    reduceOp: Any = ReduceOp.SUM
    sparseIndices: Any = None


@dataclass
class AllreduceCoalescedOptions(AllreduceOptions):
    pass


@dataclass
class BroadcastOptions(_Opts):
    rootRank: int = 0
    rootTensor: int = 0
    asyncOp: bool = True


@dataclass
class ReduceOptions(_Opts):
    reduceOp: Any = ReduceOp.SUM
    rootRank: int = 0
    rootTensor: int = 0


@dataclass
class AllgatherOptions(_Opts):
    asyncOp: bool = True


@dataclass
class GatherOptions(_Opts):
    rootRank: int = 0


@dataclass
class ScatterOptions(_Opts):
    rootRank: int = 0
    asyncOp: bool = True


@dataclass
class ReduceScatterOptions(_Opts):
    reduceOp: Any = ReduceOp.SUM
    asyncOp: bool = True


@dataclass
class AllToAllOptions(_Opts):
    pass


@dataclass
class BarrierOptions(_Opts):
    device_ids: list = field(default_factory=list)
    device: Any = None
