"""all_gather, chunked over shared memory: copy in, then every rank copies every slot out.

Chunk j of each rank's input goes into its slot (IN); after the phase every rank copies all
n slots into its output in one strided copy (OUT). Phase s does OUT(s-1) and IN(s), so m
chunks take m phases; with one chunk this is the flat exchange.

Cost per rank: copies B in and n·B out (B = one rank's part), two kernels per phase.
"""

from __future__ import annotations

import torch

from .comm import flat
from .shm_comm import (
    CAT_BYTES,
    ShmComm,
    await_phase,
    descriptor_head,
    input_start,
    nbytes_of,
    split_step,
)


def allgather_shm_chunked(comm: ShmComm, inp: torch.Tensor, out: torch.Tensor) -> None:
    """``inp``: this rank's (k,) part; ``out``: the (n, k) result."""
    k = inp.numel()
    chunk = _chunk(comm, inp.dtype)
    m = max(1, -(-k // chunk))

    def copy_out(c: int, j: int) -> None:  # every row, this rank's too: one strided copy
        lo = j * chunk
        length = min(chunk, k - lo)
        out[:, lo:lo + length].copy_(comm.slots(c, inp.dtype)[:, :length])

    c = comm.start("allgather", inp.dtype, nbytes_of(inp))
    for s in range(m):
        if s:
            c = comm.next_phase()
            copy_out(c - 1, s - 1)
        lo = s * chunk
        length = min(chunk, k - lo)
        comm.slots(c, inp.dtype)[comm.rank, :length].copy_(inp[lo:lo + length])
        comm.post(c)
        comm.wait_all(c)
    copy_out(c, m - 1)


def _chunk(comm: ShmComm, dtype: torch.dtype) -> int:
    """Elements of one rank's part that one phase carries (a slot, cache-line aligned)."""
    align = comm.align(dtype)
    return max(align, comm.elems(dtype) // align * align)


def allgather_shm_flat_step(comm: ShmComm, dtype: torch.dtype, k: int):
    """``allgather_shm_chunked`` in one chunk, made once for the lean lane
    (``backends/lane.py``): ``step(out, inp, deadline, timeout)`` with ``out`` (n·k,) and
    ``inp`` (k,), both contiguous. Same phase, descriptor and copies. False when ``k``
    elements do not fit one phase."""
    if k > _chunk(comm, dtype):
        return False
    arena = comm.arena
    rank, n = arena.rank, arena.size
    nbytes = k * dtype.itemsize
    head = descriptor_head("allgather", dtype)
    slots = [arena.slots(p, dtype)[:, :k] for p in (0, 1)]
    rows = [arena.rows(p, dtype, k) for p in (0, 1)]
    mine = [r[rank] for r in rows]
    cat = torch.cat if nbytes <= CAT_BYTES else None  # see CAT_BYTES

    op = "allgather_into_tensor"

    def finish(out: torch.Tensor, inp: torch.Tensor, c: int, deadline: float) -> None:
        await_phase(arena, c, deadline, op)
        if cat is not None:
            cat(rows[c & 1], out=flat(out))
        else:
            out.view(n, k).copy_(slots[c & 1])

    return split_step(arena, op, input_start(arena, head, nbytes, op, mine), finish)
