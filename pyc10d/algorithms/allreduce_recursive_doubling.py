"""all_reduce, recursive doubling: log2(p) exchanges of the whole buffer.

Cost (``p`` the largest power of two <= n, ``S`` bytes): log2(p) steps, plus 2 for a world
that is not a power of two (the fold, see ``pow2``: the extra ranks hand their buffer in
first and get the result back last); each step sends and receives S and reduces S. The
latency optimum for small S at any n, with log2(p) peers per rank where the flat exchange
talks to all n-1.

At step k virtual rank v and its partner v XOR 2^k hold the reductions of the same-sized
aligned groups of ranks; both compute (lower group) op (upper group), operands in that
order on both sides, so all ranks end with the same bytes.
"""

from __future__ import annotations

import torch

from ..types import ReduceOp
from .comm import Comm
from .pow2 import floor_pow2, real, virtual
from .reduce_ops import reduce_pair


def allreduce_recursive_doubling(comm: Comm, t: torch.Tensor, op: ReduceOp) -> None:
    n, r = comm.size, comm.rank
    if n == 1:
        return
    p = floor_pow2(n)
    rem = n - p
    buf = torch.empty_like(t)
    if r < 2 * rem:  # the fold: even ranks hand in, odd ranks reduce (even op odd)
        if r % 2 == 0:
            comm.send(r + 1, t)
            comm.recv(r + 1, t)
            return
        comm.recv(r - 1, buf)
        reduce_pair(t, buf, t, op)
    v = virtual(r, rem)
    mask = 1
    while mask < p:
        peer = real(v ^ mask, rem)
        pending = comm.irecv(peer, buf)
        comm.send(peer, t)
        pending.wait()
        if v & mask:
            reduce_pair(t, buf, t, op)
        else:
            reduce_pair(t, t, buf, op)
        mask <<= 1
    if r < 2 * rem:
        comm.send(r - 1, t)
