"""What failure detection costs: desync fingerprints and the flight recorder, on vs off.

``python -m pyc10d.bench.overhead`` runs one job of ``--world-size`` ranks per backend. In
it, two groups span the same ranks: one as every group is by default (fingerprints and
flight recorder on), one with both off (what ``PYC10D_DESYNC_CHECK=0`` and
``PYC10D_FLIGHT_RECORDER_ENTRIES=0`` give a whole process). ``all_reduce`` is timed back to
back on each (a loop of K calls / K, the maximum over ranks) at 8 B and 64 MiB, the two
loops alternating for ``--pairs`` pairs (default 400 at 64 KiB and below, 100 above), and
every result is checked. Each group first runs
as many calls as the flight recorder keeps (its ring fills once; the figure is the steady
state).

The cost asked about is about a microsecond, well under the scheduler's noise when ranks
share cores, and the machine's speed drifts; a pair of adjacent loops sees the same
conditions, so the figure is the median over pairs of on / off - 1 (with the quartiles). The
pairs' ratios spread over ±5-10%, so a 1 us effect needs hundreds of pairs to show: with 30,
runs of one tree at 8 B ranged over several per cent.
Targets: at most 5% at 8 B and 1% at 64 MiB. Writes ``<out>/overhead-<time>.json``.

The profiler hooks (``algorithms/profiling.py``) cannot be turned off per group: with no
profiler running each is one read of torch's global flag. Their cost is reported as the
number of flag reads an 8 B call makes (counted: every module's reference to torch's
profiler module is swapped for a counting one for 100 calls) times the cost of one read
(timed in a loop of a million), against the call's time (target: under 2%).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyc10d import settings
from pyc10d.bench.launch import run_worker
from pyc10d.bench.report import finish
from pyc10d.bench.timing import back_to_back

TARGET = {8: 0.05, 64 << 20: 0.01}
PROFILER_TARGET = 0.02
#: The modules whose hooks read torch's profiler flag (``algorithms.profiling``).
_HOOKED = ("pyc10d.algorithms", "pyc10d.algorithms.comm", "pyc10d.algorithms.shm_comm",
           "pyc10d.backends.base", "pyc10d.backends.p2p")


class _CountingFlag:
    """Stands in for ``torch.autograd.profiler`` in the hooked modules: counts flag reads."""

    def __init__(self) -> None:
        self.reads = 0

    @property
    def _is_profiler_enabled(self) -> bool:
        self.reads += 1
        return False


def _profiler_hook_cost(dist: Any, buf: Any, calls: int = 100) -> tuple[float, float]:
    """(flag reads per all_reduce of ``buf``, ns per read) with no profiler running."""
    import importlib
    import timeit

    from torch.autograd import profiler as torch_profiler

    counter = _CountingFlag()
    mods = [importlib.import_module(m) for m in _HOOKED]
    for m in mods:
        m.torch_profiler = counter
    try:
        for _ in range(calls):
            dist.all_reduce(buf)
    finally:
        for m in mods:
            m.torch_profiler = torch_profiler
    # the hooks' own expression: a module global's attribute
    ns = min(timeit.repeat("p._is_profiler_enabled", globals={"p": torch_profiler}, number=1_000_000,
                           repeat=5)) * 1e3
    return counter.reads / calls, ns


def _features_off(group: Any) -> None:
    engine = group._get_backend()
    engine.desync_check = False
    engine.recorder = None
    engine.transport.watch_unexpected(engine.group_key, None)


def _loop(dist: Any, bufs: list[Any], group: Any) -> float:
    return back_to_back(dist, lambda i: dist.all_reduce(bufs[i], group=group), len(bufs), group)


def _worker(args: argparse.Namespace) -> None:
    import torch

    import pyc10d as dist
    from pyc10d.backends import flight_recorder

    torch.set_num_threads(1)
    dist.init_process_group(backend=args.backend, init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    if args.pin and hasattr(os, "sched_setaffinity"):  # a core per rank: less scheduler noise
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    groups = {"on": dist.new_group(list(range(n))), "off": dist.new_group(list(range(n)))}
    _features_off(groups["off"])
    if settings.OVERHEAD_AA.get():  # calibration: both groups without the features
        _features_off(groups["on"])
    # Steady state: the flight recorder's ring fills once (an allocation per call until it is
    # full, then none); a job runs far longer than that, so fill both groups' rings first.
    warm = torch.zeros(1)
    for g in groups.values():
        for _ in range(flight_recorder.capacity() + 100):
            dist.all_reduce(warm, group=g)
    total = n * (n + 1) / 2
    records = []
    for nbytes in args.sizes:
        count = max(1, nbytes // 4)
        k = 300 if nbytes <= 64 * 1024 else 4
        x = torch.full((count,), float(rank + 1))
        bufs = {name: [x.clone() for _ in range(k)] for name in groups}
        times: dict[str, list[float]] = {"on": [], "off": []}
        ok = True
        pairs = args.pairs or (400 if nbytes <= 64 * 1024 else 100)
        for i in range(pairs + 1):
            for name in (("on", "off") if i % 2 == 0 else ("off", "on")):
                for b in bufs[name]:
                    b.copy_(x)
                t = _loop(dist, bufs[name], groups[name])
                ok = ok and all(bool((b == total).all()) for b in bufs[name])
                if i:  # the first pair warms both groups up
                    times[name].append(t * 1e6)
        ratios = sorted(a / b - 1 for a, b in zip(times["on"], times["off"]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        records.append({"backend": args.backend, "bytes": count * 4, "on_us": statistics.median(times["on"]),
                        "off_us": statistics.median(times["off"]), "overhead": statistics.median(ratios),
                        "overhead_q1": q[0], "overhead_q3": q[2], "on_loops_us": times["on"],
                        "off_loops_us": times["off"], "iters": k, "pairs": pairs, "correct": ok})
    reads, ns = _profiler_hook_cost(dist, torch.zeros(2))
    records.append({"backend": args.backend, "profiler_reads_per_call": reads, "profiler_read_ns": ns})
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
    ap.add_argument("--pairs", type=int, default=0, help="pairs of loops per size (0: by size)")
    ap.add_argument("--pin", action="store_true", help="pin rank r to the r-th allowed CPU")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    rows: list[dict[str, Any]] = []
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            got = run_worker("pyc10d.bench.overhead", args.world_size,
                             ["--backend", backend, "--pairs", str(args.pairs), "--sizes", *map(str, args.sizes),
                              *(["--pin"] if args.pin else [])],
                             Path(tmp) / f"{backend}.json", 600)
            if isinstance(got, str):
                bad.append(f"{backend}: {got}")
                continue
            rows += got
            bad += [f"{r['backend']} {r['bytes']} B: wrong result" for r in got if not r.get("correct", True)]
    print(f"all_reduce back to back, world size {args.world_size}, features on vs off in one job, "
          f"median (quartiles) of {args.pairs or '400 (small) / 100 (large)'} adjacent pairs of loops")
    print(f"{'backend':8} {'bytes':>10} {'on us':>10} {'off us':>10} {'overhead':>9} {'quartiles':>17} {'target':>7}")
    hooks = [r for r in rows if "profiler_reads_per_call" in r]
    rows = [r for r in rows if "profiler_reads_per_call" not in r]
    for r in rows:
        target = TARGET.get(r["bytes"])
        print(f"{r['backend']:8} {r['bytes']:>10} {r['on_us']:>10.1f} {r['off_us']:>10.1f} "
              f"{100 * r['overhead']:>8.1f}% {100 * r['overhead_q1']:>7.1f}%..{100 * r['overhead_q3']:>5.1f}%"
              f" {'' if target is None else f'{100 * target:.0f}%':>7}")
    for h in hooks:  # the profiler hooks, off: flag reads x their cost, against the 8 B call
        call = next((r["off_us"] for r in rows if r["backend"] == h["backend"] and r["bytes"] == 8), None)
        cost_us = h["profiler_reads_per_call"] * h["profiler_read_ns"] / 1e3
        h["profiler_off_us"] = cost_us
        share = f"{100 * cost_us / call:.2f}% of the 8 B call" if call else "(no 8 B figure)"
        print(f"profiler hooks off, {h['backend']}: {h['profiler_reads_per_call']:.1f} flag reads per call x "
              f"{h['profiler_read_ns']:.0f} ns = {cost_us:.3f} us, {share} (target {100 * PROFILER_TARGET:.0f}%)")
    payload = {"world_size": args.world_size, "rows": rows, "profiler_hooks": hooks, "problems": bad}
    return finish(args.out, "overhead", payload, bad)


if __name__ == "__main__":
    sys.exit(main())
