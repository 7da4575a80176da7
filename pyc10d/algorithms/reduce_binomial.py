"""reduce, binomial tree: ceil(log2 n) rounds towards the root.

Cost: ceil(log2 n) steps of S bytes; a rank receives from at most log2 n children and
reduces what it receives, then sends S once to its parent. The latency optimum for small S.
Virtual rank v = (r - root) mod n takes its children v + 1, v + 2, v + 4 ... (below its
lowest set bit) in that order, always (own subtree) op (child's), so the root's result is
the same whatever the timing. A non-root rank's tensor is not written.
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .comm import Comm
from .reduce_ops import reduce_pair


def reduce_binomial(comm: Comm, t: torch.Tensor, root: int, op: ReduceOp) -> None:
    n, r = comm.size, comm.rank
    v = (r - root) % n
    acc = t
    buf = None
    mask = 1
    while mask < n:
        if v & mask:
            comm.send((r - mask) % n, acc)
            return
        if v + mask < n:
            if buf is None:
                buf = torch.empty_like(t)
                if r != root:
                    acc = t.clone()
            comm.recv((r + mask) % n, buf)
            reduce_pair(acc, acc, buf, op)
        mask <<= 1
