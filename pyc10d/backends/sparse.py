"""Sparse COO all_reduce (SUM): gather every rank's indices and values, sum, coalesce.

Cost: two flat all-gathers (a count, then indices and values of each rank's nnz); every rank
builds the same coalesced sum. The inputs are overwritten with the result, as Gloo does.
"""

from __future__ import annotations

import torch

from ..algorithms import Comm, allgather_direct


def sparse_allreduce(comm: Comm, tensors: list[torch.Tensor]) -> None:
    local = tensors[0].detach().coalesce()
    for t in tensors[1:]:
        local = (local + t.detach()).coalesce()
    indices = local.indices().contiguous()
    values = local.values().contiguous()
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(comm.size)]
    counts[comm.rank][0] = indices.shape[1]
    allgather_direct(comm, counts)
    idx_blocks = [
        indices if p == comm.rank else torch.empty(indices.shape[0], int(counts[p]), dtype=indices.dtype)
        for p in range(comm.size)
    ]
    val_blocks = [
        values if p == comm.rank else torch.empty((int(counts[p]),) + values.shape[1:], dtype=values.dtype)
        for p in range(comm.size)
    ]
    allgather_direct(comm, idx_blocks)
    allgather_direct(comm, val_blocks)
    total = torch.sparse_coo_tensor(
        torch.cat(idx_blocks, dim=1), torch.cat(val_blocks, dim=0), local.shape
    ).coalesce()
    with torch.no_grad():  # a detached alias of a sparse tensor would take the copy, not ``t``
        for t in tensors:
            t.copy_(total)
