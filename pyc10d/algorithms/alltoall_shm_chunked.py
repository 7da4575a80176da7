"""all_to_all (any split sizes), chunked over shared memory.

``ins[q]`` goes to rank q, ``outs[p]`` comes from rank p (flat tensors, any lengths that
agree between the pairs). Each rank's slot is cut into n pieces of P elements; in round j a
rank copies elements [j·P, (j+1)·P) of each outgoing block into piece q of its slot (IN),
and after the phase copies piece r of every other rank's slot into its incoming blocks
(OUT); its own block goes input to output directly. Phase j does OUT(j-1) and IN(j). Every
rank publishes its n send sizes in the arena's meta row, so each rank checks that what it
receives matches what was sent, and all agree on the number of rounds (from the largest
block anywhere): uneven splits never make ranks disagree on the phases.

Cost per rank: copies its outgoing (n-1)/n share in and its incoming share out, plus its
own block once.
"""

from __future__ import annotations

import torch

from ..errors import DistBackendError
from ..transport.shm.arena import Arena
from .comm import flat
from .reduce_scatter_shm_chunked import block_piece
from .shm_comm import CAT_BYTES, ShmComm, close_phase, descriptor_head, open_phase


def alltoall_shm_chunked(comm: ShmComm, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
    n, r = comm.size, comm.rank
    dtype = outs[0].dtype
    piece = block_piece(comm, dtype)

    def copy_out(c: int, j: int) -> None:
        lo = j * piece
        slots = comm.slots(c, dtype)
        for p in range(n):
            length = min(piece, outs[p].numel() - lo)
            if p != r and length > 0:
                outs[p][lo:lo + length].copy_(slots[p, r * piece:r * piece + length])

    outs[r].copy_(ins[r])
    c = comm.start("alltoall", dtype, 0, exact=False)
    comm.set_meta(c, [t.numel() for t in ins])
    m = 1
    s = 0
    while s < m:
        if s:
            c = comm.next_phase()
            copy_out(c - 1, s - 1)
        lo = s * piece
        mine = comm.slots(c, dtype)[r]
        for q in range(n):
            length = min(piece, ins[q].numel() - lo)
            if q != r and length > 0:
                mine[q * piece:q * piece + length].copy_(ins[q][lo:lo + length])
        comm.post(c)
        comm.wait_all(c)
        if s == 0:
            m = max(1, -(-_check_sizes(comm.arena, c, [t.numel() for t in outs], comm.op) // piece))
        s += 1
    copy_out(c, m - 1)


def _check_sizes(arena: Arena, c: int, expect: list[int], op: str) -> int:
    """Raise if a peer sends this rank a block of another size than ``expect[peer]``; return
    the largest block any rank sends (every rank's number of rounds)."""
    sizes = arena.meta(c)
    r = arena.rank
    for p, row in enumerate(sizes):
        if p != r and row[r] != expect[p]:
            a = arena.members
            raise DistBackendError(
                f"{op}: rank {a[p]} sends {row[r]} elements to rank {a[r]}, which expects "
                f"{expect[p]} (split sizes or shapes differ between ranks)"
            )
    return max(max(row) for row in sizes)


def alltoall_shm_even_step(comm: ShmComm, dtype: torch.dtype, k: int):
    """``alltoall_shm_chunked`` for this rank's even split (``k`` elements to and from every
    rank), made once for the lean lane (``backends/lane.py``): ``step(out, inp, deadline,
    timeout)`` with ``out`` and ``inp`` contiguous, n·k elements. False when ``k`` elements
    do not fit one piece of a slot.

    Same phase, descriptor, meta row and slot pieces as the function above; its own block
    goes through its slot too (one strided copy in, one out). Ranks that send some peer more
    than a piece make everyone run more phases (the meta table says how many): this rank has
    nothing left to move in them, so it posts and waits through them, as the general
    algorithm does with empty copies.
    """
    piece = block_piece(comm, dtype)
    if k > piece:
        return False
    arena = comm.arena
    n, r = arena.size, arena.rank
    head = descriptor_head("alltoall", dtype)
    sizes = [k] * n
    mine = [arena.slots(p, dtype)[r, :n * piece].view(n, piece)[:, :k] for p in (0, 1)]
    theirs = [arena.slots(p, dtype)[:, r * piece:r * piece + k] for p in (0, 1)]
    theirs_rows = [list(t) for t in theirs]  # the same n pieces, one view each
    cat = torch.cat if k * dtype.itemsize <= CAT_BYTES else None  # see CAT_BYTES
    op = "alltoall_base"

    def step(out: torch.Tensor, inp: torch.Tensor, deadline: float, timeout: float) -> None:
        c = open_phase(arena, head, 0, deadline, timeout, op)
        arena.set_meta(c, sizes)
        mine[c & 1].copy_(inp.view(n, k))
        close_phase(arena, c, deadline, op)
        largest = _check_sizes(arena, c, sizes, op)
        if cat is not None:
            cat(theirs_rows[c & 1], out=flat(out))
        else:
            out.view(n, k).copy_(theirs[c & 1])
        for _ in range(max(1, -(-largest // piece)) - 1):
            c = arena.next_phase(deadline, op)
            arena.post(c)
            arena.wait_all(c, deadline, op, arena.caller_spin_s)

    return step
