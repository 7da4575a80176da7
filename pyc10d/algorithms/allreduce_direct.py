"""all_reduce, flat exchange: every rank sends its whole buffer to every other rank.

Cost: 1 step; each rank sends and receives (n-1)·S bytes. Best for small S, where one
round-trip beats the 2(n-1) steps of a ring. Every rank reduces the n contributions in
rank order, so all ranks get bit-identical results.
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .comm import Comm, PendingRecv, byte_view, dtype_code
from .reduce_ops import kernel, reduce_into


def allreduce_direct(comm: Comm, t: torch.Tensor, op: ReduceOp) -> None:
    n, r = comm.size, comm.rank
    if n == 1:
        return
    bufs: list[torch.Tensor | None] = [None] * n
    pending = []
    for p in range(n):
        if p != r:
            bufs[p] = torch.empty_like(t)
            pending.append(comm.irecv(p, bufs[p]))
    for step in range(1, n):
        comm.send((r + step) % n, t)
    for p in pending:
        p.wait()
    mine = t if r == 0 else t.clone()
    bufs[r] = mine
    if r != 0:
        t.copy_(bufs[0])
    for p in range(1, n):
        reduce_into(t, bufs[p], op)


def allreduce_direct_step(comm: Comm, op: ReduceOp, dtype: torch.dtype, numel: int):
    """``allreduce_direct`` of every flat tensor of ``dtype`` and ``numel`` with ``op``, made once.

    The same messages (channel, words, bytes) and the same reduction order as the function
    above, so a rank running this and a rank running that exchange correctly; what that
    function makes per call (the peers' buffers, their byte views, the message word) is
    made here. ``comm`` is the operation's template: ``step(t, channel, deadline, timeout)``
    re-aims it at each call (the tcp lean lane, ``backends/tcp.py``).
    """
    n, r = comm.size, comm.rank
    bufs = [torch.empty(numel, dtype=dtype) for _ in range(n)]
    views = [byte_view(b) for b in bufs]
    order = [(r + step) % n for step in range(1, n)]
    fn = kernel(op, dtype)
    cache: list = [-1, None]  # the last input's address and its byte view (which keeps it alive)
    # Two ranks: one exchange, in one call where the transport has it (``DirectIO.exchange``).
    exchange = getattr(comm.transport, "exchange", None) if n == 2 else None
    peer = 1 - r if n == 2 else r
    word = dtype_code(dtype) | (comm.fingerprint << 8)
    nbytes = len(views[peer])

    def step(t: torch.Tensor, channel: int, deadline: float, timeout: float) -> None:
        comm.channel, comm.deadline, comm.timeout = channel, deadline, timeout
        if cache[0] != t.data_ptr():
            cache[0], cache[1] = t.data_ptr(), byte_view(t)
        if exchange is not None:
            h = exchange(comm.ranks[peer], channel, cache[1], word, views[peer])
            if h.nbytes != nbytes or h.meta != word:  # not there yet, or not what was expected
                PendingRecv(comm, h, bufs[peer], peer).wait()
        else:
            comm.swap_all(order, cache[1], dtype, bufs, views)
        # b0 op b1 op ... in rank order, as above, with fewer passes: rank 1 holds b1 in ``t``
        if r == 1:
            fn(bufs[0], t, out=t)
        elif r > 1:
            bufs[r].copy_(t)
            fn(bufs[0], bufs[1], out=t)
        else:
            fn(t, bufs[1], out=t)
        for p in range(2, n):
            fn(t, bufs[p], out=t)

    return step
