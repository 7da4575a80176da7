"""DDP over processes: the equivalence of ``test_ddp_equivalence`` on the tcp and shm backends.

Ranks are forked processes (``tests/_multirank.run_ranks``), so the all-reduces really cross
process boundaries and run on each group's progress thread while autograd continues.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch
from test_ddp_equivalence import MLP, ConvNet, _reference, _train_ddp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _multirank import run_ranks

pytestmark = pytest.mark.timeout(60)

CASES: dict[str, tuple[Any, tuple[int, ...], dict[str, Any]]] = {
    "mlp": (MLP, (8,), {}),
    "mlp_unused_as_view": (lambda: MLP(unused_branch=True), (8,),
                           {"find_unused_parameters": True, "gradient_as_bucket_view": True}),
    "convnet_syncbn": (ConvNet, (3, 6, 6), {"sync_bn": True}),
}


def _rank_body(rank: int, world_size: int, case: str) -> dict[str, torch.Tensor]:
    make, shape, kwargs = CASES[case]
    return _train_ddp(rank, world_size, make, shape, **kwargs)


#: The (case, backend) pairs make test runs: every case once, each backend at least once; the
#: rest of the grid runs in make test-full.
SHORT = {("mlp", "tcp"), ("mlp_unused_as_view", "shm"), ("convnet_syncbn", "shm")}


@pytest.mark.parametrize(("backend", "case"), [
    pytest.param(backend, case, id=f"{case}-{backend}",
                 marks=() if (case, backend) in SHORT else pytest.mark.full)
    for case in CASES for backend in ("tcp", "shm")])
def test_equivalence_across_processes(backend: str, case: str) -> None:
    make, shape, _ = CASES[case]
    world_size = 2 if case != "convnet_syncbn" else 3
    expected = _reference(make, shape)
    results = run_ranks(backend, world_size, _rank_body, case, timeout=45)
    for rank, got in enumerate(results):
        for k, v in expected.items():
            torch.testing.assert_close(got[k], v, atol=2e-5, rtol=1.3e-5, msg=lambda m, k=k, r=rank: f"rank {r} {k}: {m}")
