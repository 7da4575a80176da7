"""Smoke test of ``python -m pyc10d.bench --funcol``: it runs, checks its results, writes JSON."""

import json
from pathlib import Path

import pytest

from pyc10d.bench import funcol


@pytest.mark.timeout(60)
def test_funcol_bench_runs(tmp_path: Path) -> None:
    code = funcol.main(["--backends", "shm", "--sizes", "8,64K", "--iters", "5", "--reps", "1",
                        "--overlap-bytes", "64K", "--out", str(tmp_path)])
    assert code == 0
    (path,) = tmp_path.glob("funcol-*.json")
    records = json.loads(path.read_text())
    kinds = {(r["kind"], r.get("api")) for r in records}
    assert kinds == {("funcol", "in-place"), ("funcol", "functional"), ("funcol", "functional-async"),
                     ("overlap", None)}
    assert all(r["correct"] for r in records)
    assert all(r["time_us"] > 0 for r in records if r["kind"] == "funcol")


@pytest.mark.timeout(60)
def test_funcol_bench_check_fails_when_one_timed_call_returns_a_stale_result(tmp_path: Path) -> None:
    """The third timed functional all_reduce hands back the previous call's output."""
    from pyc10d.bench.sabotage import run_sabotaged

    records = run_sabotaged("pyc10d.bench.funcol", "pyc10d.functional:all_reduce:3:stale", 2,
                            ["--backend", "shm", "--sizes", "8", "--iters", "5", "--reps", "1",
                             "--overlap-bytes", "4K"], tmp_path / "out.json", 50)
    assert isinstance(records, list), records
    verdicts = {r.get("api", r["kind"]): r["correct"] for r in records}
    assert verdicts == {"in-place": True, "functional": False, "functional-async": True,
                        "overlap": True}, verdicts
