"""PowerSGD at low rank, where its answer is not the exact average, against a reference of the
algorithm (Vogels et al., 2019) written here: error feedback, warm start, the switch from
plain all-reduce at ``start_powerSGD_iter``, and ``compression_stats``, over several steps.

The reference sees every rank's gradients at once and computes what the hook should give each
rank: M_r (its gradient plus its error from the last step) as an n x m matrix; P = sum_r M_r Q
orthonormalised (Gram-Schmidt, here; the hook uses QR, which differs only in column signs,
and P Q^T does not see those); Q = sum_r M_r^T P; the average P Q^T / world; the new error
M_r - average; Q kept for the next step. Vectors, and matrices that would not shrink by
``min_compression_rate``, are averaged exactly.
"""

from __future__ import annotations

import threading

import pytest
import torch

import pyc10d as dist
from pyc10d.nn.comm_hooks import PowerSGDState, powerSGD_hook

WORLD, STEPS, RANK, START, SEED = 2, 6, 2, 2, 7
# compressed (16 x 12, and 8 x 3 x 4 as 8 x 12), too small to pay (4 x 3), a vector
SHAPES = [(16, 12), (8, 3, 4), (4, 3), (7,)]


def _grads(rank: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]


class _Bucket:
    """What ``powerSGD_hook`` reads of a ``GradBucket``: one bucket of every gradient."""

    def __init__(self, grads: list[torch.Tensor]) -> None:
        self._buffer = torch.cat([g.reshape(-1) for g in grads])
        self._views, offset = [], 0
        for g in grads:
            self._views.append(self._buffer[offset:offset + g.numel()].view(g.shape))
            offset += g.numel()

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


def _gram_schmidt(a: torch.Tensor) -> torch.Tensor:
    cols: list[torch.Tensor] = []
    for i in range(a.shape[1]):
        c = a[:, i].clone()
        for prev in cols:
            c -= (prev @ c) * prev
        cols.append(c / c.norm())
    return torch.stack(cols, dim=1)


def _reference() -> tuple[list[torch.Tensor], list[list[torch.Tensor | None]], tuple[float, int, int]]:
    """Per step: the average every rank should hold, and each rank's error afterwards; and
    the compression stats after the last step."""
    rng = torch.Generator().manual_seed(SEED)
    errors: list[torch.Tensor | None] = [None] * WORLD
    warm: list[torch.Tensor] | None = None
    before = after = 0
    averages, errs = [], []
    for step in range(STEPS):
        flat = [torch.cat([g.reshape(-1) for g in _grads(r, step)]) for r in range(WORLD)]
        if step < START:  # plain all-reduce: the exact average, no error kept
            averages.append(sum(flat) / WORLD)
            errs.append([None] * WORLD)
            continue
        flat = [f + e if e is not None else f for f, e in zip(flat, errors)]
        pieces, offset, matrices = [], 0, []
        for shape in SHAPES:
            numel = int(torch.Size(shape).numel())
            mats = [f[offset:offset + numel].view(shape[0], -1) for f in flat]
            offset += numel
            n, m = mats[0].shape
            r = min(n, m, RANK)
            compress = len(shape) > 1 and (n + m) * r * 2 < n * m
            before += n * m
            after += (n + m) * r if compress else n * m
            if compress:
                matrices.append(mats)
                pieces.append(None)  # filled below, in order
            else:
                pieces.append(sum(mats).reshape(-1) / WORLD)
        if warm is None:  # the random start, drawn in matrix order
            warm = [_gram_schmidt(torch.randn(mats[0].shape[1], min(*mats[0].shape, RANK),
                                              generator=rng).double()) for mats in matrices]
        results, new_q = [], []
        for mats, q in zip(matrices, warm):
            p = _gram_schmidt(sum(m @ q for m in mats))
            q = sum(m.T @ p for m in mats)
            results.append((p @ q.T / WORLD).reshape(-1))
            new_q.append(q)
        warm = new_q
        it = iter(results)
        average = torch.cat([piece if piece is not None else next(it) for piece in pieces])
        errors = [f - average for f in flat]
        averages.append(average)
        errs.append(list(errors))
    return averages, errs, (before / after, before, after)


def _run_ranks() -> dict[int, list[tuple[torch.Tensor, torch.Tensor | None, tuple]]]:
    store, seen, failures = dist.HashStore(), {}, []

    def rank_main(rank: int) -> None:
        try:
            dist.init_process_group("threaded", store=store, rank=rank, world_size=WORLD)
            try:
                state = PowerSGDState(None, matrix_approximation_rank=RANK, start_powerSGD_iter=START,
                                      min_compression_rate=2, random_seed=SEED)
                steps = []
                for step in range(STEPS):
                    out = powerSGD_hook(state, _Bucket(_grads(rank, step))).wait()
                    error = state.error_dict.get(0)
                    steps.append((out.clone(), None if error is None else error.clone(),
                                  state.compression_stats()))
                seen[rank] = steps
            finally:
                dist.destroy_process_group()
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(25)
    assert not failures, failures
    return seen


@pytest.mark.timeout(30)
def test_low_rank_powersgd_matches_the_reference_step_by_step() -> None:
    averages, errors, stats = _reference()
    exact = [sum(torch.cat([g.reshape(-1) for g in _grads(r, s)]) for r in range(WORLD)) / WORLD
             for s in range(STEPS)]
    # at rank 2 the compressed matrices are approximations: this is not a plain all-reduce
    assert (averages[START] - exact[START]).abs().max() > 0.1
    seen = _run_ranks()
    for rank in range(WORLD):
        for step, (out, error, _) in enumerate(seen[rank]):
            assert torch.allclose(out, averages[step], rtol=1e-9, atol=1e-9), (rank, step)
            want = errors[step][rank]
            if want is None:
                assert error is None, (rank, step)
            else:  # error feedback: what this rank's approximation lost, carried to the next step
                assert error is not None and torch.allclose(error, want, rtol=1e-9, atol=1e-9), (rank, step)
        rate, before, after = seen[rank][-1][2]
        assert (before, after) == stats[1:] and rate == pytest.approx(stats[0])
    # (16 + 12) * 2 and (8 + 12) * 2 numbers instead of 192 and 96, 12 + 7 uncompressed
    assert stats[1:] == ((192 + 96 + 12 + 7) * (STEPS - START), (56 + 40 + 12 + 7) * (STEPS - START))
