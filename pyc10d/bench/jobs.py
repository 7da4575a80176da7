"""``python -m pyc10d.bench --jobs N``: the spread across fresh jobs, not within one.

A figure of the ordinary run is the best of a few loops inside one job, and of two jobs at
most. What a user meets as "some runs are twice as slow" may be decided when a job starts
(where its threads land, what its pages are) and hold for the whole job: it shows only
across many jobs. Here every (backend, world size) runs ``N`` times as a fresh job, the jobs
of the backends interleaved (job 1 of each, then job 2 of each, ...) so that a burst of load
hits every backend alike; each job's figure is kept, and the table gives the fastest, the
median and the slowest job and their ratio, beside the same for the peers (Gloo, Open MPI).
Every timed call is checked as in every other run (``worker.check``): a job with a wrong
result fails the run.

The host itself has slow stretches too: on a VM, two processes on two CPUs that hand 1 MiB
chunks to each other through shared memory, nothing of pyc10d or torch in them, moved 28-36
GB/s, and 3-4 GB/s for stretches of 2-40 s (docs/where-the-time-goes.md, "Run-to-run spread").
``host_probe`` is that exchange, run before the first job and after every job: a job with
a probe on either side under half the run's median probe ran while the host was slow, and
the table's last column is the spread over the other jobs (the full spread stays beside it).
"""

from __future__ import annotations

import mmap
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyc10d.bench import metrics, report

Record = dict[str, Any]


def run(one_job: Callable[[str, int], tuple[list[Record], str | None]], jobs: int,
        backends: Sequence[str], world_sizes: Sequence[int]) -> tuple[list[Record], bool]:
    """``jobs`` fresh jobs of every backend and world size (``one_job(backend, world_size)``
    runs one: the driver's ``run_job``); each record tagged with its job."""
    records: list[Record] = []
    failed = False
    before = host_probe()
    for job in range(1, jobs + 1):
        for ws in world_sizes:
            for backend in backends:
                print(f"== {backend}, world size {ws} (job {job}/{jobs}) ==", flush=True)
                recs, err = one_job(backend, ws)
                after = host_probe()
                print(f"   host probe before / after: {before:.1f} / {after:.1f} GB/s", flush=True)
                if err:
                    failed = True
                    print(f"   {backend} world size {ws} FAILED: {err}", flush=True)
                    records.append({"kind": "failure", "backend": backend, "world_size": ws,
                                    "error": err, "job": job})
                for r in recs:
                    if r.get("kind") == "collective":
                        records.append({**r, "job": job, "probe_GBps": [before, after]})
                before = after
    return records, failed


def _put(data: memoryview, at: int, chunk: bytes) -> None:
    data[at:at + len(chunk)] = chunk


def _spin_until(flags: memoryview, side: int, value: int, deadline: float) -> None:
    while flags[side] < value:
        if time.perf_counter() > deadline:  # (the other side died)
            raise TimeoutError


