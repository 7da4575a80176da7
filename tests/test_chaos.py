"""A short run of the chaos trials (tests/chaos.py; ``make chaos`` runs 500): a rank SIGKILLed
at a random point of a random sequence of checked collectives, on tcp and shm."""

from __future__ import annotations

import pytest
from chaos import Trial, run_trial


@pytest.mark.timeout(50)
@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_a_killed_rank_is_named_by_every_survivor(backend: str) -> None:
    failed = []
    for seed in range(6):
        verdict = run_trial(Trial.make(90_000 + seed, backend))
        if not verdict["ok"]:
            failed.append(verdict)
    assert not failed, "\n".join(f"seed {v['seed']}: {v['why'][:1500]}" for v in failed)
