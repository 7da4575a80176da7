"""Start-up cost: ``init_process_group`` + the first ``all_reduce``, pyc10d tcp vs torch Gloo.

``python -m pyc10d.bench.startup`` launches ``--world-size`` (16) processes on this host with
``python -m pyc10d.run`` (env:// rendezvous: rank 0 serves the TCPStore), once per backend
per round, the backends alternating. Each rank imports torch and its library first, so the
figures leave interpreter start and imports out; it then stamps the wall clock
(``CLOCK_REALTIME``, shared by the processes of one host) before ``init_process_group``,
after it, and after a first one-element ``all_reduce``.

Processes start at different moments, so the figure is measured from the *last* rank's
entry into ``init_process_group`` (the earliest moment the group can form) to the last
rank's return from the first all_reduce: ``span_s``, split into ``init_s`` (to the last
return from ``init_process_group``) and ``first_all_reduce_s``. The median over rounds is
reported. Writes ``<out>/startup-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyc10d.bench.launch import run_worker
from pyc10d.bench.report import finish

BACKENDS = ("pyc10d-tcp", "gloo")


def _worker(args: argparse.Namespace) -> None:
    import torch

    if args.backend == "gloo":
        import torch.distributed as dist

        backend = "gloo"
    else:
        import pyc10d as dist  # type: ignore[no-redef]

        backend = args.backend.removeprefix("pyc10d-")
    torch.set_num_threads(1)
    t_start = time.time()
    dist.init_process_group(backend=backend, init_method="env://")
    t_init = time.time()
    x = torch.ones(1)
    dist.all_reduce(x)
    t_done = time.time()
    n = dist.get_world_size()
    stamps: list[Any] = [None] * n
    dist.all_gather_object(stamps, (t_start, t_init, t_done, float(x[0]) == n))
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(stamps))
    dist.destroy_process_group()


def summarize(backend: str, stamps: list[list[Any]]) -> dict[str, Any]:
    """One round's figures from every rank's (start, init done, all_reduce done, correct)."""
    last_in = max(s[0] for s in stamps)
    return {"backend": backend, "world_size": len(stamps),
            "init_s": max(s[1] for s in stamps) - last_in,
            "first_all_reduce_s": max(s[2] for s in stamps) - max(s[1] for s in stamps),
            "span_s": max(s[2] for s in stamps) - last_in,
            "per_rank_s": [s[2] - s[0] for s in stamps],
            "correct": all(s[3] for s in stamps)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="pyc10d-tcp")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--world-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    runs: list[dict[str, Any]] = []
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for backend in args.backends.split(","):
                got = run_worker("pyc10d.bench.startup", args.world_size, ["--backend", backend],
                                 Path(tmp) / f"{backend}-{r}.json", 600)
                if isinstance(got, str):
                    problems.append(f"{backend} round {r}: {got}")
                    continue
                rec = summarize(backend, got)
                print(f"round {r} {backend:11} init {rec['init_s']:.3f} s  first all_reduce "
                      f"{rec['first_all_reduce_s']:.3f} s  span {rec['span_s']:.3f} s", flush=True)
                runs.append(rec)
                if not rec["correct"]:
                    problems.append(f"{backend} round {r}: wrong all_reduce result")
    print(f"\nworld size {args.world_size}, median of {args.rounds} rounds (seconds, from the last "
          "rank entering init_process_group)")
    print("| backend | init_process_group | first all_reduce | total |")
    print("| --- | ---: | ---: | ---: |")
    medians = []
    for backend in args.backends.split(","):
        rs = [r for r in runs if r["backend"] == backend]
        if not rs:
            continue
        m = {k: statistics.median(r[k] for r in rs) for k in ("init_s", "first_all_reduce_s", "span_s")}
        medians.append({"backend": backend, **m})
        print(f"| {backend} | {m['init_s']:.3f} | {m['first_all_reduce_s']:.3f} | {m['span_s']:.3f} |")
    payload = {"world_size": args.world_size, "medians": medians, "runs": runs, "problems": problems}
    return finish(args.out, "startup", payload, problems)


if __name__ == "__main__":
    sys.exit(main())
