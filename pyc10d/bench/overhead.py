"""What failure detection costs: desync fingerprints and the flight recorder, on vs off.

``python -m pyc10d.bench.overhead`` runs, for each backend, jobs of ``--world-size`` ranks
with both features on (the default) and both off (``PYC10D_DESYNC_CHECK=0``,
``PYC10D_FLIGHT_RECORDER_ENTRIES=0``), alternating on/off for ``--rounds`` rounds so that
the machine's drift hits both alike. Each job times ``all_reduce`` back to back (a loop of K
calls / K, the maximum over ranks, the median of ``--reps`` loops) at 8 B and 64 MiB and
checks every result. The figure is the median over rounds; the overhead is on / off - 1.
Targets: at most 5% at 8 B and 1% at 64 MiB. Writes ``<out>/overhead-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyc10d.bench.funcol import _loop_time
from pyc10d.bench.launch import run_worker

CONFIGS = {
    "on": {"PYC10D_DESYNC_CHECK": "1", "PYC10D_FLIGHT_RECORDER_ENTRIES": "2000"},
    "off": {"PYC10D_DESYNC_CHECK": "0", "PYC10D_FLIGHT_RECORDER_ENTRIES": "0"},
}
TARGET = {8: 0.05, 64 << 20: 0.01}


def _worker(args: argparse.Namespace) -> None:
    import torch

    import pyc10d as dist

    torch.set_num_threads(1)
    dist.init_process_group(backend=args.backend, init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    total = n * (n + 1) / 2
    records = []
    for nbytes in args.sizes:
        count = max(1, nbytes // 4)
        k = 300 if nbytes <= 64 * 1024 else 6
        x = torch.full((count,), float(rank + 1))
        bufs = [x.clone() for _ in range(k)]

        def body(i: int, bufs: list[Any] = bufs) -> None:
            dist.all_reduce(bufs[i])

        body(0)
        times, ok = [], True
        for _ in range(args.reps):
            for b in bufs:
                b.copy_(x)
            times.append(_loop_time(dist, body, k, 1))
            ok = ok and all(bool((b == total).all()) for b in bufs)
        records.append({"bytes": count * 4, "time_us": statistics.median(times) * 1e6, "correct": ok})
    if rank == 0:
        Path(args.out).write_text(json.dumps(records))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="shm")
    ap.add_argument("--backends", default="shm,tcp")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 64 << 20])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    times: dict[tuple[str, str, int], list[float]] = {}
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            for rnd in range(args.rounds):
                for config in (("on", "off") if rnd % 2 == 0 else ("off", "on")):
                    out = Path(tmp) / f"{backend}-{config}-{rnd}.json"
                    got = run_worker("pyc10d.bench.overhead", args.world_size,
                                     ["--backend", backend, "--reps", str(args.reps), "--sizes",
                                      *map(str, args.sizes)], out, 300, env=CONFIGS[config])
                    if isinstance(got, str):
                        bad.append(f"{backend} {config}: {got}")
                        continue
                    for r in got:
                        times.setdefault((backend, config, r["bytes"]), []).append(r["time_us"])
                        if not r["correct"]:
                            bad.append(f"{backend} {config} {r['bytes']} B: wrong result")
    rows = []
    print(f"all_reduce back to back, world size {args.world_size}, median of {args.rounds} rounds")
    print(f"{'backend':8} {'bytes':>10} {'on us':>10} {'off us':>10} {'overhead':>9} {'target':>7}")
    for (backend, config, nbytes), values in sorted(times.items()):
        if config != "on" or (backend, "off", nbytes) not in times:
            continue
        on, off = statistics.median(values), statistics.median(times[(backend, "off", nbytes)])
        target = TARGET.get(nbytes)
        rows.append({"backend": backend, "bytes": nbytes, "on_us": on, "off_us": off, "overhead": on / off - 1,
                     "target": target, "on_rounds_us": values, "off_rounds_us": times[(backend, "off", nbytes)]})
        print(f"{backend:8} {nbytes:>10} {on:>10.1f} {off:>10.1f} {100 * (on / off - 1):>8.1f}% "
              f"{'' if target is None else f'{100 * target:.0f}%':>7}")
    for line in bad:
        print("problem:", line)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(args.out) / f"overhead-{stamp}.json"
    path.write_text(json.dumps({"world_size": args.world_size, "rows": rows, "problems": bad}, indent=1))
    print(f"wrote {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
