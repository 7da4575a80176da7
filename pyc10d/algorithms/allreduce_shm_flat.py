"""all_reduce (and reduce), flat over shared memory: one phase, every rank reduces it all.

Cost: 1 phase (one wait for all ranks). Each rank copies S bytes into its slot, then reads
the n slots (n·S bytes) and writes S; with ``root`` given only the root reads. Best while S
is small enough that the single synchronisation dominates (see ``select_shm``). Every
reader reduces the slots in rank order, so all ranks get identical bytes. With ``src`` the
input is read from ``src`` and ``t`` only receives the result (out of place, same cost).
"""

from __future__ import annotations

import torch

from ..types import RedOpType, ReduceOp
from .reduce_ops import kernel
from .shm_comm import (
    ShmComm,
    await_phase,
    descriptor_head,
    nbytes_of,
    open_phase,
    reduce_many,
    reduce_rows,
    split_step,
)


def allreduce_shm_flat(comm: ShmComm, t: torch.Tensor, op: ReduceOp, root: int | None = None,
                       src: torch.Tensor | None = None) -> None:
    c = comm.start("allreduce" if root is None else "reduce", t.dtype, nbytes_of(t), root or 0, red=op)
    rows = comm.rows(c, t.dtype, t.numel())
    rows[comm.rank].copy_(t if src is None else src)
    comm.post(c)
    comm.wait_all(c)
    if root is None or comm.rank == root:
        reduce_many(t, rows, op)


def allreduce_shm_flat_step(comm: ShmComm, op: ReduceOp, dtype: torch.dtype, shape: torch.Size):
    """``allreduce_shm_flat`` of every tensor of ``dtype`` and ``shape`` with ``op``, made once.

    The same phase, descriptor, copy and reduction in the same order as the function above
    (a rank running it and a rank running that one exchange correctly), with what they
    compute per call computed here: the descriptor word, the slot rows of both parities, the
    kernel, whether AVG divides. The lean lane (``backends/lane.py``) runs it as
    ``step(t, None, deadline, timeout)``; it reaches the arena directly.
    """
    arena = comm.arena
    rank, n = arena.rank, arena.size
    numel = shape.numel()
    nbytes = numel * dtype.itemsize
    head = descriptor_head("allreduce", dtype, op)
    rows = (arena.rows(0, dtype, numel), arena.rows(1, dtype, numel))
    fn = kernel(op, dtype)
    avg = op.op is RedOpType.AVG
    reshape = len(shape) != 1

    def start(t: torch.Tensor, _: None, deadline: float, timeout: float) -> int:
        c = open_phase(arena, head, nbytes, deadline, timeout, "allreduce")
        rows[c & 1][rank].copy_(t.view(-1) if reshape else t)
        arena.post(c)
        return c

    def finish(t: torch.Tensor, _: None, c: int, deadline: float) -> None:
        await_phase(arena, c, deadline, "allreduce")
        out = t.view(-1) if reshape else t
        reduce_rows(fn, out, rows[c & 1])
        if avg:
            out.div_(n)

    return split_step(arena, "allreduce", start, finish)
