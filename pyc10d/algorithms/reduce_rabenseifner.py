"""reduce, Rabenseifner: recursive-halving reduce-scatter, then a binomial gather of the
reduced blocks to the root.

Cost (``p`` the largest power of two <= n): 2·log2(p) steps; each rank sends about
(p-1)/p·S in the halving, the root receives (p-1)/p·S in the gather; (p-1)/p·S reduced per
rank. For large S at scale, where the binomial tree puts log2(n)·S on the critical path and
the ring n steps. Ranks are numbered from the root (``RotatedComm``) and the fold keeps the
*even* rank of each extra pair (the odd one hands its buffer in and is done), so the root is
always virtual rank 0 and the result needs no extra hop. A non-root rank's tensor is not
written (the work happens in scratch).
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .allreduce_rabenseifner import halving
from .comm import Comm
from .pow2 import first_rank, floor_pow2, offset
from .reduce_ops import reduce_pair
from .rotated import RotatedComm


def reduce_rabenseifner(comm: Comm, t: torch.Tensor, root: int, op: ReduceOp) -> None:
    n = comm.size
    if n == 1:
        return
    rc = RotatedComm(comm, root)
    x = rc.rank
    src = t.reshape(-1)
    numel = src.numel()
    p = floor_pow2(n)
    rem = n - p
    if x < 2 * rem and x % 2:  # handed in to the even rank below: done
        rc.send(x - 1, src)
        return
    flat = src if x == 0 else comm.scratch(2, numel, src.dtype)[:numel]
    if flat is not src:
        flat.copy_(src)
    scratch = comm.scratch(0, numel if x < 2 * rem else offset(numel, p, p // 2), src.dtype)
    if x < 2 * rem:
        buf = scratch[:numel]
        rc.recv(x + 1, buf)
        reduce_pair(flat, flat, buf, op)
    v = x // 2 if x < 2 * rem else x - rem
    halving(rc, flat, v, p, rem, op, scratch, first_rank)
    mask = 1
    while mask < p:
        if v & mask:
            rc.send(first_rank(v - mask, rem), flat[offset(numel, p, v):offset(numel, p, min(v + mask, p))])
            return
        rc.recv(first_rank(v + mask, rem),
                flat[offset(numel, p, v + mask):offset(numel, p, min(v + 2 * mask, p))])
        mask <<= 1
