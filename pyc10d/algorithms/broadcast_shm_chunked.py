"""broadcast, chunked over shared memory: the root fills a whole phase's slots, all copy out.

The root copies chunk j into the slots of every rank of the phase's parity (n slots of
room, since nobody else writes in a broadcast) and the others copy it out after the phase.
Phase s does OUT(s-1) on the others and IN(s) on the root: m chunks take m phases.

Cost: the root copies S in, every other rank copies S out.
"""

from __future__ import annotations

import torch

from .shm_comm import ShmComm, nbytes_of


def broadcast_shm_chunked(comm: ShmComm, t: torch.Tensor, root: int) -> None:
    numel = t.numel()
    chunk = comm.elems(t.dtype) * comm.size
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
