"""``pyc10d.constants``: torch's ``torch.distributed.constants``, for programs that import it.

Also home of the deprecated ``reduce_op`` alias (re-exported as ``pyc10d.reduce_op``).

The values are torch's own (read from torch at import), so a timeout computed from them means
the same on either library: ``default_pg_timeout`` is the 30-minute default of non-NCCL
groups; ``default_pg_nccl_timeout`` is ``None`` on a torch built without NCCL, as in torch.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

from .types import DEFAULT_TIMEOUT, RedOpType

try:  # torch's C++ default, should a build ever differ from pyc10d's
    from torch._C._distributed_c10d import _DEFAULT_PG_TIMEOUT as _TORCH_PG_TIMEOUT
except ImportError:  # pragma: no cover - torch without distributed
    _TORCH_PG_TIMEOUT = DEFAULT_TIMEOUT

try:
    from torch._C._distributed_c10d import _DEFAULT_PG_NCCL_TIMEOUT as _TORCH_NCCL_TIMEOUT
except ImportError:  # a CPU build: torch has no NCCL default either
    _TORCH_NCCL_TIMEOUT = None

#: Default timeout of a process group's operations (every pyc10d backend).
default_pg_timeout: timedelta = _TORCH_PG_TIMEOUT
#: torch's default for NCCL groups; ``None`` where torch was built without NCCL.
default_pg_nccl_timeout: timedelta | None = _TORCH_NCCL_TIMEOUT

__all__ = ["default_pg_nccl_timeout", "default_pg_timeout", "reduce_op"]


class _DeprecatedReduceOp:
    """torch's deprecated ``reduce_op`` enum: ``reduce_op.SUM`` is ``ReduceOp.SUM``'s op type.

    Kept because old programs still spell it; every attribute read warns with torch's
    ``FutureWarning`` text (pyc10d's names in it), so such programs hear what torch would tell them.
    """

    def __init__(self) -> None:
        for name, value in RedOpType.__members__.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "__members__", RedOpType.__members__)

    def __getattribute__(self, key: str) -> Any:
        warnings.warn(
            "`pyc10d.reduce_op` is deprecated, please use `pyc10d.ReduceOp` instead",
            FutureWarning,
            stacklevel=2,
        )
        return object.__getattribute__(self, key)


#: Deprecated alias of the reduce op types, as ``torch.distributed.reduce_op``.
reduce_op = _DeprecatedReduceOp()
