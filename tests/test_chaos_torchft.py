"""A short run of the torchft chaos (tests/chaos_torchft.py; ``make chaos-torchft`` runs 200
failures): three replica groups under torchft's Manager on ProcessGroupPyc10d, one SIGKILLed
and restarted at a time while the others train on; no hang, no wrong result, no leak."""

from __future__ import annotations

import pytest

pytest.importorskip("torchft", reason="torchft-nightly (the test extra) is not installed")

from chaos_torchft import chaos  # noqa: E402

pytestmark = [pytest.mark.timeout(58), pytest.mark.interpreters]


def test_replicas_killed_in_turn_are_survived_and_healed() -> None:
    verdict = chaos(failures=3, seed=7)
    assert verdict["ok"], "\n".join(verdict["problems"])
    assert verdict["failures"] == 3
    assert max(verdict["recovery_s"]) < 10
