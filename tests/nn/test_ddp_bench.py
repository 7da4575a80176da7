"""``python -m pyc10d.bench.ddp`` runs end to end and writes its JSON record (smoke test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.interpreters]


def test_ddp_bench_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pyc10d.bench.ddp", "--impls", "pyc10d-shm,pyc10d-tcp", "--world-sizes", "2",
           "--steps", "2", "--warmup", "1", "--rounds", "1", "--dim", "32", "--layers", "1",
           "--context", "16", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=50)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = tmp_path.glob("ddp-*.json")
    records = json.loads(path.read_text())["records"]
    assert {r["impl"] for r in records} == {"pyc10d-shm", "pyc10d-tcp"}
    for r in records:
        assert r["world_size"] == 2 and r["step_ms"] > 0 and 0 <= r["hidden"] <= 1
        assert r["checked"] and r["steps_per_block"] == 2 and len(r["times_s"]["step"]) == 3
