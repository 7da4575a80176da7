"""all_reduce (and reduce), chunked over shared memory: reduce-scatter then all-gather.

The tensor goes through the arena in chunks of one slot. For chunk j every rank copies it
into its slot (IN), rank r reduces sub-slice r of the chunk across all slots into the shared
result (RED), then every rank copies the whole reduced chunk out (OUT). The three stages of
consecutive chunks overlap: phase s does RED(s-1), OUT(s-2) and IN(s), so ranks reduce in
parallel and m chunks take m + 1 phases.

Cost per rank: copies S in (minus its own sub-slices, read from its tensor directly), reads
S and writes S/n to reduce, copies S out; 2 + 1/n memcpy-equivalents, independent of n.
Each sub-slice is reduced once, by its owner, so all ranks end with identical bytes. With
``root`` given only the root copies out (reduce). With ``src`` the input is read from
``src`` and ``t`` only receives the result (out of place, same cost).
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .shm_comm import ShmComm, nbytes_of, reduce_many


def allreduce_shm_rsag(comm: ShmComm, t: torch.Tensor, op: ReduceOp, root: int | None = None,
                       src: torch.Tensor | None = None) -> None:
    n, r, numel = comm.size, comm.rank, t.numel()
    x = t if src is None else src  # read from x, write the result to t
    align = comm.align(t.dtype)
    chunk = max(align * n, comm.elems(t.dtype) // (align * n) * (align * n))
    m = max(1, -(-numel // chunk))
    out_here = root is None or r == root

    def bounds(j: int) -> tuple[int, int, int, int]:
        """(chunk start, chunk length, my sub-slice start, end) within the chunk."""
        lo = j * chunk
        length = min(chunk, numel - lo)
        per = -(-length // n)
        per = -(-per // align) * align
        return lo, length, min(r * per, length), min((r + 1) * per, length)

    c = comm.start("allreduce" if root is None else "reduce", t.dtype, nbytes_of(t), root or 0, red=op)
    for s in range(m + 1):
        if s:
            c = comm.next_phase()
        if s >= 1:  # RED(s-1): my sub-slice of the previous chunk, over every rank's slot
            lo, length, a, b = bounds(s - 1)
            slots = comm.slots(c - 1, t.dtype)
            xs = [x[lo + a:lo + b] if p == r else slots[p, a:b] for p in range(n)]
            reduce_many(comm.result(c - 1, t.dtype)[a:b], xs, op)
        if s >= 2 and out_here:  # OUT(s-2)
            lo, length, _, _ = bounds(s - 2)
            t[lo:lo + length].copy_(comm.result(c, t.dtype)[:length])
        if s < m:  # IN(s): everything but my own sub-slice, which RED reads in place
            lo, length, a, b = bounds(s)
            mine = comm.slots(c, t.dtype)[r]
            if a:
                mine[:a].copy_(x[lo:lo + a])
            if b < length:
                mine[b:length].copy_(x[lo + b:lo + length])
        comm.post(c)
        comm.wait_all(c)
    if out_here:  # OUT(m-1), after the last phase
        lo, length, _, _ = bounds(m - 1)
        t[lo:lo + length].copy_(comm.result(c - 1, t.dtype)[:length])
