"""Symmetric memory on CPU shared memory: ``pyc10d.symmetric_memory`` is to pyc10d what
``torch.distributed._symmetric_memory`` is to torch.

A tensor from ``empty_strided_p2p`` lives in a segment that every rank of its group maps, so
each rank reads and writes its peers' tensors directly (``rendezvous(t).get_buffer(peer,
...)``) and synchronises with counted signals and barriers that sleep on futexes. Only ranks
of one host can share memory this way (Linux x86-64, ``/dev/shm``).

Layout of the room: ``_seam`` (what is borrowed from the shm transport), ``alloc`` (segments,
their exchange through the store, persistent allocations), ``handle`` (``SymmetricMemory``:
buffers, signals, put/get), ``fused`` (matmuls fused with all-gather / reduce-scatter and
their fallbacks), ``collectives`` (all-reduce straight out of the peers' memory), ``ops``
(the same as torch operators, ``torch.ops.pyc10d_symm_mem``).
"""

from __future__ import annotations

from . import _seam
from .alloc import enable, group_of, is_enabled
from .collectives import one_shot_all_reduce, plan_allreduce, two_shot_all_reduce_
from .fused import (
    _fused_all_gather_matmul_fallback,
    _fused_matmul_reduce_scatter_fallback,
    fused_all_gather_matmul,
    fused_matmul_reduce_scatter,
    restride_A_for_fused_matmul_reduce_scatter,
    restride_A_shard_for_fused_all_gather_matmul,
)
from .handle import SymmetricMemory, empty_strided_p2p, get_symmetric_memory, rendezvous
from .ops import NAMESPACE, ops

#: torch's name for the handle class, whose static methods the seed calls
_SymmetricMemory = SymmetricMemory

__all__ = [
    "NAMESPACE",
    "SymmetricMemory",
    "_SymmetricMemory",
    "_fused_all_gather_matmul_fallback",
    "_fused_matmul_reduce_scatter_fallback",
    "empty_strided_p2p",
    "enable_symm_mem_for_group",
    "fused_all_gather_matmul",
    "fused_matmul_reduce_scatter",
    "get_symmetric_memory",
    "is_symm_mem_enabled_for_group",
    "one_shot_all_reduce",
    "ops",
    "rendezvous",
    "restride_A_for_fused_matmul_reduce_scatter",
    "restride_A_shard_for_fused_all_gather_matmul",
    "two_shot_all_reduce_",
]


def enable_symm_mem_for_group(group_name: str) -> None:
    """Allow symmetric allocations on ``group_name`` (local: no communication). The group's
    shm engine learns of it: its ``all_reduce`` of a symmetric tensor then reduces out of the
    peers' memory."""
    enable(group_name)
    _seam.serve_backend_allreduce(group_of(group_name), plan_allreduce)


def is_symm_mem_enabled_for_group(group_name: str) -> bool:
    return is_enabled(group_name)
