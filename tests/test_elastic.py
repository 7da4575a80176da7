"""Abort and rebuild: survivors of a SIGKILLed rank abort the world, re-initialise with
renumbered ranks in the same processes and finish training (examples/elastic_shrink.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pyc10d as dist

pytestmark = pytest.mark.interpreters  # starts Python interpreters: see conftest.py

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "elastic_shrink.py"


# make test: shm, what the example's default ("auto") picks on one host; tcp's rebuild is in
# make test-full (a death on tcp is named in make test by test_chaos.py).
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", [pytest.param("tcp", marks=pytest.mark.full), "shm"])
def test_survivors_rebuild_and_finish_training(backend: str) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--world", "3", "--kill-rank", "1", "--kill-step", "3",
                           "--steps", "8", "--backend", backend], capture_output=True, text=True, timeout=50)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "generation 1: 2 ranks [0, 2], resuming at step" in out, out
    assert "survivors [0, 2]: parameters after 8 steps equal one process" in out, out
    # every survivor's error named the dead rank (directly, or as the root cause of an abort)
    errors = [line for line in out.splitlines() if "(generation 0):" in line]
    assert len(errors) == 2 and all("rank 1" in e for e in errors), errors


def test_abort_process_group_names() -> None:
    assert dist._abort_process_group is dist.abort_process_group
    dist.abort_process_group()  # nothing initialised: a no-op, like destroy's warning-free path
