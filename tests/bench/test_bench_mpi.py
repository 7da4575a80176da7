"""The C reference in the benchmark (``python -m pyc10d.bench --peer mpi``): Open MPI through
mpi4py, under its own mpirun, timing the same grid with the same exact checks.

mpi4py is never imported in the test process (MPI_Init there would outlive the test and fork
badly): every MPI rank is a process of mpirun's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyc10d.bench.__main__ import mpirun

pytestmark = [pytest.mark.timeout(55), pytest.mark.interpreters]
HERE = Path(__file__).resolve().parents[1]  # tests/
OPS = "all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast,all_to_all_single,reduce"
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           PYTHONPATH=str(HERE.parent))


def _ranks(script: list[str], out: Path, n: int = 2, mode: str = "loop") -> list[dict]:
    cmd = [mpirun(), "--oversubscribe", "-np", str(n), sys.executable, *script,
           "--ops", OPS, "--sizes", "8,4096", "--iters", "10", "--mode", mode, "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=50, env=ENV)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(out.read_text())


def test_every_op_is_right_under_mpirun(tmp_path: Path) -> None:
    recs = _ranks(["-m", "pyc10d.bench.mpi_worker"], tmp_path / "mpi.json", n=3)
    assert sorted(r["op"] for r in recs) == sorted(OPS.split(",") * 2)  # two sizes each
    for r in recs:
        assert r["backend"] == "mpi" and r["world_size"] == 3 and r["correct"], r
        assert r["time_us"] > 0 and r["ops_per_loop"] >= 2


# make test: back-to-back loops, the default mode; the spaced loops' run is in make test-full.
@pytest.mark.parametrize("mode", ["loop", pytest.param("spaced", marks=pytest.mark.full)])
def test_the_check_fails_when_one_timed_call_does_nothing(tmp_path: Path, mode: str) -> None:
    recs = _ranks([str(HERE / "_mpi_noop_rank.py")], tmp_path / "noop.json", mode=mode)
    assert {r["mode"] for r in recs} == {mode}
    wrong = sorted(r["op"] for r in recs if not r["correct"])
    # every op and size: every rank skipped the same timed call, whose output stayed poisoned
    # (NaN, or for the in-place ops the restored input)
    assert wrong == sorted(op for op in OPS.split(",") for _ in range(2)), recs


def test_the_driver_prints_mpi_ratios(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pyc10d.bench", "--backends", "pyc10d-threaded", "--peer", "mpi",
           "--ops", "all_reduce", "--world-sizes", "2", "--max-bytes", "32", "--iters", "4",
           "--rounds", "1", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=50, env=ENV)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "pyc10d-threaded t/mpi" in res.stdout, res.stdout
    recs = json.loads((tmp_path / "latest.json").read_text())
    assert {r["backend"] for r in recs if r.get("kind") == "collective"} == {"pyc10d-threaded", "mpi"}


def test_tcp_rows_are_compared_with_open_mpi_over_tcp(tmp_path: Path) -> None:
    """With a pyc10d backend that crosses a network (tcp), ``--peer mpi`` also runs Open MPI
    forced onto its TCP transport, and the tcp rows' time ratio is against that run."""
    from pyc10d.bench.report import c_reference

    assert c_reference("pyc10d-tcp", ["pyc10d-tcp", "mpi", "mpi-tcp"]) == "mpi-tcp"
    assert c_reference("pyc10d-shm", ["pyc10d-shm", "mpi", "mpi-tcp"]) == "mpi"
    cmd = [sys.executable, "-m", "pyc10d.bench", "--backends", "pyc10d-tcp", "--peer", "mpi",
           "--ops", "all_reduce", "--world-sizes", "2", "--max-bytes", "32", "--iters", "4",
           "--rounds", "1", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=50, env=ENV)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "pyc10d-tcp t/mpi-tcp" in res.stdout and "== mpi-tcp, world size 2" in res.stdout, res.stdout
    recs = [r for r in json.loads((tmp_path / "latest.json").read_text()) if r.get("kind") == "collective"]
    assert {r["backend"] for r in recs} == {"pyc10d-tcp", "mpi", "mpi-tcp"}
    assert all(r["correct"] for r in recs)


def test_an_mpi_rank_does_not_import_torch() -> None:
    """``python -m pyc10d.bench.mpi_worker`` needs numpy and mpi4py only: the pyc10d package
    leaves its API (and torch, 2-2.5 s of CPU a rank) out of such a process."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "pyc10d.bench.mpi_worker", "--help"],
                         capture_output=True, text=True, timeout=50, env=ENV)
    assert res.returncode == 0, res.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")]
    assert "numpy" in imported and "pyc10d.bench.metrics" in imported, imported[-20:]
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")], "torch was imported"
