"""``examples/train_ddp.py`` runs under ``pyc10d.run`` on two ranks and its loss falls."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyc10d.bench.launch import free_port

pytestmark = [pytest.mark.timeout(60), pytest.mark.interpreters]

ROOT = Path(__file__).resolve().parents[2]


# make test: the example's default backend (gloo); shm's run is in make test-full.
@pytest.mark.parametrize("backend", ["gloo", pytest.param("shm", marks=pytest.mark.full)])
def test_example_trains(backend: str) -> None:
    cmd = [sys.executable, "-m", "pyc10d.run", "--nproc-per-node", "2", "--start-method", "fork",
           "--master-port", str(free_port()),
           str(ROOT / "examples" / "train_ddp.py"),
           "--steps", "12", "--context", "32", "--backend", backend]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", proc.stdout)
    assert m, proc.stdout
    assert float(m.group(2)) < float(m.group(1)) - 0.3, proc.stdout
    assert "step   12/12" in proc.stdout
