"""All-reduce of a tensor in symmetric memory, reading the peers' memory directly.

Unlike the shm backend's arena, nothing is copied into a staging area first: every rank's
tensor already lies where the others can read it.

* ``two_shot_all_reduce_`` (in place; n ranks, S bytes): barrier; chunk by chunk, each
  rank reduces its 1/n slice out of every rank's tensor into its own (reads S, writes S/n;
  AVG scaled there) and copies the other n - 1 reduced slices from their owners as they
  become ready (reads and writes S (n - 1)/n); barrier. About 3 bytes of traffic per byte,
  where the arena's copy-in / reduce / copy-out moves about 5.5. Counted in DRAM lines it
  is less: a chunk's reduced slices and the lines they overwrite were touched by a peer a
  moment before and are still in the shared cache, so the group reads every rank's tensor
  once and writes it once (2 n S in all), the least an in-place all-reduce can move.
* ``one_shot_all_reduce`` (out of place): barrier; each rank sums all n tensors into a new
  one (reads n x S); barrier. Fewer steps, more reads: for small tensors.

The final barrier is what lets a caller overwrite its tensor as soon as the call returns:
no peer still reads it.
"""

from __future__ import annotations

import torch

from .. import settings
from .alloc import pin_of
from .handle import SymmetricMemory, rendezvous

_COMBINE = {
    "sum": torch.Tensor.add_,
    "avg": torch.Tensor.add_,
    "product": torch.Tensor.mul_,
    "max": lambda a, b: torch.maximum(a, b, out=a),
    "min": lambda a, b: torch.minimum(a, b, out=a),
}


def _peers(t: torch.Tensor, group_name: str | None, what: str) -> tuple[SymmetricMemory, list[torch.Tensor]]:
    """The handle of ``t``'s allocation and the same tensor as it lies on every rank."""
    h = rendezvous(t, group_name)
    if not t.is_contiguous():
        raise RuntimeError(f"{what}: the tensor must be contiguous")
    base = t.untyped_storage().data_ptr() - h.buffer_ptrs[h.rank]  # 0 unless torch moves it
    offset = base // t.element_size() + t.storage_offset()
    return h, [h.get_buffer(p, (t.numel(),), t.dtype, offset) for p in range(h.world_size)]


def _combiner(reduce_op: str, what: str):
    fn = _COMBINE.get(reduce_op.lower())
    if fn is None:
        raise ValueError(f"{what}: reduce_op must be one of {sorted(_COMBINE)}, got {reduce_op!r}")
    return fn


def _divider(n: int, dtype: torch.dtype):
    """In-place division by ``n`` for AVG. For a power of two, multiplying by ``1 / n`` is
    exact and so gives the same bits as dividing, at half the cost on this CPU (the slice
    is in cache, so the arithmetic is what it waits for)."""
    if n & (n - 1) == 0 and dtype.is_floating_point:
        return lambda x: x.mul_(1.0 / n)
    return lambda x: x.div_(n)


# The chunk, ``PYC10D_SYMM_CHUNK_BYTES`` (read at each call), is the bytes of the tensor reduced
# per step. A rank copies its peers' reduced slices of a chunk
# soon after they wrote them, so what a step touches on all ranks together (about twice
# the chunk) should stay well inside the shared L3; every chunk costs Python calls and
# signals per rank, more when ranks outnumber free cores. 4 MiB (the default) measured best
# on a 2-core host: 1 MiB was as fast at 2 ranks on a quiet host, slower at 4 ranks or with
# other work on the cores.


def two_shot_all_reduce_(t: torch.Tensor, reduce_op: str = "sum", group_name: str | None = None) -> torch.Tensor:
    """Reduce ``t`` (a contiguous tensor in symmetric memory) over its group, in place.

    Chunk by chunk, each rank reduces its 1/n slice of the chunk out of every rank's tensor
    into its own (AVG divided right there, while the slice is in cache) and signals its
    peers (a counted signal per chunk). After each chunk it copies whichever of its peers'
    reduced slices are ready, without waiting; it sleeps only once all its own slices are
    done. So ranks that run side by side copy each other's slices while they are still in
    cache, and a rank whose peer is descheduled keeps working instead of sleeping once per
    chunk. A rank overwrites a peer's slice in its own tensor only after that peer said it
    has reduced it — and so no longer reads it — hence no rank reads a reduced value as an
    input.
    """
    combine = _combiner(reduce_op, "two_shot_all_reduce_")
    h, peers = _peers(t, group_name, "two_shot_all_reduce_")
    n, me, numel = h.world_size, h.rank, t.numel()
    divide = _divider(n, t.dtype) if reduce_op.lower() == "avg" else None
    step = max(n, settings.SYMM_CHUNK_BYTES.get() // max(1, t.element_size()))
    chunks = [(lo, min(lo + step, numel)) for lo in range(0, numel, step)] or [(0, 0)]
    bounds = [[(lo + p * (hi - lo) // n, lo + (p + 1) * (hi - lo) // n) for p in range(n)] for lo, hi in chunks]
    others = [(me + j) % n for j in range(1, n)]
    copied = dict.fromkeys(others, 0)  # chunks of each peer already copied

    def copy_ready(p: int, block: bool) -> None:
        ready = copied[p] + h.chunks_reduced(p, len(chunks) - copied[p], block)
        for k in range(copied[p], ready):
            a, b = bounds[k][p]
            peers[me][a:b].copy_(peers[p][a:b])
        copied[p] = ready

    h.barrier()
    for k in range(len(chunks)):
        a, b = bounds[k][me]
        mine = peers[me][a:b]
        for p in others:
            combine(mine, peers[p][a:b])
        if divide is not None:
            divide(mine)
        h.chunk_reduced()
        for p in others:
            copy_ready(p, False)
    for p in others:
        while copied[p] < len(chunks):
            copy_ready(p, True)
    h.barrier()
    return t


def one_shot_all_reduce(t: torch.Tensor, reduce_op: str = "sum", group_name: str | None = None) -> torch.Tensor:
    """A new tensor holding ``t`` reduced over its group (``t`` is left as it is)."""
    combine = _combiner(reduce_op, "one_shot_all_reduce")
    h, peers = _peers(t, group_name, "one_shot_all_reduce")
    n, me = h.world_size, h.rank
    h.barrier()
    out = peers[me].clone()
    for k in range(1, n):
        combine(out, peers[(me + k) % n])
    h.barrier()
    if reduce_op.lower() == "avg":
        out.div_(n)
    return out.view(t.shape)


def plan_allreduce(t: torch.Tensor, reduce_op: str, group_name: str):
    """For the shm backend: ``two_shot_all_reduce_`` of ``t`` when ``t`` is a contiguous
    tensor of ``group_name``'s symmetric memory, else None (see ``backends.shm``)."""
    pin = pin_of(t)
    if pin is None or pin.mapping.group_name != group_name or not t.is_contiguous():
        return None
    return lambda: two_shot_all_reduce_(t, reduce_op, group_name)
