"""all_gather, recursive doubling (n a power of two): log2(n) exchanges of doubling runs.

Cost: log2(n) steps; each rank sends and receives (n-1)·B bytes (B one block), the same as
the ring in log2(n) rather than n-1 steps, with log2(n) peers. At step k rank r holds the
aligned run of 2^k blocks containing its own and swaps it with rank r XOR 2^k. Runs are
contiguous block ranges, so with the blocks of one contiguous output (as the backends
pass them) each message is a view, received in place; other block lists are packed.
``select`` uses ``allgather_bruck`` when n is not a power of two.
"""

from __future__ import annotations

import torch

from .comm import Comm
from .pow2 import run


def exchange_runs(comm: Comm, peer: int, blocks: list[torch.Tensor], send: tuple[int, int],
                  recv: tuple[int, int]) -> None:
    """Send ``blocks[send[0]:send[1]]`` to ``peer`` as one message and receive
    ``blocks[recv[0]:recv[1]]`` from it, without a copy where the blocks are adjacent."""
    into = run(blocks, *recv)
    staged = None
    if into is None:
        k = sum(blocks[i].numel() for i in range(*recv))
        into = staged = torch.empty(k, dtype=blocks[recv[0]].dtype)
    pending = comm.irecv(peer, into)
    out = run(blocks, *send)
    comm.send(peer, out if out is not None else torch.cat([blocks[i].reshape(-1) for i in range(*send)]))
    pending.wait()
    if staged is not None:
        at = 0
        for i in range(*recv):
            k = blocks[i].numel()
            blocks[i].copy_(staged[at:at + k].view(blocks[i].shape))
            at += k


def allgather_recursive_doubling(comm: Comm, blocks: list[torch.Tensor]) -> None:
    n, r = comm.size, comm.rank
    if n & (n - 1):
        raise ValueError(f"allgather_recursive_doubling needs a power-of-two world, not {n}")
    mask = 1
    while mask < n:
        base = r & ~(mask - 1)
        other = base ^ mask
        exchange_runs(comm, r ^ mask, blocks, (base, base + mask), (other, other + mask))
        mask <<= 1
