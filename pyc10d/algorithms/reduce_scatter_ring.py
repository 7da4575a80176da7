"""reduce_scatter, pipelined ring: block j of the result ends on rank j.

Cost: n-1 steps; each rank sends and receives (n-1)/n·S bytes and reduces as many. At step k
rank r receives the partial sum of block (r-k-2) mod n from its left neighbour, adds its own
input block and forwards the sum right as step k+1; the last step lands on block r.

Blocks travel in segments (``segments.SEGMENT_BYTES``) and each segment is forwarded as
soon as it is reduced, so ranks do not wait for each other step by step — on an
oversubscribed host that lock-step is what costs most. Inputs are never written: partial
sums live in two scratch blocks used in turn (step k+1 posts its receives into the buffer
step k-1 finished sending).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..types import ReduceOp
from .comm import Comm
from .reduce_ops import reduce_into
from .segments import segments


def reduce_scatter_ring(
    comm: Comm,
    inputs: list[torch.Tensor],
    output: torch.Tensor,
    op: ReduceOp,
    before_last_step: Callable[[], None] | None = None,
    on_final_segment: Callable[[torch.Tensor], None] | None = None,
) -> None:
    """``inputs``: n contiguous blocks (sizes equal across ranks); ``output``: like block r.

    ``before_last_step`` and ``on_final_segment`` let all_reduce chain its all-gather into
    this pipeline (post its receives early, forward finished segments at once).
    """
    n, r = comm.size, comm.rank
    flat_out = output.reshape(-1)
    if n == 1:
        if flat_out.data_ptr() != inputs[0].data_ptr():
            flat_out.copy_(inputs[0].reshape(-1))
        return
    left, right = (r - 1) % n, (r + 1) % n
    biggest = max(b.numel() for b in inputs)
    scratch = [comm.scratch(i, biggest, inputs[0].dtype) for i in range(2 if n > 2 else 1)]

    def post(k: int) -> tuple[int, list, list[torch.Tensor]]:
        j = (r - k - 2) % n
        pieces = segments(scratch[k % len(scratch)][: inputs[j].numel()])
        return j, pieces, [comm.irecv(left, p) for p in pieces]

    posted = {0: post(0)}
    for piece in segments(inputs[(r - 1) % n]):
        comm.send(right, piece)
    for k in range(n - 1):
        if k + 1 <= n - 2:
            posted[k + 1] = post(k + 1)
        last = k == n - 2
        if last and before_last_step is not None:
            before_last_step()
        j, pieces, recvs = posted.pop(k)
        mine = segments(inputs[j])
        outs = segments(flat_out) if last else None
        for s, (piece, pending) in enumerate(zip(pieces, recvs)):
            pending.wait()
            if not last:
                reduce_into(piece, mine[s].reshape(-1), op)
                comm.send(right, piece)
                continue
            dst = outs[s]
            if dst.data_ptr() != mine[s].data_ptr():
                dst.copy_(mine[s])
            reduce_into(dst, piece, op)
            if on_final_segment is not None:
                on_final_segment(dst)
