"""``python -m pyc10d.bench.symm_mem``: one small run end to end (2 ranks, 1 MiB, no Gloo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.interpreters]


def test_small_run_prints_a_table_and_writes_json(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pyc10d.bench.symm_mem", "--world-sizes", "2", "--mib", "1",
           "--reps", "1", "--no-gloo", "--ag-shape", "256,64,8", "--rs-shape", "256,8,64",
           "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=50)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all_reduce of 1 MiB" in res.stdout and "mm_rs" in res.stdout, res.stdout
    (path,) = tmp_path.glob("symm_mem-*.json")
    (rec,) = json.loads(path.read_text())["records"]
    assert rec["world_size"] == 2 and rec["allreduce_symm_ms"] > 0 and 0 <= rec["ag_mm_overlap"] <= 1
    assert rec["wrong"] == []


def test_checks_fail_when_a_timed_all_reduce_or_fused_op_does_nothing(tmp_path: Path) -> None:
    """One run, two sabotaged calls: the first timed all_reduce leaves its tensor alone (the
    symmetric one: its input, refilled before the call, is not the average), and the second
    timed fused_matmul_reduce_scatter hands back the first's result (other inputs)."""
    from pyc10d.bench.sabotage import run_sabotaged

    rec = run_sabotaged("pyc10d.bench.symm_mem",
                        "pyc10d:all_reduce:1:blind,pyc10d.symmetric_memory:fused_matmul_reduce_scatter:2:stale",
                        2, ["--impl", "pyc10d-shm", "--mib", "1", "--reps", "1", "--ag-shape", "256,64,8",
                            "--rs-shape", "256,8,64"], tmp_path / "out.json", 50)
    assert isinstance(rec, dict), rec
    assert sorted(rec["wrong"]) == [f"rank {r}: {what}: a timed call of loop 0 gave a wrong result"
                                    for r in (0, 1) for what in ("all_reduce symm", "mm_rs fused")], rec["wrong"]
