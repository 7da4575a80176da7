"""reduce_scatter, chunked over shared memory: each rank reduces its own block directly.

The input is n blocks of k elements. Chunk j takes elements [j·L, (j+1)·L) of every block:
each rank copies those n pieces into its slot (IN, skipping its own piece), and rank r then
reduces piece r across all slots straight into its output (RED). Phase s does RED(s-1) and
IN(s), so m chunks take m phases; with one chunk this is the flat exchange.

Cost per rank: copies (n-1)/n·S in (its own piece is read from its input, except in the
single-chunk case where one copy of everything is cheaper than two partial ones), reads S
and writes S/n to reduce; about 1.5 memcpy-equivalents of its input, and no copy out.
"""

from __future__ import annotations

import torch

from ..types import RedOpType, ReduceOp
from .comm import flat
from .reduce_ops import kernel
from .shm_comm import (
    ShmComm,
    await_phase,
    descriptor_head,
    input_start,
    nbytes_of,
    reduce_many,
    reduce_rows,
    split_step,
)


def reduce_scatter_shm_chunked(comm: ShmComm, blocks: torch.Tensor, out: torch.Tensor, op: ReduceOp) -> None:
    """``blocks``: the (n, k) input; ``out``: the (k,) output of this rank."""
    n, r, k = comm.size, comm.rank, out.numel()
    piece = block_piece(comm, out.dtype)
    m = max(1, -(-k // piece))

    def span(j: int) -> tuple[int, int]:
        return j * piece, min(piece, k - j * piece)

    own = m > 1  # several chunks: read my own piece from my input, never copy it in

    def red(c: int, j: int) -> None:
        lo, length = span(j)
        slots = comm.slots(c, out.dtype)
        xs = [blocks[p, lo:lo + length] if p == r and own else slots[p, r * length:(r + 1) * length]
              for p in range(n)]
        reduce_many(out[lo:lo + length], xs, op)

    c = comm.start("reduce_scatter", out.dtype, nbytes_of(blocks), red=op)
    for s in range(m):
        if s:
            c = comm.next_phase()
            red(c - 1, s - 1)
        lo, length = span(s)
        mine = comm.slots(c, out.dtype)[r, :n * length].view(n, length)
        if not own:
            mine.copy_(blocks[:, lo:lo + length])
        else:
            if r:
                mine[:r].copy_(blocks[:r, lo:lo + length])
            if r < n - 1:
                mine[r + 1:].copy_(blocks[r + 1:, lo:lo + length])
        comm.post(c)
        comm.wait_all(c)
    red(c, m - 1)


def block_piece(comm: ShmComm, dtype: torch.dtype) -> int:
    """Elements of each of the n blocks one phase carries in a rank's slot (cache-line
    aligned): the chunk of reduce_scatter, and of all_to_all."""
    align = comm.align(dtype)
    return max(align, comm.elems(dtype) // comm.size // align * align)


def reduce_scatter_shm_flat_step(comm: ShmComm, op: ReduceOp, dtype: torch.dtype, k: int):
    """``reduce_scatter_shm_chunked`` in one chunk, made once for the lean lane
    (``backends/lane.py``): ``step(out, inp, deadline, timeout)`` with ``out`` (k,) and
    ``inp`` (n·k,), both contiguous. Same phase, descriptor, copy and reduction order (every
    rank's piece, rank order); AVG divides as ``finish`` does. False when n pieces of ``k``
    elements do not fit one phase."""
    if k > block_piece(comm, dtype):
        return False
    arena = comm.arena
    rank, n = arena.rank, arena.size
    nbytes = n * k * dtype.itemsize
    head = descriptor_head("reduce_scatter", dtype, op)
    mine = [arena.slots(p, dtype)[rank, :n * k] for p in (0, 1)]  # the n pieces, contiguous
    pieces = [[arena.slots(p, dtype)[q, rank * k:(rank + 1) * k] for q in range(n)] for p in (0, 1)]
    fn = kernel(op, dtype)
    avg = op.op is RedOpType.AVG

    op_name = "reduce_scatter_tensor"

    def finish(out: torch.Tensor, inp: torch.Tensor, c: int, deadline: float) -> None:
        await_phase(arena, c, deadline, op_name)
        o = flat(out)
        reduce_rows(fn, o, pieces[c & 1])
        if avg:
            o.div_(n)

    return split_step(arena, op_name, input_start(arena, head, nbytes, op_name, mine), finish)