def host_probe(chunk: int = 1 << 20, swaps: int = 200) -> float:
    """GB/s of two processes, on two CPUs of the affinity set, swapping ``chunk`` bytes
    ``swaps`` times through a shared mapping (spinning on flags), as a 2-rank shm collective
    hands its chunks: the host's speed at it now, with nothing of pyc10d or torch (plain
    memoryview copies; every chunk received checked). 0.0 where it cannot run (one CPU)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return 0.0
    buf = mmap.mmap(-1, 64 + 2 * chunk)
    flags = memoryview(buf)[:16].cast("q")
    data = memoryview(buf)[64:]
    pid = os.fork()
    me = 1 if pid == 0 else 0
    ok, took = True, -1.0
    try:
        os.sched_setaffinity(0, [cpus[me]])
        mine, theirs = bytes([me + 1]) * chunk, bytearray(chunk)
        t0 = time.perf_counter()
        for i in range(1, swaps + 1):
            _put(data, me * chunk, mine)
            flags[me] = 2 * i
            _spin_until(flags, 1 - me, 2 * i, t0 + 30)
            theirs[:] = data[(1 - me) * chunk:(2 - me) * chunk]
            ok = ok and theirs[0] == theirs[-1] == 2 - me
            flags[me] = 2 * i + 1
            _spin_until(flags, 1 - me, 2 * i + 1, t0 + 30)
        took = time.perf_counter() - t0
    except TimeoutError:
        ok = False
    finally:
        if pid == 0:  # (an exception here, too, fails the probe)
            os._exit(0 if ok and took >= 0 else 1)
        os.sched_setaffinity(0, cpus)
    _, status = os.waitpid(pid, 0)
    flags.release()
    data.release()
    buf.close()
    if not ok or status != 0:
        raise RuntimeError("host probe: a chunk arrived wrong, or the other side stopped")
    return 2 * chunk * swaps / took / 1e9


def _probes(records: Sequence[Record]) -> list[float]:
    """The run's host probes, each once (a job's records, one per size, share its pair, and a
    job's probe after is the next job's before), sorted."""
    return sorted({p for r in report.collectives(records) for p in r.get("probe_GBps", ())})


def spread(records: Sequence[Record]) -> list[Record]:
    """One row per (backend, op, world size, size): its jobs' times and their spread, over
    every job and over the jobs the host probe found the host steady around."""
    groups: dict[tuple, list[Record]] = {}
    probes = _probes(records)
    slow_below = 0.5 * statistics.median(probes) if probes else 0.0  # the host was slow under it
    for r in report.collectives(records):
        groups.setdefault((r["backend"], r["op"], r["world_size"], r["bytes"]), []).append(r)
    rows = []
    for (backend, op, ws, nbytes), recs in groups.items():
        times = sorted(r["time_us"] for r in recs)
        steady = sorted(r["time_us"] for r in recs if min(r.get("probe_GBps", ()), default=slow_below) >= slow_below)
        rows.append({"backend": backend, "op": op, "world_size": ws, "bytes": nbytes,
                     "jobs": len(times), "times_us": times, "fastest_us": times[0],
                     "median_us": statistics.median(times), "slowest_us": times[-1],
                     "ratio": times[-1] / times[0] if times[0] > 0 else float("nan"),
                     "steady_jobs": len(steady),
                     "steady_ratio": steady[-1] / steady[0] if steady and steady[0] > 0 else float("nan"),
                     "correct": all(r.get("correct", False) for r in recs)})
    return sorted(rows, key=lambda r: (r["op"], r["world_size"], r["bytes"], r["backend"]))


def probe_line(records: Sequence[Record]) -> str:
    """The host probe's own spread over the run: a job spread no wider than it is the host's."""
    probes = _probes(records)
    if not probes or probes[0] <= 0:
        return "host probe: not run (one CPU)"
    return (f"host probe (two processes swapping 1 MiB chunks, no pyc10d): {probes[0]:.1f} / "
            f"{statistics.median(probes):.1f} / {probes[-1]:.1f} GB/s min / median / max, "
            f"max/min {probes[-1] / probes[0]:.2f}x")


def table(rows: Sequence[Record]) -> str:
    header = ["op", "n", "size", "backend", "jobs", "fastest us", "median us", "slowest us",
              "slowest/fastest", "checked", "host steady: jobs, slowest/fastest"]
    body = [[r["op"], str(r["world_size"]), metrics.format_size(r["bytes"]), r["backend"],
             str(r["jobs"]), f"{r['fastest_us']:.1f}", f"{r['median_us']:.1f}",
             f"{r['slowest_us']:.1f}", f"{r['ratio']:.2f}x", "ok" if r["correct"] else "WRONG",
             f"{r['steady_jobs']}, {r['steady_ratio']:.2f}x"]
            for r in rows]
    return report.render(header, body)


def plot(rows: Sequence[Record], path: Path) -> bool:
    """Every job's time, one strip per (op, size, backend): two modes show as two clusters."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows) + 2), 5.5))
    labels = []
    for i, r in enumerate(rows):
        ax.scatter([i] * len(r["times_us"]), [t / 1000 for t in r["times_us"]], s=14, alpha=0.7)
        op = r["op"].removesuffix("_into_tensor").removesuffix("_tensor")
        labels.append(f"{op} n={r['world_size']} {metrics.format_size(r['bytes'])}\n{r['backend']}")
    ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=60, ha="right")
    ax.set_ylabel("time per call, ms (one dot per fresh job)")
    ax.set_yscale("log")
    ax.set_title("spread across fresh jobs (python -m pyc10d.bench --jobs N)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
