"""all_gather, Bruck: ceil(log2 n) steps at any world size.

Cost: ceil(log2 n) steps; each rank sends and receives (n-1)·B bytes (B one block) and
talks to 2·ceil(log2 n) peers. At step k (d = 2^k) rank r holds blocks r .. r+d-1 (mod n)
and sends the first min(d, n-d) of them to rank r-d, receiving blocks r+d .. from rank r+d.
Blocks go straight into the caller's list (indexed by rank), so the final rotation of the
textbook version is not needed. A run that wraps past the last rank goes as two messages,
each a view of adjacent blocks where they are adjacent (else packed; ``exchange_runs``).
"""

from __future__ import annotations

import torch

from .comm import Comm
from .pow2 import run


def _pieces(start: int, count: int, n: int) -> list[tuple[int, int]]:
    """Block range ``start .. start+count-1`` (mod n) as at most two plain ranges."""
    end = start + count
    return [(start, end)] if end <= n else [(start, n), (0, end - n)]


def allgather_bruck(comm: Comm, blocks: list[torch.Tensor]) -> None:
    n, r = comm.size, comm.rank
    d = 1
    while d < n:
        count = min(d, n - d)
        src, dst = (r + d) % n, (r - d) % n
        posted = []
        for lo, hi in _pieces(src, count, n):
            into = run(blocks, lo, hi)
            staged = None
            if into is None:
                into = staged = torch.empty(sum(blocks[i].numel() for i in range(lo, hi)),
                                            dtype=blocks[lo].dtype)
            posted.append((lo, hi, staged, comm.irecv(src, into)))
        for lo, hi in _pieces(r, count, n):
            out = run(blocks, lo, hi)
            comm.send(dst, out if out is not None else torch.cat([blocks[i].reshape(-1) for i in range(lo, hi)]))
        for lo, hi, staged, pending in posted:
            pending.wait()
            if staged is not None:
                at = 0
                for i in range(lo, hi):
                    k = blocks[i].numel()
                    blocks[i].copy_(staged[at:at + k].view(blocks[i].shape))
                    at += k
        d <<= 1
