"""All-reduce of a tensor in symmetric memory, reading the peers' memory directly.

Unlike the shm backend's arena, nothing is copied into a staging area first: every rank's
tensor already lies where the others can read it.

* ``two_shot_all_reduce_`` (in place; n ranks, S bytes): barrier; each rank reduces its
  1/n slice out of every rank's tensor into its own (reads S, writes S/n); barrier; each
  rank copies the other n - 1 reduced slices from their owners (reads and writes
  S (n - 1)/n); barrier. About 3 bytes of memory traffic per byte reduced, where the
  arena's copy-in / reduce / copy-out moves about 5.5.
* ``one_shot_all_reduce`` (out of place): barrier; each rank sums all n tensors into a new
  one (reads n x S); barrier. Fewer steps, more reads: for small tensors.

The final barrier is what lets a caller overwrite its tensor as soon as the call returns:
no peer still reads it.
"""

from __future__ import annotations

import os

import torch

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


def _combiner(reduce_op: str, what: str):  # noqa: ANN202
    fn = _COMBINE.get(reduce_op.lower())
    if fn is None:
        raise ValueError(f"{what}: reduce_op must be one of {sorted(_COMBINE)}, got {reduce_op!r}")
    return fn


#: Bytes of the tensor reduced per pipeline step: small enough that the reduced slices a
#: rank copies from its peers are still in the shared cache when it reads them.
CHUNK_BYTES = int(os.environ.get("PYC10D_SYMM_CHUNK_BYTES", 1 << 20))


def two_shot_all_reduce_(t: torch.Tensor, reduce_op: str = "sum", group_name: str | None = None) -> torch.Tensor:
    """Reduce ``t`` (a contiguous tensor in symmetric memory) over its group, in place.

    Chunk by chunk: each rank reduces its 1/n slice of chunk k out of every rank's tensor
    and signals it (a counted signal per chunk), then copies the peers' reduced slices of
    chunk k - 1, which they finished a step earlier. A rank overwrites a peer's slice in its
    own tensor only after that peer said it is done reading it, so no rank reads a reduced
    value as an input.
    """
    combine = _combiner(reduce_op, "two_shot_all_reduce_")
    h, peers = _peers(t, group_name, "two_shot_all_reduce_")
    n, me, numel = h.world_size, h.rank, t.numel()
    step = max(n, CHUNK_BYTES // max(1, t.element_size()))
    chunks = [(lo, min(lo + step, numel)) for lo in range(0, numel, step)] or [(0, 0)]

    def slices(k: int) -> list[tuple[int, int]]:
        lo, hi = chunks[k]
        size = hi - lo
        return [(lo + p * size // n, lo + (p + 1) * size // n) for p in range(n)]

    def reduce_chunk(k: int) -> None:
        a, b = slices(k)[me]
        mine = peers[me][a:b]
        for j in range(1, n):
            combine(mine, peers[(me + j) % n][a:b])
        if reduce_op.lower() == "avg":
            mine.div_(n)
        h.chunk_reduced()

    def gather_chunk(k: int) -> None:
        bounds = slices(k)
        for j in range(1, n):
            p = (me + j) % n
            h.wait_chunk_reduced(p)
            a, b = bounds[p]
            peers[me][a:b].copy_(peers[p][a:b])

    h.barrier()
    for k in range(len(chunks)):
        reduce_chunk(k)
        if k:
            gather_chunk(k - 1)
    gather_chunk(len(chunks) - 1)
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


def plan_allreduce(t: torch.Tensor, reduce_op: str, group_name: str):  # noqa: ANN201
    """For the shm backend: ``two_shot_all_reduce_`` of ``t`` when ``t`` is a contiguous
    tensor of ``group_name``'s symmetric memory, else None (see ``backends.shm``)."""
    pin = pin_of(t)
    if pin is None or pin.mapping.group_name != group_name or not t.is_contiguous():
        return None
    return lambda: two_shot_all_reduce_(t, reduce_op, group_name)
