"""make bench's driver: one small run end to end, and the nccl-tests bandwidth formulas."""

from __future__ import annotations

import importlib.util
import json
import os
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

        def all_reduce(self, t: torch.Tensor, op: object = None, group: object = None) -> None:
            self.calls += 1
            if self.calls == 11 and op is None:  # one timed call in the middle goes wrong
                t.add_(1)  # (4 warm-up calls, 4 timed + the loop's MAX, then this loop)

        def barrier(self, group: object = None) -> None:
            pass

    dist = OneRankDist()
    op = Op(dist, "all_reduce", 4, 0, 1, 4)
    times, ok = time_op(dist, op, 4, 3, "loop")
    assert len(times) == 3 and not ok
    dist.calls = -100
    assert time_op(dist, Op(dist, "all_reduce", 4, 0, 1, 4), 4, 3, "barrier")[1]


def _time_on_threads(op_name: str, sabotage: bool, world: int = 2, mode: str = "loop",
                     dtype: str = "float32") -> list[bool]:
    """``time_op`` of one small op on ``world`` threaded ranks (3 ops a loop, 2 loops); each
    rank's verdict. With ``sabotage``, the second timed call on every rank does nothing."""
    import threading
    from contextlib import nullcontext

    import torch

    import pyc10d
    from pyc10d.bench.sabotage import skip_call
    from pyc10d.bench.worker import Op, function_name, time_op

    store, verdicts, errors = pyc10d.HashStore(), [None] * world, []

    def rank_main(rank: int) -> None:
        try:
            pyc10d.init_process_group("threaded", store=store, rank=rank, world_size=world)
            try:
                op = Op(pyc10d, op_name, 4 * world, rank, world, 3, async_op=mode == "async",
                        dtype=getattr(torch, dtype))
                verdicts[rank] = time_op(pyc10d, op, 3, 2, mode)[1]
            finally:
                pyc10d.destroy_process_group()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with skip_call(pyc10d, function_name(pyc10d, op_name), 2) if sabotage else nullcontext():
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errors, errors
    return verdicts


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("mode", "dtype"), [("loop", "float32"), ("async", "float32"), ("spaced", "float32"),
                                             ("loop", "bfloat16")])
@pytest.mark.parametrize("op_name", metrics.OPS)
def test_the_check_fails_when_one_timed_call_does_nothing(op_name: str, mode: str, dtype: str) -> None:
    """Outputs are poisoned and inputs reset before every timed loop: a call that writes
    nothing (run on a clone, so the ranks stay in step) fails the check; untouched, it passes.
    ``async``: the K calls are issued with ``async_op=True`` and their Works waited at the end;
    ``spaced``: each call after a millisecond of busy work; ``bfloat16`` (``--dtype``): the
    same buffers, poison and check in bfloat16 (every expected value a small integer, exact
    in it)."""
    assert _time_on_threads(op_name, sabotage=False, mode=mode, dtype=dtype) == [True, True]
    verdicts = _time_on_threads(op_name, sabotage=True, mode=mode, dtype=dtype)
    # broadcast's root and reduce's non-root hold the right values without the call
    assert not all(verdicts), f"{op_name}: a call that did nothing passed the check"


def test_bfloat16_sizes_and_the_c_reference(capsys: pytest.CaptureFixture[str]) -> None:
    """A size in bytes holds twice as many bfloat16 elements; Open MPI (numpy buffers) has no
    bfloat16, so the driver refuses to set it beside a bfloat16 run, as it refuses world
    sizes whose checked values bfloat16 cannot hold exactly."""
    from pyc10d.bench.__main__ import parse_args

    assert metrics.element_count("all_reduce", 64, 2, metrics.DTYPES["bfloat16"]) == 32
    assert metrics.element_count("all_gather_into_tensor", 6, 4, 2) == 4  # 3 rounded to n
    assert metrics.element_count("all_reduce", 64, 2) == 16  # float32 by default
    assert parse_args(["--dtype", "bfloat16"]).dtype == "bfloat16"
    assert parse_args([]).dtype == "float32"
    with pytest.raises(SystemExit):
        parse_args(["--peer", "mpi", "--dtype", "bfloat16"])
    assert "the C reference (mpi) times float32 only" in capsys.readouterr().err
    assert parse_args(["--dtype", "bfloat16", "--world-sizes", "2,16"]).world_sizes == [2, 16]
    with pytest.raises(SystemExit):
        parse_args(["--dtype", "bfloat16", "--world-sizes", "17"])
    assert f"world sizes up to {metrics.BFLOAT16_MAX_WORLD}" in capsys.readouterr().err


