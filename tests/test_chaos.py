"""A short run of the chaos trials (tests/chaos.py; ``make chaos`` runs 500 native and 400
plugin trials): a rank SIGKILLed at a random point of a random sequence of checked collectives
on tcp and shm, or of torch's DDP / FSDP2 training on the plugin's pyc10d_shm and pyc10d_tcp."""

from __future__ import annotations

import pytest
from _clock import bound
from chaos import Trial, run_trial


def _trials(backend: str, seeds: range) -> None:
    failed = []
    for seed in seeds:
        # every survivor names the death within 3 s (docs/failures.md), on the 2-core VM's scale
        verdict = run_trial(Trial.make(seed, backend), deadline_s=bound(3.0))
        if not verdict["ok"]:
            failed.append(verdict)
    assert not failed, "\n".join(f"seed {v['seed']}: {v['why'][:1500]}" for v in failed)


# make test: 3 trials per backend; make test-full: the other 3 seeds of the 6 this ran before.
@pytest.mark.timeout(50)
@pytest.mark.parametrize(("backend", "seeds"), [
    pytest.param(backend, seeds, id=f"{backend}{tag}", marks=marks)
    for backend in ("tcp", "shm")
    for seeds, tag, marks in ((range(90_000, 90_003), "", ()),
                              (range(90_003, 90_006), "-more-seeds", pytest.mark.full))])
def test_a_killed_rank_is_named_by_every_survivor(backend: str, seeds: range) -> None:
    _trials(backend, seeds)


@pytest.mark.timeout(50)
@pytest.mark.parametrize("backend", ["pyc10d_shm", "pyc10d_tcp"])
def test_torch_training_on_the_plugin_survives_a_killed_rank(backend: str) -> None:
    _trials(backend, range(91_000, 91_003))
