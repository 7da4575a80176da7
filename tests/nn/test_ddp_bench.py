"""``python -m pyc10d.bench.ddp`` runs end to end and writes its JSON record (smoke test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.interpreters]


# One implementation per driver call: half the work of the two in one call, which ran into the
# driver's 50 s under load. pyc10d-tcp's run is in make test-full.
@pytest.mark.parametrize("impl", ["pyc10d-shm", pytest.param("pyc10d-tcp", marks=pytest.mark.full)])
def test_ddp_bench_smoke(tmp_path: Path, impl: str) -> None:
    cmd = [sys.executable, "-m", "pyc10d.bench.ddp", "--impls", impl, "--world-sizes", "2",
           "--steps", "2", "--warmup", "1", "--rounds", "1", "--dim", "32", "--layers", "1",
           "--context", "16", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=50)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = tmp_path.glob("ddp-*.json")
    records = json.loads(path.read_text())["records"]
    assert {r["impl"] for r in records} == {impl}
    for r in records:
        assert r["world_size"] == 2 and r["step_ms"] > 0 and 0 <= r["hidden"] <= 1
        assert r["checked"] and r["steps_per_block"] == 2 and len(r["times_s"]["step"]) == 3


def test_ddp_bench_check_fails_when_one_bucket_all_reduce_does_nothing(tmp_path: Path,
                                                                       capfd: pytest.CaptureFixture) -> None:
    """The first timed bucket all_reduce of a DDP step leaves its bucket alone: every rank
    keeps its own gradient there (its own batch), and the bit-for-bit comparison of the
    replicas after the block names it."""
    from pyc10d.bench.sabotage import run_sabotaged

    res = run_sabotaged("pyc10d.bench.ddp", "pyc10d.nn.reducer:all_reduce:1:blind", 2,
                        ["--impl", "pyc10d-shm", "--steps", "2", "--blocks", "1", "--warmup", "1",
                         "--dim", "32", "--layers", "1", "--context", "16", "--batch", "2",
                         "--bucket-cap-mb", "1"], tmp_path / "out.json", 50)
    assert isinstance(res, str) and res.startswith("exit code"), res
    err = capfd.readouterr().err
    assert "parameters differ between ranks after block 0 of DDP steps" in err, err[-3000:]
