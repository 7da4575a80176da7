"""make bench's driver: one small run end to end, and the nccl-tests bandwidth formulas."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pyc10d.bench import metrics

pytestmark = pytest.mark.interpreters  # starts Python interpreters: see conftest.py


def test_bus_bandwidth_factors() -> None:
    # nccl-tests: busbw = algbw * 2(n-1)/n for all_reduce, (n-1)/n for gather/scatter kinds,
    # 1 for broadcast.
    algbw, busbw = metrics.bandwidths("all_reduce", 4_000_000, 0.001, 4)
    assert algbw == pytest.approx(4.0) and busbw == pytest.approx(6.0)
    _, busbw = metrics.bandwidths("all_gather_into_tensor", 4_000_000, 0.001, 4)
    assert busbw == pytest.approx(3.0)
    _, busbw = metrics.bandwidths("broadcast", 4_000_000, 0.001, 4)
    assert busbw == pytest.approx(4.0)


def test_large_sizes_keep_enough_timed_iterations() -> None:
    assert metrics.iterations(1024, 30) == (5, 30)
    assert metrics.iterations(64 * metrics.MIB, 30)[1] >= 8
    assert metrics.iterations(64 * metrics.MIB, 3)[1] == 3  # never more than asked for


def test_loop_shape() -> None:
    assert metrics.loop_shape(8, 100) == (20, 5)  # 100 small ops: 5 loops of 20
    k, loops = metrics.loop_shape(64 * metrics.MIB, 100)
    assert k == 2 and loops == 5  # at least 2 back to back, at most 256 MiB of buffers
    assert metrics.loop_shape(2 * metrics.MIB, 100) == (10, 5)


def test_every_timed_call_is_checked() -> None:
    """A wrong answer from any call of a timed loop, not only the first, marks the figure."""
    import torch

    from pyc10d.bench.worker import Op, time_op

    class OneRankDist:
        ReduceOp = type("R", (), {"MAX": "max"})
        calls = 0

        def all_reduce(self, t: torch.Tensor, op: object = None) -> None:
            self.calls += 1
            if self.calls == 9 and op is None:  # one timed call in the middle goes wrong
                t.add_(1)

        def barrier(self) -> None:
            pass

    dist = OneRankDist()
    op = Op(dist, "all_reduce", 4, 0, 1, 4)
    times, ok = time_op(dist, op, 4, 3, "loop")
    assert len(times) == 3 and not ok
    dist.calls = -100
    assert time_op(dist, Op(dist, "all_reduce", 4, 0, 1, 4), 4, 3, "barrier")[1]


def test_best_of_rounds_keeps_the_faster_round_and_any_failure() -> None:
    from pyc10d.bench.__main__ import best_of_rounds

    def rec(t: float, ok: bool = True) -> dict:
        return {"kind": "collective", "backend": "b", "op": "all_reduce", "world_size": 2,
                "bytes": 8, "time_us": t, "correct": ok}

    (kept,) = best_of_rounds([rec(5.0), rec(3.0, ok=False), rec(4.0)])
    assert kept["time_us"] == 3.0 and kept["round_times_us"] == [5.0, 3.0, 4.0]
    assert kept["correct"] is False


@pytest.mark.timeout(45)
def test_bench_run_writes_checked_records(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pyc10d.bench", "--backends", "pyc10d-tcp,pyc10d-threaded",
           "--ops", "all_reduce,reduce_scatter_tensor", "--world-sizes", "2",
           "--min-bytes", "8", "--max-bytes", "2K", "--iters", "3", "--out", str(tmp_path),
           "--name", "smoke", "--timeout", "15"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=40)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = json.loads((tmp_path / "smoke.json").read_text())
    runs = [r for r in records if r.get("kind") == "collective"]
    seen = {(r["backend"], r["op"], r["bytes"]) for r in runs}
    for backend in ("pyc10d-tcp", "pyc10d-threaded"):
        for op in ("all_reduce", "reduce_scatter_tensor"):
            assert {(backend, op, b) for b in (8, 32, 128, 512, 2048)} <= seen
    # Every timed op was checked against the expected result on every rank.
    assert all(r["correct"] for r in runs)
    assert all(r["time_us"] > 0 and r["busbw_GBps"] > 0 for r in runs)
    # two rounds by default: one record per figure, the faster round's, both medians kept
    assert len(runs) == len(seen)
    assert all(len(r["round_times_us"]) == 2 and r["time_us"] == min(r["round_times_us"]) for r in runs)
    if importlib.util.find_spec("matplotlib") is not None:  # the plot needs the bench extra
        assert (tmp_path / "smoke.png").stat().st_size > 0
    assert "all_reduce, world size 2" in proc.stdout


def test_readme_tables_come_from_the_reference_file(tmp_path: Path) -> None:
    from pyc10d.bench import readme

    def rec(backend: str, t: float, ok: bool = True) -> dict:
        return {"kind": "collective", "backend": backend, "op": "all_reduce", "world_size": 2,
                "bytes": 8, "time_us": t, "correct": ok}

    records = [{"kind": "meta", "time": "T", "cpus": 2, "platform": "P", "mode": "loop"},
               {"kind": "memcpy", "bytes": 64 * metrics.MIB, "GBps": 12.5},
               rec("pyc10d-shm", 20.0), rec("pyc10d-tcp", 400.0, ok=False), rec("gloo", 200.0)]
    text = readme.markdown(records, "ref.json")
    assert "| 8B | 2 | 20.0 | 400 | 200 | 10.00x | 0.50x (wrong!) |" in text, text
    assert "Slower than Gloo in this run: pyc10d-tcp all_reduce 8B n=2" in text and "12.5 GB/s" in text
    doc = tmp_path / "README.md"
    doc.write_text(f"intro\n{readme.BEGIN}\nold\n{readme.END}\nrest\n")
    readme.write_into(doc, text)
    body = doc.read_text()
    assert body.startswith("intro\n") and body.endswith("rest\n") and "old" not in body and "10.00x" in body


@pytest.mark.timeout(60)
def test_percall_bench_runs(tmp_path) -> None:


    from pyc10d.bench import percall

    assert percall.main(["--backends", "tcp", "--iters", "200", "--reps", "2", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("percall-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert {(r["backend"], r["op"]) for r in rows} == {(b, op) for b in ("tcp", "torch gloo") for op in percall.OPS}
    assert all(r["correct"] and r["median_us"] > 0 for r in rows)
