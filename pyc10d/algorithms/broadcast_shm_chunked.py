"""broadcast, chunked over shared memory: the root fills a whole phase's slots, all copy out.

The root copies chunk j into the slots of every rank of the phase's parity (n slots of
room, since nobody else writes in a broadcast) and the others copy it out after the phase.
Phase s does OUT(s-1) on the others and IN(s) on the root: m chunks take m phases.

Cost: the root copies S in, every other rank copies S out.
"""

from __future__ import annotations

import torch

from .comm import flat
from .shm_comm import ShmComm, await_phase, descriptor_head, nbytes_of, open_phase, split_step


def broadcast_shm_chunked(comm: ShmComm, t: torch.Tensor, root: int) -> None:
    numel = t.numel()
    chunk = _chunk(comm, t.dtype)
    m = max(1, -(-numel // chunk))
    is_root = comm.rank == root

    def copy_out(c: int, j: int) -> None:
        lo = j * chunk
        length = min(chunk, numel - lo)
        t[lo:lo + length].copy_(comm.slots(c, t.dtype).view(-1)[:length])

    c = comm.start("broadcast", t.dtype, nbytes_of(t), root)
    for s in range(m):
        if s:
            c = comm.next_phase()
            if not is_root:
                copy_out(c - 1, s - 1)
        if is_root:
            lo = s * chunk
            length = min(chunk, numel - lo)
            comm.slots(c, t.dtype).view(-1)[:length].copy_(t[lo:lo + length])
        comm.post(c)
        comm.wait_all(c)
    if not is_root:
        copy_out(c, m - 1)


def _chunk(comm: ShmComm, dtype: torch.dtype) -> int:
    """Elements one phase carries: the n slots of its parity (nobody else writes)."""
    return comm.elems(dtype) * comm.size


def broadcast_shm_flat_step(comm: ShmComm, dtype: torch.dtype, numel: int, root: int):
    """``broadcast_shm_chunked`` in one chunk, made once for the lean lane
    (``backends/lane.py``): ``step(t, None, deadline, timeout)`` with ``t`` contiguous. Same
    phase, descriptor and copies. False when ``numel`` elements do not fit one phase."""
    if numel > _chunk(comm, dtype):
        return False
    arena = comm.arena
    nbytes = numel * dtype.itemsize
    head = descriptor_head("broadcast", dtype, None, root)
    spans = [arena.slots(p, dtype).view(-1)[:numel] for p in (0, 1)]
    is_root = arena.rank == root

    def start(t: torch.Tensor, _: None, deadline: float, timeout: float) -> int:
        c = open_phase(arena, head, nbytes, deadline, timeout, "broadcast")
        if is_root:
            spans[c & 1].copy_(flat(t))
        arena.post(c)
        return c

    def finish(t: torch.Tensor, _: None, c: int, deadline: float) -> None:
        await_phase(arena, c, deadline, "broadcast")
        if not is_root:
            flat(t).copy_(spans[c & 1])

    return split_step(arena, "broadcast", start, finish)
