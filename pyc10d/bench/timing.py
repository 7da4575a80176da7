"""The ways the benchmarks time a collective: back to back, as training code calls it, and
spaced out by the caller's own work, as a training step calls it between its kernels.

nccl-tests' way: one barrier, then ``k`` calls in a row, the loop's time / ``k``, and the
slowest rank's figure (an operation is over when its last rank is). A barrier before each
call would hide what ranks drifting apart costs; the benchmarks that report that do it as
a second figure of their own.

Back to back, every call finds the code and data of the previous one in the CPU's caches.
A model's collectives do not: a decoder layer's matmuls run between two all_reduces. On
this project's 2-core VM a small call after a millisecond of other work costs several times
its back-to-back figure, in C as in Python (a one-process diagnostic: a ctypes ``getpid``
0.8 us hot, 4-6 us after 1 ms of a busy loop that touches no memory, 13-25 us after 10 ms;
Open MPI's 2 KiB Allreduce at n=2, 3.6 us back to back, 17.7 us after 1 ms): the machine,
not the loop, evicts them. ``spaced`` measures that figure (``bench --mode spaced``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: The timing modes of the collective benchmark (``worker.time_op`` says what each times), and
#: those the C reference's worker (``mpi_worker``: blocking calls only) has too.
MODES = ("loop", "barrier", "async", "spaced")
BLOCKING_MODES = ("loop", "spaced")

#: The caller's own work between two calls in ``spaced`` (``bench --mode spaced``): about
#: what one decoder layer's two matmuls take here (d=1024, bf16, one thread).
GAP_S = 1e-3


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


def busy(seconds: float) -> None:
    """Keep the CPU busy for ``seconds`` without touching memory (the stand-in for a step's
    compute in ``spaced``: it evicts nothing itself, so what a call loses after it is what
    the machine took meanwhile)."""
    clock = time.perf_counter
    end = clock() + seconds
    while clock() < end:
        pass


def spaced(body: Callable[[int], Any], gap_s: float = GAP_S) -> Callable[[int], None]:
    """``body`` with ``busy(gap_s)`` before every call: time it with ``back_to_back`` and
    subtract ``gap_s`` (``per_call``) for the figure of a call a training step makes."""

    def call(i: int) -> None:
        busy(gap_s)
        body(i)

    return call


def per_call(loop_s: float, gap_s: float) -> float:
    """A ``spaced`` loop's seconds per call, less the caller's own work (the busy loop ends at
    its deadline within a clock read, ~0.1 us)."""
    return loop_s - gap_s
