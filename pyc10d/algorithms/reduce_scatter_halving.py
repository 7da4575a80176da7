"""reduce_scatter, recursive halving: log2(p) steps, each sending half of what is left.

Cost (``p`` the largest power of two <= n; ``S`` the sum of all n blocks): log2(p) steps;
each rank sends and receives (p-1)/p·S and reduces as much. A world that is not a power of
two folds first (``pow2``): the extra even ranks send all S to their odd neighbour (one
step) and receive their own block back at the end (one more). Blocks may differ in size
(as torch's reduce_scatter allows); the halves are cut at block boundaries, by virtual rank
(virtual rank ``v < rem`` owns blocks ``2v`` and ``2v+1``).

Inputs are never written: partial sums live in one scratch buffer. Each block is reduced
along one tree, (lower group) op (upper group).
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .comm import Comm
from .pow2 import first_rank, floor_pow2, real, run, virtual
from .reduce_ops import reduce_pair


def reduce_scatter_halving(
    comm: Comm, inputs: list[torch.Tensor], output: torch.Tensor, op: ReduceOp
) -> None:
    n, r = comm.size, comm.rank
    out = output.reshape(-1)
    if n == 1:
        if out.data_ptr() != inputs[0].data_ptr():
            out.copy_(inputs[0].reshape(-1))
        return
    p = floor_pow2(n)
    rem = n - p
    starts = [0] * (n + 1)
    for i, b in enumerate(inputs):
        starts[i + 1] = starts[i] + b.numel()
    whole = run(inputs, 0, n)
    if r < 2 * rem and r % 2 == 0:  # folded out: hand everything in, get block r back
        comm.send(r + 1, whole if whole is not None else torch.cat([b.reshape(-1) for b in inputs]))
        comm.recv(r + 1, out)
        return
    total = starts[n]
    acc = comm.scratch(0, total, inputs[0].dtype)[:total]
    if whole is not None:
        acc.copy_(whole)
    else:
        torch.cat([b.reshape(-1) for b in inputs], out=acc)
    tmp = comm.scratch(1, total, acc.dtype)[:total]  # what a peer sends: at most all of it
    if r < 2 * rem:
        comm.recv(r - 1, tmp)
        reduce_pair(acc, tmp, acc, op)
    v = virtual(r, rem)
    lo, hi = 0, p
    mask = p >> 1
    while mask:
        mid = lo + mask
        keep, give = ((lo, mid), (mid, hi)) if v < mid else ((mid, hi), (lo, mid))
        a, b = starts[first_rank(keep[0], rem)], starts[first_rank(keep[1], rem) if keep[1] < p else n]
        c, d = starts[first_rank(give[0], rem)], starts[first_rank(give[1], rem) if give[1] < p else n]
        peer = real(v ^ mask, rem)
        pending = comm.irecv(peer, tmp[: b - a])
        comm.send(peer, acc[c:d])
        pending.wait()
        mine = acc[a:b]
        if v & mask:
            reduce_pair(mine, tmp[: b - a], mine, op)
        else:
            reduce_pair(mine, mine, tmp[: b - a], op)
        lo, hi = keep
        mask >>= 1
    if r < 2 * rem:  # this rank holds blocks r-1 and r
        comm.send(r - 1, acc[starts[r - 1]:starts[r]])
    out.copy_(acc[starts[r]:starts[r + 1]])
