"""Test data shared by the distributed tests: sparse reduction cases, GPU layout."""

from __future__ import annotations

import torch


def _sparse_case(
    rank: int, world_size: int, sparse_dims: int = 1, dense_dims: int = 0
) -> torch.Tensor:
    """The COO tensor ``rank`` contributes to a sparse sum over ``world_size`` ranks.

    Along the first sparse dimension it sets entries ``0..rank``; further sparse
    dimensions are always index 0, so any two ranks' tensors overlap. Every
    value (a dense block of 2s-shaped ones when ``dense_dims > 0``) is one.
    """
    nnz = rank + 1
    rows = [torch.arange(nnz)] + [torch.zeros(nnz, dtype=torch.int64)] * (sparse_dims - 1)
    indices = torch.stack(rows)
    values = torch.ones([nnz] + [2] * dense_dims)
    size = [world_size] * sparse_dims + [2] * dense_dims
    return torch.sparse_coo_tensor(indices, values, size, check_invariants=True)


_SPARSE_LAYOUTS = [
    {"sparse_dims": 1},
    {"sparse_dims": 2},
    {"sparse_dims": 3},
    {"dense_dims": 1},
    {"dense_dims": 2},
    {"dense_dims": 3},
]


def simple_sparse_reduce_tests(
    rank: int, world_size: int, num_inputs: int = 1
) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Sparse sum-allreduce cases as ``(inputs, expected_outputs)`` pairs.

    Each rank passes ``num_inputs`` tensors, so the reduction behaves like one
    over ``num_inputs * world_size`` virtual ranks; each expected output is the
    sum of every virtual rank's tensor. Layouts cover 1-3 sparse dimensions and
    1-3 dense dimensions. Sum is the only reduction sparse tensors support.
    """
    virtual_world = num_inputs * world_size
    cases = []
    for layout in _SPARSE_LAYOUTS:
        inputs = [
            _sparse_case(num_inputs * rank + i, virtual_world, **layout) for i in range(num_inputs)
        ]
        total = _sparse_case(0, virtual_world, **layout)
        for virtual_rank in range(1, virtual_world):
            total = total + _sparse_case(virtual_rank, virtual_world, **layout)
        cases.append((inputs, [total.clone() for _ in range(num_inputs)]))
    return cases


def gpus_for_rank(world_size: int) -> list[list[int]]:
    """Split the visible CUDA devices evenly between ``world_size`` ranks.

    Simulates several multi-GPU nodes on one machine; leftover devices are unused.
    """
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    per_rank = len(devices) // world_size
    return [devices[r * per_rank : (r + 1) * per_rank] for r in range(world_size)]
