"""``python -m pyc10d.bench --jobs N``: the spread across fresh jobs, not within one.

A figure of the ordinary run is the best of a few loops inside one job, and of two jobs at
most. What a user meets as "some runs are twice as slow" is decided when a job starts
(where its threads land, what its pages are) and holds for the whole job: it shows only
across many jobs. Here every (backend, world size) runs ``N`` times as a fresh job, the jobs
of the backends interleaved (job 1 of each, then job 2 of each, ...) so that a burst of load
hits every backend alike; each job's figure is kept, and the table gives the fastest, the
median and the slowest job and their ratio, beside the same for the peers (Gloo, Open MPI).
Every timed call is checked as in every other run (``worker.check``): a job with a wrong
result fails the run.
"""

from __future__ import annotations

import statistics
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
    for job in range(1, jobs + 1):
        for ws in world_sizes:
            for backend in backends:
                print(f"== {backend}, world size {ws} (job {job}/{jobs}) ==", flush=True)
                recs, err = one_job(backend, ws)
                if err:
                    failed = True
                    print(f"   {backend} world size {ws} FAILED: {err}", flush=True)
                    records.append({"kind": "failure", "backend": backend, "world_size": ws,
                                    "error": err, "job": job})
                for r in recs:
                    if r.get("kind") == "collective":
                        records.append({**r, "job": job})
    return records, failed


def spread(records: Sequence[Record]) -> list[Record]:
    """One row per (backend, op, world size, size): its jobs' times and their spread."""
    groups: dict[tuple, list[Record]] = {}
    for r in report.collectives(records):
        groups.setdefault((r["backend"], r["op"], r["world_size"], r["bytes"]), []).append(r)
    rows = []
    for (backend, op, ws, nbytes), recs in groups.items():
        times = sorted(r["time_us"] for r in recs)
        rows.append({"backend": backend, "op": op, "world_size": ws, "bytes": nbytes,
                     "jobs": len(times), "times_us": times, "fastest_us": times[0],
                     "median_us": statistics.median(times), "slowest_us": times[-1],
                     "ratio": times[-1] / times[0] if times[0] > 0 else float("nan"),
                     "correct": all(r.get("correct", False) for r in recs)})
    return sorted(rows, key=lambda r: (r["op"], r["world_size"], r["bytes"], r["backend"]))


def table(rows: Sequence[Record]) -> str:
    header = ["op", "n", "size", "backend", "jobs", "fastest us", "median us", "slowest us",
              "slowest/fastest", "checked"]
    body = [[r["op"], str(r["world_size"]), metrics.format_size(r["bytes"]), r["backend"],
             str(r["jobs"]), f"{r['fastest_us']:.1f}", f"{r['median_us']:.1f}",
             f"{r['slowest_us']:.1f}", f"{r['ratio']:.2f}x", "ok" if r["correct"] else "WRONG"]
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
