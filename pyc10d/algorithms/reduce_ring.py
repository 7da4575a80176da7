"""reduce, ring reduce-scatter then gather of the reduced blocks at the root.

Cost: (n-1) ring steps moving (n-1)/n·S per rank, then the root receives (n-1)/n·S.
For large S, where the flat reduce would funnel (n-1)·S into the root.
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .comm import Comm
from .reduce_scatter_ring import reduce_scatter_ring


def reduce_ring(comm: Comm, t: torch.Tensor, root: int, op: ReduceOp) -> None:
    n, r = comm.size, comm.rank
    if n == 1:
        return
    blocks = list(t.reshape(-1).tensor_split(n))
    mine = torch.empty_like(blocks[r])
    reduce_scatter_ring(comm, blocks, mine, op)
    if r != root:
        comm.send(root, mine)
        return
    pending = [comm.irecv(p, blocks[p]) for p in range(n) if p != root]
    blocks[root].copy_(mine)
    for p in pending:
        p.wait()
