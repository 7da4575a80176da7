"""Per-call overhead: world size 1, where no byte moves and only the call itself costs.

``python -m pyc10d.bench.percall`` times ``all_reduce`` (8 B), ``broadcast`` (8 B) and
``barrier`` in one process of world size 1 on each pyc10d backend and on torch.distributed's
Gloo, the same number of calls on each (``--iters`` back to back per loop, K calls / K; the
best and the median of ``--reps`` loops). Target: at most 8 us per call on pyc10d. Writes
``<out>/percall-<time>.json``.

At world size 1 a collective's result is its input, so no value can tell a call that did its
work from one that did nothing: the check here is that the group counted every call (its
sequence number, ``_get_sequence_number_for_group``, which pyc10d and torch both keep, moved
by exactly the number of calls made), reported as ``all_counted``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pyc10d.bench.report import write_result

TARGET_US = 8.0
OPS = ("all_reduce", "broadcast", "barrier")


def _time(fn: Any, k: int, reps: int) -> tuple[list[float], int]:
    """Per-call microseconds of ``reps`` loops of ``k`` calls, after a warm-up loop; and the
    number of calls made in all."""
    warm = min(k, 1000)
    for _ in range(warm):  # warm: caches, the recorder's ring
        fn()
    loops = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        loops.append((time.perf_counter() - t0) / k * 1e6)
    return loops, warm + k * reps


def _measure(dist: Any, backend: str, k: int, reps: int) -> list[dict[str, Any]]:
    import torch

    store = dist.HashStore()
    dist.init_process_group(backend=backend, store=store, rank=0, world_size=1)
    x = torch.tensor([1.0, 2.0])
    calls = {"all_reduce": lambda: dist.all_reduce(x), "broadcast": lambda: dist.broadcast(x, 0),
             "barrier": lambda: dist.barrier()}
    group = dist.group.WORLD
    rows = []
    try:
        for op in OPS:
            seq0 = group._get_sequence_number_for_group()
            loops, made = _time(calls[op], k, reps)
            counted = group._get_sequence_number_for_group() - seq0
            rows.append({"backend": backend, "op": op, "world_size": 1, "iters": k, "reps": reps,
                         "best_us": min(loops), "median_us": statistics.median(loops),
                         "loops_us": loops, "calls": made, "counted": counted,
                         "all_counted": counted == made})
    finally:
        dist.destroy_process_group()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyc10d.bench.percall", description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="tcp,shm,threaded")
    ap.add_argument("--iters", type=int, default=5000, help="calls per loop, on every backend")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as tdist

    import pyc10d

    torch.set_num_threads(1)
    rows = []
    for backend in args.backends.split(","):
        rows += _measure(pyc10d, backend, args.iters, args.reps)
    gloo = _measure(tdist, "gloo", args.iters, args.reps)
    for r in gloo:
        r["backend"] = "torch gloo"
    rows += gloo
    ref = {r["op"]: r["median_us"] for r in gloo}
    print(f"per call at world size 1, {args.iters} calls a loop on every backend (us; median of "
          "loops, best in brackets), vs torch gloo; the result is the input at world size 1, so "
          "the check is that the group counted every call")
    print(f"{'backend':>11} " + " ".join(f"{op:>22}" for op in OPS))
    for backend in dict.fromkeys(r["backend"] for r in rows):
        cells = []
        for op in OPS:
            r = next(r for r in rows if (r["backend"], r["op"]) == (backend, op))
            mark = "" if r["all_counted"] else " UNCOUNTED"
            cells.append(f"{r['median_us']:7.2f} ({r['best_us']:6.2f}) {r['median_us'] / ref[op]:5.3f}x{mark}")
        print(f"{backend:>11} " + " ".join(f"{c:>22}" for c in cells))
    worst = max(r["median_us"] for r in rows if r["backend"] != "torch gloo")
    print(f"target: at most {TARGET_US:.0f} us per call on pyc10d; slowest: {worst:.2f} us")
    path = write_result(args.out, "percall", {"target_us": TARGET_US, "rows": rows})
    print(f"wrote {path}")
    bad = [f"{r['backend']} {r['op']}: {r['counted']} of {r['calls']} calls counted"
           for r in rows if not r["all_counted"]]
    for line in bad:
        print("WRONG", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
