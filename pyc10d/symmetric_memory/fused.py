"""Matmuls fused with an all-gather or a reduce-scatter, on the group's symmetric workspace.

``fused_all_gather_matmul`` (n ranks, shard of S bytes): each rank copies its shard into
its own workspace and signals every peer (S bytes written); then, own chunk first, it
multiplies each peer's chunk straight out of the peer's segment and copies it into the
gathered output as soon as that peer has signalled ((n - 1) x S bytes read). A rank that is
late to publish delays only the chunk that needs it: the others are multiplied meanwhile.

``fused_matmul_reduce_scatter`` (output chunk of C bytes): each rank multiplies the rows that
rank ``r + 1`` owns first, signals it, then those of ``r + 2``, ... and its own last, each
product landing in its workspace (n x C bytes written); then it adds up the products the
others made of its rows, reading each from the peer's segment as soon as the peer has
signalled ((n - 1) x C bytes read). The products of its peers arrive while it still computes.

Both keep the layout of their ``_fallback`` counterparts (a functional collective, then the
matmul) exactly, strides included, so the two can be swapped. The workspace is reused
across calls: a rank waits for every peer's "done" signal of the previous call before it
writes its workspace again, so a call ends without a barrier.
"""

from __future__ import annotations

import torch

from .. import functional as ft_c
from ..world import current_world
from .alloc import get_state
from .handle import SymmetricMemory, workspace

READY, DONE = 0, 1
_REDUCE_OPS = ("sum", "avg")


def restride_A_shard_for_fused_all_gather_matmul(t: torch.Tensor, gather_dim: int) -> torch.Tensor:  # noqa: N802
    """``t`` laid out so that ``gather_dim`` is outermost: each rank's shard is then one
    contiguous block of the gathered tensor, which the fused op copies without a gather."""
    return t.movedim(gather_dim, 0).contiguous().movedim(0, gather_dim)


def restride_A_for_fused_matmul_reduce_scatter(t: torch.Tensor, scatter_dim: int) -> torch.Tensor:  # noqa: N802
    """``t`` laid out so that ``scatter_dim`` is outermost: the rows each rank owns are then
    one contiguous block, multiplied without a gather of strided rows."""
    return t.movedim(scatter_dim, 0).contiguous().movedim(0, scatter_dim)


def _group_size(group_name: str) -> int:
    pg = current_world().pg_by_name.get(group_name)
    if pg is None or not hasattr(pg, "size"):
        raise RuntimeError(f"no process group named {group_name!r} on this rank")
    return pg.size()


# -- fallbacks: a functional collective, then the matmul ----------------------------------------
def _fused_all_gather_matmul_fallback(
    A_shard: torch.Tensor, Bs: list[torch.Tensor], gather_dim: int, group_name: str,  # noqa: N803
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """All-gather ``A_shard`` along ``gather_dim``, then ``A @ B`` for each ``B``."""
    shard = A_shard.movedim(gather_dim, 0).contiguous()
    A = ft_c.wait_tensor(ft_c.all_gather_tensor(shard, 0, group_name))
    return A.movedim(0, gather_dim), [torch.matmul(A, B).movedim(0, gather_dim) for B in Bs]


def _fused_matmul_reduce_scatter_fallback(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str,  # noqa: N803
) -> torch.Tensor:
    """``A @ B``, then reduce-scatter it along ``scatter_dim``."""
    return ft_c.wait_tensor(ft_c.reduce_scatter_tensor(A @ B, reduce_op, scatter_dim, group_name))


# -- fused -------------------------------------------------------------------------------------
def _begin(group_name: str, nbytes: int) -> SymmetricMemory:
    """The workspace, once every peer is done reading what this rank wrote last time."""
    state = get_state(group_name)
    h = state.workspace
    if h is not None and state.workspace_busy:
        for k in range(1, h.world_size):
            h.wait_signal((h.rank + k) % h.world_size, DONE)
        state.workspace_busy = False
    return workspace(group_name, nbytes)


def _end(group_name: str) -> None:
    get_state(group_name).workspace_busy = True


def fused_all_gather_matmul(
    A_shard: torch.Tensor, Bs: list[torch.Tensor], gather_dim: int, group_name: str,  # noqa: N803
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``_fused_all_gather_matmul_fallback``'s result, each peer's chunk multiplied as it lands."""
    shard = A_shard.movedim(gather_dim, 0)
    shape, dtype = tuple(shard.shape), A_shard.dtype
    h = _begin(group_name, shard.numel() * shard.element_size())
    n, me = h.world_size, h.rank
    h.get_buffer(me, shape, dtype).copy_(shard)
    for k in range(1, n):
        h.put_signal((me + k) % n, READY)
    gathered = A_shard.new_empty((n, *shape))
    outs = [torch.empty((n, *shape[:-1], B.shape[-1]), dtype=torch.promote_types(dtype, B.dtype))
            for B in Bs]
    for k in range(n):
        p = (me + k) % n
        if p != me:
            h.wait_signal(p, READY)
        chunk = h.get_buffer(p, shape, dtype)
        for B, out in zip(Bs, outs):
            torch.matmul(chunk, B, out=out[p])
        gathered[p].copy_(chunk)
        if p != me:
            h.put_signal(p, DONE)
    _end(group_name)
    return (gathered.flatten(0, 1).movedim(0, gather_dim),
            [out.flatten(0, 1).movedim(0, gather_dim) for out in outs])


def fused_matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str,  # noqa: N803
) -> torch.Tensor:
    """``_fused_matmul_reduce_scatter_fallback``'s result; each peer's product of this rank's
    rows is added in as soon as the peer has made it."""
    if reduce_op not in _REDUCE_OPS:
        raise ValueError(f"fused_matmul_reduce_scatter: reduce_op must be one of {_REDUCE_OPS}, got {reduce_op!r}")
    rows = A.movedim(scatter_dim, 0)
    n = _group_size(group_name)
    if rows.shape[0] % n:
        raise ValueError(
            f"fused_matmul_reduce_scatter: dim {scatter_dim} of {tuple(A.shape)} is not divisible by {n}")
    m = rows.shape[0] // n
    dtype = torch.promote_types(A.dtype, B.dtype)
    chunk = (m, *rows.shape[1:-1], B.shape[-1])
    h = _begin(group_name, n * torch.Size(chunk).numel() * torch.empty((), dtype=dtype).element_size())
    me = h.rank
    mine = h.get_buffer(me, (n, *chunk), dtype)
    for k in range(1, n + 1):  # the next rank's rows first: it can start adding at once
        p = (me + k) % n
        torch.matmul(rows[p * m:(p + 1) * m], B, out=mine[p])
        if p != me:
            h.put_signal(p, READY)
    out = mine[me].clone()
    for k in range(1, n):  # rank me - k made this rank's rows k-th, so it is ready k-th
        p = (me - k) % n
        h.wait_signal(p, READY)
        out += h.get_buffer(p, (n, *chunk), dtype)[me]
        h.put_signal(p, DONE)
    _end(group_name)
    if reduce_op == "avg":
        out /= n
    return out.movedim(0, scatter_dim).contiguous()
