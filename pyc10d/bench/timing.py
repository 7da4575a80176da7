"""The one way the benchmarks time a collective: back to back, as training code calls it.

nccl-tests' way: one barrier, then ``k`` calls in a row, the loop's time / ``k``, and the
slowest rank's figure (an operation is over when its last rank is). A barrier before each
call would hide what ranks drifting apart costs; the benchmarks that report that do it as
a second figure of their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def back_to_back(dist: Any, body: Callable[[int], Any], k: int, group: Any = None) -> float:
    """Seconds per call of ``body(0) ... body(k - 1)`` run back to back after a barrier, max
    over the ranks of ``group`` (``dist``: ``pyc10d`` or ``torch.distributed``; every rank
    of the group calls it)."""
    import torch

    dist.barrier(group=group)
    t0 = time.perf_counter()
    for i in range(k):
        body(i)
    t = torch.tensor([(time.perf_counter() - t0) / k], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)
