"""broadcast, pipelined chain: the root sends segments to the next rank, each rank forwards
every segment to the next as soon as it lands.

Cost: n-1 hops of pipeline fill, then S bytes per link; every rank but the last receives
and sends S once, so all ranks together move (n-1)·S, against about n·S for scatter + ring
all-gather — the lower total is what counts where the ranks share few cores (each byte a
copy through the kernel on both ends).
"""

from __future__ import annotations

import torch

from .comm import Comm
from .segments import segments


def broadcast_chain(comm: Comm, t: torch.Tensor, root: int) -> None:
    n, r = comm.size, comm.rank
    if n == 1:
        return
    pieces = segments(t)
    nxt = (r + 1) % n
    last = nxt == root
    if r == root:
        for piece in pieces:
            comm.send(nxt, piece)
        return
    prev = (r - 1) % n
    posted = [comm.irecv(prev, piece) for piece in pieces]
    for piece, pending in zip(pieces, posted):
        pending.wait()
        if not last:
            comm.send(nxt, piece)