@pytest.mark.timeout(45)
def test_a_bfloat16_run_writes_bfloat16_records(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pyc10d.bench", "--backends", "pyc10d-threaded", "--dtype", "bfloat16",
           "--ops", "all_reduce,all_gather", "--world-sizes", "2", "--min-bytes", "8", "--max-bytes", "128",
           "--iters", "3", "--rounds", "1", "--out", str(tmp_path), "--name", "bf16", "--timeout", "15"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=40)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = json.loads((tmp_path / "bf16.json").read_text())
    runs = [r for r in records if r.get("kind") == "collective"]
    assert {(r["op"], r["bytes"], r["count"]) for r in runs} == {
        (op, b, b // 2) for op in ("all_reduce", "all_gather_into_tensor") for b in (8, 32, 128)}
    assert all(r["dtype"] == "bfloat16" and r["correct"] for r in runs)
    assert records[0]["dtype"] == "bfloat16"
    assert "all_reduce, world size 2, bfloat16" in proc.stdout


def test_spaced_figures_leave_the_gap_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--mode spaced``: every call follows ``GAP_S`` of busy work, and the figure is the
    call's alone (a call that costs nothing reads under the gap, never below zero; the gap
    itself is really spent).

    On the wall clock a descheduled process lands its lost time in the figure, so under load
    no threshold between "the call alone" and "the gap left in" held (it failed once at
    ``GAP_S / 2``). The timing module's clock is a counter here instead: each read is one
    microsecond later, so the busy gap must really read its way through every microsecond, a
    no-op call costs a few reads, and a driver that left the gap in would read a whole gap."""
    import types

    import torch

    from pyc10d.bench import timing
    from pyc10d.bench.worker import Op, time_op

    class OneRankDist:
        ReduceOp = type("R", (), {"MAX": "max"})

        def all_reduce(self, t: torch.Tensor, op: object = None, group: object = None) -> None:
            pass

        def barrier(self, group: object = None) -> None:
            pass

    reads = 0

    def clock() -> float:
        nonlocal reads
        reads += 1
        return reads * 2.0**-20  # ~1 us a read, exact in binary

    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock))
    dist = OneRankDist()
    t0 = clock()
    times, ok = time_op(dist, Op(dist, "all_reduce", 4, 0, 1, 8), 8, 3, "spaced")
    took = clock() - t0
    assert ok and len(times) == 3
    assert took >= 4 * 8 * timing.GAP_S  # the warm-up loop and three timed ones, 8 gaps each
    assert reads >= 4 * 8 * timing.GAP_S / 2.0**-20  # ... spent reading the clock, not skipped
    assert all(0 <= t < timing.GAP_S / 100 for t in times), times


def test_the_c_reference_only_times_blocking_loops(capsys: pytest.CaptureFixture[str]) -> None:
    """mpi_worker times loops of blocking calls (back to back or spaced); beside another mode
    its figures would be compared with something else, so the driver refuses the pair."""
    from pyc10d.bench.__main__ import parse_args

    assert parse_args(["--peer", "mpi"]).mode == "loop"
    assert parse_args(["--peer", "mpi", "--mode", "spaced"]).mode == "spaced"
    cpus = len(os.sched_getaffinity(0))  # the gap is busy work: ranks sharing a core time each other's
    with pytest.raises(SystemExit):
        parse_args(["--mode", "spaced", "--world-sizes", str(cpus + 1)])
    assert f"--mode spaced: world size {cpus + 1} > {cpus} CPUs" in capsys.readouterr().err
    assert parse_args(["--mode", "spaced", "--world-sizes", f"1,{cpus + 1}"]).world_sizes == [1]
    assert parse_args(["--mode", "async"]).mode == "async"
    for mode in ("async", "barrier"):
        with pytest.raises(SystemExit):
            parse_args(["--peer", "mpi", "--mode", mode])
        assert "the C reference (mpi) times loops of blocking calls only" in capsys.readouterr().err


def test_best_of_rounds_keeps_the_faster_round_and_any_failure() -> None:
    from pyc10d.bench.__main__ import best_of_rounds

    def rec(t: float, ok: bool = True) -> dict:
        return {"kind": "collective", "backend": "b", "op": "all_reduce", "world_size": 2,
                "bytes": 8, "time_us": t, "correct": ok}

    (kept,) = best_of_rounds([rec(5.0), rec(3.0, ok=False), rec(4.0)])
    assert kept["time_us"] == 3.0 and kept["round_times_us"] == [5.0, 3.0, 4.0]
    assert kept["correct"] is False


# make test: tcp alone, whose jobs go through the launcher (pyc10d-threaded's in-process jobs
# run in the bfloat16 and --jobs tests below); make test-full: both in one run, as before.
@pytest.mark.timeout(45)
@pytest.mark.parametrize("backends", [
    pytest.param(("pyc10d-tcp",), id="tcp"),
    pytest.param(("pyc10d-tcp", "pyc10d-threaded"), id="tcp-threaded", marks=pytest.mark.full),
])
def test_bench_run_writes_checked_records(tmp_path: Path, backends: tuple[str, ...]) -> None:
    cmd = [sys.executable, "-m", "pyc10d.bench", "--backends", ",".join(backends),
           "--ops", "all_reduce,reduce_scatter_tensor", "--world-sizes", "2",
           "--min-bytes", "8", "--max-bytes", "2K", "--iters", "3", "--out", str(tmp_path),
           "--name", "smoke", "--timeout", "15"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=40)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # ranks forked from the driver, which had imported the worker module, run it as python -m would
    assert "RuntimeWarning" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    records = json.loads((tmp_path / "smoke.json").read_text())
    runs = [r for r in records if r.get("kind") == "collective"]
    seen = {(r["backend"], r["op"], r["bytes"]) for r in runs}
    assert {r["backend"] for r in runs} == set(backends)
    for backend in backends:
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
    assert "mpi" not in text  # no C reference in the run: no column for it
    # with the C reference: its time, and shm's time over it (an MPI figure marked wrong shows)
    text = readme.markdown([*records, rec("mpi", 5.0)], "ref.json")
    assert "| size | n | shm µs | tcp µs | gloo µs | shm / gloo | tcp / gloo | mpi µs | shm t/mpi |" in text, text
    assert "| 8B | 2 | 20.0 | 400 | 200 | 10.00x | 0.50x (wrong!) | 5.0 | 4.00x |" in text, text
    text = readme.markdown([*records, rec("mpi", 5.0, ok=False)], "ref.json")
    assert "| 5.0 | 4.00x (wrong!) |" in text, text
    # and with Open MPI forced onto TCP too: tcp's time over that one, the same transport in C
    text = readme.markdown([*records, rec("mpi", 5.0), rec("mpi-tcp", 8.0)], "ref.json")
    assert "| mpi µs | shm t/mpi | mpi-tcp µs | tcp t/mpi-tcp |" in text, text
    assert "| 5.0 | 4.00x | 8.0 | 50.00x (wrong!) |" in text and "`tcp t/mpi-tcp` = pyc10d tcp's time" in text, text


def test_readme_headline_comes_from_the_reference_file(tmp_path: Path) -> None:
    from pyc10d.bench import readme

    def rec(backend: str, ws: int, size: int, t: float, ok: bool = True) -> dict:
        return {"kind": "collective", "backend": backend, "op": "all_reduce", "world_size": ws,
                "bytes": size, "time_us": t, "correct": ok}

    records = [{"kind": "meta", "time": "T", "cpus": 2},
               rec("pyc10d-shm", 2, 8, 20.0), rec("pyc10d-tcp", 2, 8, 300.0), rec("gloo", 2, 8, 700.0),
               rec("mpi", 2, 8, 2.5, ok=False), rec("pyc10d-shm", 2, 100, 1.0),  # not a headline size
               rec("pyc10d-shm", 4, 64 * metrics.MIB, 5000.0), rec("gloo", 4, 64 * metrics.MIB, 9000.0),
               {**rec("pyc10d-shm", 2, 8, 1.0), "op": "broadcast"}]
    text = readme.headline([*records, rec("mpi-tcp", 2, 8, 7.0)], "ref.json")
    assert text.splitlines()[2] == "| 8B | 2 | 20.0 | 300 | 700 | 2.5 (wrong!) | 7.0 |", text
    assert "Open MPI µs | Open MPI over TCP µs |" in text, text
    text = readme.headline(records, "ref.json")
    lines = text.splitlines()
    assert lines[0] == "| all_reduce | ranks | pyc10d shm µs | pyc10d tcp µs | Gloo µs | Open MPI µs |", text
    assert lines[2:4] == ["| 8B | 2 | 20.0 | 300 | 700 | 2.5 (wrong!) |", "| 64MiB | 4 | 5 000 | - | 9 000 | - |"]
    assert "`ref.json` (T, 2 CPUs" in text and len(lines) == 6
    doc = tmp_path / "README.md"
    doc.write_text(f"a\n{readme.HEADLINE_BEGIN}\nold\n{readme.HEADLINE_END}\nb\n{readme.BEGIN}\nkept\n{readme.END}\n")
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(records))
    assert readme.main([str(ref), "--headline", str(doc)]) == 0
    body = doc.read_text()
    assert "old" not in body and "| 8B | 2 | 20.0 |" in body and "kept" in body and body.startswith("a\n")


@pytest.mark.timeout(60)
def test_percall_bench_runs(tmp_path) -> None:
    from pyc10d.bench import percall

    assert percall.main(["--backends", "tcp", "--iters", "200", "--reps", "2", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("percall-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert {(r["backend"], r["op"]) for r in rows} == {(b, op) for b in ("tcp", "torch gloo") for op in percall.OPS}
    assert all(r["all_counted"] and r["median_us"] > 0 and r["world_size"] == 1 for r in rows)
    # the same work on every backend: 200 warm-up calls, then 2 loops of 200
    assert {(r["iters"], r["calls"], r["counted"]) for r in rows} == {(200, 600, 600)}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "barrier"])
def test_percall_check_fails_when_one_call_does_nothing(op: str) -> None:
    import pyc10d
    from pyc10d.bench import percall
    from pyc10d.bench.sabotage import skip_call

    with skip_call(pyc10d, op, 55, "drop", only_timed=False):  # 50 warm-up calls, then timed
        rows = percall._measure(pyc10d, "threaded", 50, 2)
    row = next(r for r in rows if r["op"] == op)
    assert not row["all_counted"] and (row["calls"], row["counted"]) == (150, 149)
    assert all(r["all_counted"] for r in rows if r["op"] != op)


class _StoreProxy:
    """A store whose methods can be replaced one by one (torch's store object takes no new
    attributes)."""

    def __init__(self, store: object) -> None:
        self._store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("impl", ["pyc10d", "torch"])
@pytest.mark.parametrize("op", ["set", "get", "add"])
def test_store_bench_check_fails_when_one_call_does_nothing(impl: str, op: str) -> None:
    import time

    from pyc10d.bench import store as bench_store
    from pyc10d.bench.sabotage import saboteur

    server = bench_store._server(impl)
    try:
        client = _StoreProxy(bench_store._client(impl, "127.0.0.1", server.port))
        client.set("bench/7", b"x" * 16)

        def run(tid: str) -> tuple[int, int]:
            now = time.monotonic()
            return bench_store._run_op(client, op, tid, now, now + 0.1, [])

        done, wrong = run("7")
        assert done > 5 and wrong == 0
        client.__dict__[op] = saboteur(getattr(client, op), 3, "drop", only_timed=False)
        client.set("bench/8", b"x" * 16)
        done, wrong = run("8")
        assert wrong >= 1, f"{impl} {op}: a call that did nothing passed ({done} calls)"
    finally:
        del server


@pytest.mark.timeout(30)
def test_store_bench_wait_probe_fails_for_a_wait_that_never_waits() -> None:
    import time

    from pyc10d.bench import store as bench_store

    server = bench_store._server("pyc10d")
    try:
        client = _StoreProxy(bench_store._client("pyc10d", "127.0.0.1", server.port))
        client.set("bench/7", b"x" * 16)
        now = time.monotonic()
        assert bench_store._run_op(client, "wait", "7", now, now + 0.05, [])[1] == 0
        client.__dict__["wait"] = lambda keys, timeout=None: None
        now = time.monotonic()
        assert bench_store._run_op(client, "wait", "7", now, now + 0.05, [])[1] == 1
    finally:
        del server


@pytest.mark.timeout(55)
@pytest.mark.parametrize("sabotage", [False, True])
def test_overhead_bench_checks_every_timed_all_reduce(tmp_path: Path, sabotage: bool) -> None:
    """Each loop of ``bench.overhead`` refills its buffers and checks every one: a run is
    right, and with the third timed all_reduce left without effect, wrong."""
    from pyc10d.bench.launch import run_worker
    from pyc10d.bench.sabotage import run_sabotaged

    args = ["--backend", "shm", "--pairs", "1", "--sizes", "8"]
    out = tmp_path / "out.json"
    if sabotage:
        rows = run_sabotaged("pyc10d.bench.overhead", "pyc10d:all_reduce:3:blind", 2, args, out, 50)
    else:
        rows = run_worker("pyc10d.bench.overhead", 2, args, out, 50)
    assert isinstance(rows, list), rows
    (hooks,) = [r for r in rows if "profiler_reads_per_call" in r]  # the profiler hooks' cost
    assert hooks["profiler_reads_per_call"] > 0
    (row,) = [r for r in rows if "profiler_reads_per_call" not in r]
    assert row["bytes"] == 8 and row["pairs"] == 1 and row["on_us"] > 0
    assert row["correct"] is (not sabotage)


def test_spread_across_jobs_keeps_every_job_and_any_failure() -> None:
    from pyc10d.bench import jobs

    def rec(job: int, t: float, ok: bool = True) -> dict:
        return {"kind": "collective", "backend": "b", "op": "all_reduce", "world_size": 2,
                "bytes": 8, "time_us": t, "correct": ok, "job": job}

    (row,) = jobs.spread([rec(1, 7.0), rec(2, 3.0), rec(3, 5.0, ok=False), {"kind": "memcpy"}])
    assert row["times_us"] == [3.0, 5.0, 7.0] and row["jobs"] == 3
    assert (row["fastest_us"], row["median_us"], row["slowest_us"]) == (3.0, 5.0, 7.0)
    assert row["ratio"] == pytest.approx(7.0 / 3.0)
    assert row["correct"] is False
    assert "WRONG" in jobs.table([row]) and "2.33x" in jobs.table([row])


def test_jobs_the_host_probe_found_slow_are_left_out_of_the_steady_spread() -> None:
    from pyc10d.bench import jobs

    def rec(job: int, t: float, probes: list[float]) -> dict:
        return {"kind": "collective", "backend": "b", "op": "all_reduce", "world_size": 2,
                "bytes": 8, "time_us": t, "correct": True, "job": job, "probe_GBps": probes}

    # probes 30, 30 | 30, 4 | 4, 30 | 30, 30: jobs 2 and 3 had the host slow on one side
    (row,) = jobs.spread([rec(1, 10.0, [30, 30]), rec(2, 35.0, [30, 4]), rec(3, 9.0, [4, 30]),
                          rec(4, 11.0, [30, 30])])
    assert row["ratio"] == pytest.approx(35.0 / 9.0)
    assert row["steady_jobs"] == 2 and row["steady_ratio"] == pytest.approx(11.0 / 10.0)
    assert "2, 1.10x" in jobs.table([row])
    line = jobs.probe_line([rec(1, 10.0, [30, 4]), rec(2, 10.0, [4, 28])])  # (job 2's before: job 1's after)
    assert "4.0 / 28.0 / 30.0 GB/s" in line and "7.50x" in line, line


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the probe needs two CPUs")
def test_the_host_probe_moves_bytes_between_two_cpus_and_checks_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyc10d.bench import jobs

    before = os.sched_getaffinity(0)
    assert jobs.host_probe(chunk=1 << 16, swaps=20) > 0
    assert os.sched_getaffinity(0) == before
    # the check can fail: a probe whose chunks are never written receives zeros
    monkeypatch.setattr(jobs, "_put", lambda data, at, chunk: None)
    with pytest.raises(RuntimeError, match="arrived wrong"):
        jobs.host_probe(chunk=1 << 16, swaps=5)


# Two jobs are a spread already; the third (one more interpreter) runs in make test-full.
@pytest.mark.timeout(50)
@pytest.mark.parametrize("n_jobs", [2, pytest.param(3, marks=pytest.mark.full)])
def test_jobs_mode_runs_fresh_jobs_and_reports_their_spread(tmp_path: Path, n_jobs: int) -> None:
    cmd = [sys.executable, "-m", "pyc10d.bench", "--jobs", str(n_jobs), "--backends", "pyc10d-threaded",
           "--ops", "all_reduce", "--world-sizes", "2", "--min-bytes", "64", "--max-bytes", "64",
           "--extra-sizes", "64", "--iters", "3", "--out", str(tmp_path), "--name", "jobs", "--timeout", "15"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=45)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = json.loads((tmp_path / "jobs.json").read_text())
    runs = [r for r in records if r.get("kind") == "collective"]
    assert sorted(r["job"] for r in runs) == list(range(1, n_jobs + 1)) and all(r["correct"] for r in runs)
    (row,) = [r for r in records if r.get("kind") == "spread"]
    assert row["times_us"] == sorted(r["time_us"] for r in runs)
    assert f"(job {n_jobs}/{n_jobs})" in proc.stdout and "slowest/fastest" in proc.stdout
