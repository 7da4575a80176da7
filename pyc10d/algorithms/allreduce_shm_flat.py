"""all_reduce (and reduce), flat over shared memory: one phase, every rank reduces it all.

Cost: 1 phase (one wait for all ranks). Each rank copies S bytes into its slot, then reads
the n slots (n·S bytes) and writes S; with ``root`` given only the root reads. Best while S
is small enough that the single synchronisation dominates (see ``select_shm``). Every
reader reduces the slots in rank order, so all ranks get identical bytes. With ``src`` the
input is read from ``src`` and ``t`` only receives the result (out of place, same cost).
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .shm_comm import ShmComm, nbytes_of, reduce_many


def allreduce_shm_flat(comm: ShmComm, t: torch.Tensor, op: ReduceOp, root: int | None = None,
                       src: torch.Tensor | None = None) -> None:
    c = comm.start("allreduce" if root is None else "reduce", t.dtype, nbytes_of(t), root or 0, red=op)
    rows = comm.rows(c, t.dtype, t.numel())
    rows[comm.rank].copy_(t if src is None else src)
    comm.post(c)
    comm.wait_all(c)
    if root is None or comm.rank == root:
        reduce_many(t, rows, op)
