"""PowerSGD gradient compression (Vogels et al., 2019), as torch's ``powerSGD_hook``.

Each gradient matrix M (n x m, a tensor reshaped to ``shape[0] x rest``) is replaced by a
rank-r product P Q^T: P = M Q is all-reduced and orthonormalised, Q = M^T P is all-reduced,
and P Q^T / world is the average. Per rank and matrix that sends (n + m) r numbers instead
of n m. Vectors, and matrices that would not shrink by ``min_compression_rate``, are
all-reduced uncompressed. With error feedback the part the approximation lost is added to
the next iteration's gradient; with warm start Q is reused between iterations.

Unlike torch, which chains the three all-reduces of a bucket through future callbacks, this
hook runs them in order on the caller's thread and returns a finished future: every rank
then issues its collectives in exactly bucket order, which pyc10d's groups require, at the
price of not overlapping a compressed bucket's reduction with the rest of backward.
"""

from __future__ import annotations

from typing import Any

import torch

from ...collectives import all_reduce
from ...groups import _get_default_group
from ..reducer import GradBucket
from .default import _allreduce_fut


class PowerSGDState:
    """Hyper-parameters and the state PowerSGD keeps between iterations (per bucket)."""

    def __init__(
        self,
        process_group: Any,
        matrix_approximation_rank: int = 1,
        start_powerSGD_iter: int = 1_000,  # noqa: N803 - torch's name
        min_compression_rate: float = 2,
        use_error_feedback: bool = True,
        warm_start: bool = True,
        orthogonalization_epsilon: float = 0,
        random_seed: int = 0,
        compression_stats_logging_frequency: int = 10_000,
        batch_tensors_with_same_shape: bool = False,
    ) -> None:
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.rng = torch.Generator().manual_seed(random_seed)
        self.compression_stats_logging_frequency = compression_stats_logging_frequency
        self.batch_tensors_with_same_shape = batch_tensors_with_same_shape
        self.iter = 0
        self.error_dict: dict[int, torch.Tensor] = {}
        self.q_memory_dict: dict[int, list[torch.Tensor]] = {}
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        """An iteration ends with its last bucket."""
        if bucket.is_last():
            self.iter += 1

    def compression_stats(self) -> tuple[float, int, int]:
        """(compression rate, numbers before, numbers after) summed over all iterations."""
        after = self.total_numel_after_compression
        rate = self.total_numel_before_compression / after if after else 0.0
        return rate, self.total_numel_before_compression, after


def _orthogonalize(matrix: torch.Tensor, epsilon: float = 0.0) -> None:
    """Orthonormalise the columns in place; every rank holds the same matrix and gets the same result.

    Householder QR keeps the columns orthogonal to rounding even when the matrix is badly
    conditioned (Gram-Schmidt would not); with an ``epsilon`` (guarding all-zero columns)
    Gram-Schmidt is used, as in torch.
    """
    if epsilon == 0 and matrix.shape[1] > 1:
        matrix.copy_(torch.linalg.qr(matrix).Q)
        return
    for i in range(matrix.shape[1]):
        col = matrix[:, i:i + 1]
        norm = torch.linalg.vector_norm(col)
        col.div_(norm + epsilon if epsilon else norm.clamp_min(torch.finfo(matrix.dtype).tiny))
        if i + 1 < matrix.shape[1]:
            rest = matrix[:, i + 1:]
            rest.sub_(col * (col.T @ rest))


def _should_compress(n: int, m: int, rank: int, min_rate: float) -> tuple[bool, int, int]:
    uncompressed, compressed = n * m, (n + m) * rank
    return compressed * min_rate < uncompressed, uncompressed, compressed


def powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:  # noqa: N802
    """Average the bucket with rank-``matrix_approximation_rank`` PowerSGD compression."""
    group = state.process_group if state.process_group is not None else _get_default_group()
    world = group.size()
    buffer = bucket.buffer()
    if state.iter < state.start_powerSGD_iter or buffer.is_sparse:
        state.maybe_increase_iter(bucket)
        return _allreduce_fut(group, buffer)

    index = bucket.index()
    if state.use_error_feedback:
        error = state.error_dict.get(index)
        if error is not None and error.shape == buffer.shape:
            buffer.add_(error)
        original = buffer.clone()

    rank = state.matrix_approximation_rank
    matrices: list[torch.Tensor] = []
    flat_small: list[torch.Tensor] = []
    for g in bucket.gradients():
        if g.dim() > 1:
            n, m = g.shape[0], g.numel() // g.shape[0]
            r = min(n, m, rank)
            ok, before, after = _should_compress(n, m, r, state.min_compression_rate)
            state.total_numel_before_compression += before
            state.total_numel_after_compression += after if ok else before
            if ok:
                matrices.append(g.view(n, m))
                continue
        else:
            state.total_numel_before_compression += g.numel()
            state.total_numel_after_compression += g.numel()
        flat_small.append(g)

    if flat_small:
        packed = torch.cat([g.reshape(-1) for g in flat_small])
        all_reduce(packed, group=group)
        offset = 0
        for g in flat_small:
            g.copy_(packed[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        for g in flat_small:
            g.div_(world)

    if matrices:
        ranks = [min(mat.shape[0], mat.shape[1], rank) for mat in matrices]
        qs = state.q_memory_dict.get(index) if state.warm_start else None
        if qs is None or [q.shape for q in qs] != [(mat.shape[1], r) for mat, r in zip(matrices, ranks)]:
            qs = []
            for mat, r in zip(matrices, ranks):
                q = torch.randn(mat.shape[1], r, generator=state.rng).to(mat)
                _orthogonalize(q, state.orthogonalization_epsilon)
                qs.append(q)
        ps = [mat @ q for mat, q in zip(matrices, qs)]
        p_flat = torch.cat([p.reshape(-1) for p in ps])
        all_reduce(p_flat, group=group)
        _unpack(p_flat, ps)
        for p in ps:
            _orthogonalize(p, state.orthogonalization_epsilon)
        qs = [mat.T @ p for mat, p in zip(matrices, ps)]
        q_flat = torch.cat([q.reshape(-1) for q in qs])
        all_reduce(q_flat, group=group)
        _unpack(q_flat, qs)
        for mat, p, q in zip(matrices, ps, qs):
            torch.matmul(p, q.T, out=mat)
            mat.div_(world)
        if state.warm_start:
            state.q_memory_dict[index] = qs

    if state.use_error_feedback:
        state.error_dict[index] = original - buffer
    state.maybe_increase_iter(bucket)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def _unpack(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
