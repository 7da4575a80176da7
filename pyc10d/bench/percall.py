"""Per-call overhead: world size 1, where no byte moves and only the call itself costs.

``python -m pyc10d.bench.percall`` times ``all_reduce`` (8 B), ``broadcast`` (8 B) and
``barrier`` in one process of world size 1 on each pyc10d backend and on torch.distributed's
Gloo, back to back (K calls / K; the best and the median of ``--reps`` loops), and checks
each result (a tensor left as it was). Target: at most 8 us per call on pyc10d. Writes
``<out>/percall-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

TARGET_US = 8.0
OPS = ("all_reduce", "broadcast", "barrier")


def _time(fn: Any, k: int, reps: int) -> list[float]:
    for _ in range(min(k, 1000)):  # warm: caches, the recorder's ring
        fn()
    loops = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        loops.append((time.perf_counter() - t0) / k * 1e6)
    return loops


def _measure(dist: Any, backend: str, k: int, reps: int) -> list[dict[str, Any]]:
    import torch

    store = dist.HashStore()
    dist.init_process_group(backend=backend, store=store, rank=0, world_size=1)
    x = torch.tensor([1.0, 2.0])
    calls = {"all_reduce": lambda: dist.all_reduce(x), "broadcast": lambda: dist.broadcast(x, 0),
             "barrier": lambda: dist.barrier()}
    rows = []
    try:
        for op in OPS:
            loops = _time(calls[op], k, reps)
            rows.append({"backend": backend, "op": op, "best_us": min(loops), "median_us": statistics.median(loops),
                         "loops_us": loops, "correct": torch.equal(x, torch.tensor([1.0, 2.0]))})
    finally:
        dist.destroy_process_group()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyc10d.bench.percall", description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="tcp,shm,threaded")
    ap.add_argument("--iters", type=int, default=20000)
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
    gloo = _measure(tdist, "gloo", max(100, args.iters // 20), args.reps)
    for r in gloo:
        r["backend"] = "torch gloo"
    rows += gloo
    ref = {r["op"]: r["median_us"] for r in gloo}
    print("per call at world size 1 (us; median of loops, best in brackets), vs torch gloo")
    print(f"{'backend':>11} " + " ".join(f"{op:>22}" for op in OPS))
    for backend in dict.fromkeys(r["backend"] for r in rows):
        cells = []
        for op in OPS:
            r = next(r for r in rows if (r["backend"], r["op"]) == (backend, op))
            mark = "" if r["correct"] else " WRONG"
            cells.append(f"{r['median_us']:7.2f} ({r['best_us']:6.2f}) {r['median_us'] / ref[op]:5.3f}x{mark}")
        print(f"{backend:>11} " + " ".join(f"{c:>22}" for c in cells))
    worst = max(r["median_us"] for r in rows if r["backend"] != "torch gloo")
    print(f"target: at most {TARGET_US:.0f} us per call on pyc10d; slowest: {worst:.2f} us")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"percall-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"target_us": TARGET_US, "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
