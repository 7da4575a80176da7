"""Functional collectives vs the in-place API, and the overlap AsyncCollectiveTensor gives.

``python -m pyc10d.bench.funcol`` launches, for each backend, one job of ``--world-size``
ranks (``pyc10d.run``); every rank times, in the same processes and back to back:

* ``pyc10d.all_reduce(t)`` (in place, SUM) and ``pyc10d.functional.all_reduce`` followed by
  ``wait_tensor``, at each size: a loop of K operations divided by K, the maximum over the
  ranks, the median of ``--reps`` loops. The functional op is timed twice: as configured by
  default on this host (``functional``: where ranks leave no core for a progress thread, every
  size runs inline, see ``pyc10d.functional._eager``) and forced asynchronous above 16 KiB
  (``functional-async``, what a host with spare cores gets). The APIs' loops alternate, and
  ``ratio`` is the median of the ratios of adjacent loops: on a shared machine load drifts,
  and a ratio of two loops a few milliseconds apart sees the least of it. Every timed result
  is checked after its loop: each op of a loop writes a tensor of its own, poisoned with NaN
  before the loop, and each functional call of the run reduces an input whose sum no other
  call has, so an output no call wrote, or an earlier call's, fails the check.
* overlap (asynchronous functional all_reduce): a matmul alone (sized to take about as long
  as the collective), the all_reduce alone, and the all_reduce started, the matmul run, then
  the result used. The hidden share is ``(t_comm + t_matmul - t_both) / min(t_comm, t_matmul)``.

Prints a table and writes ``<out>/funcol-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyc10d.bench import metrics
from pyc10d.bench.launch import run_worker
from pyc10d.bench.report import write_result
from pyc10d.bench.timing import back_to_back


def _loop_time(dist: Any, body: Any, k: int, reps: int) -> float:
    """Median over ``reps`` of (K back-to-back calls of ``body(i)``) / K, max over ranks (s)."""
    return statistics.median(back_to_back(dist, body, k) for _ in range(reps))


def _worker(args: argparse.Namespace) -> None:
    import torch

    import pyc10d as dist
    import pyc10d.functional as ft_c
    from pyc10d.functional import _eager

    torch.set_num_threads(1)
    dist.init_process_group(backend=args.backend, init_method="env://")
    rank, n, group = dist.get_rank(), dist.get_world_size(), dist.group.WORLD
    total = n * (n + 1) / 2
    records: list[dict[str, Any]] = []
    for nbytes in args.sizes:
        count = max(1, nbytes // 4)
        k = args.iters if nbytes <= 64 * 1024 else max(10, args.iters // 10)
        x = torch.full((count,), float(rank + 1))
        bufs = [x.clone() for _ in range(k)]
        # the functional calls' inputs: call i of loop r gets (rank + 1) * m, m = r * k + i + 1,
        # so every call of the run has a result of its own and an output left over from an
        # earlier call (a recycled buffer nothing wrote) fails the check
        ins = [torch.empty(count) for _ in range(k)]
        outs: list[Any] = [None] * k
        mult = [0.0] * k

        def inplace(i: int, bufs: list[Any] = bufs) -> None:
            dist.all_reduce(bufs[i])

        def functional(i: int, outs: list[Any] = outs, ins: list[Any] = ins) -> None:
            outs[i] = ft_c.wait_tensor(ft_c.all_reduce(ins[i], "sum", group))

        def functional_async(i: int, configured: int | None = _eager.INLINE_BYTES) -> None:
            _eager.INLINE_BYTES = _eager.DEFAULT_INLINE_BYTES
            try:
                functional(i)
            finally:
                _eager.INLINE_BYTES = configured

        apis = (("in-place", inplace), ("functional", functional), ("functional-async", functional_async))
        times: dict[str, list[float]] = {name: [] for name, _ in apis}
        ok = {name: True for name, _ in apis}
        for _, body in apis:
            ins[0].copy_(x)
            body(0)  # warm-up
        loop = 0
        for _ in range(args.reps):  # the two APIs take turns, so drifting load hits both alike
            for name, body in apis:
                loop += 1
                for i, b in enumerate(bufs):  # untimed: fresh inputs, poisoned outputs
                    b.copy_(x)
                    mult[i] = float((loop - 1) * k + i + 1)
                    ins[i].fill_((rank + 1) * mult[i])
                outs[:] = [torch.full((count,), float("nan")) for _ in range(k)]
                times[name].append(_loop_time(dist, body, k, 1))
                if name == "in-place":
                    good = all(bool((b == total).all()) for b in bufs)
                else:
                    good = all(bool((o == total * m).all()) for o, m in zip(outs, mult))
                ok[name] = ok[name] and good
                outs[:] = [None] * k
        for name, _ in apis:
            ratios = [f / i for i, f in zip(times["in-place"], times[name])]
            records.append({"kind": "funcol", "backend": args.backend, "world_size": n, "api": name,
                            "bytes": count * 4, "time_us": statistics.median(times[name]) * 1e6,
                            "correct": ok[name], "iters": k, "reps": args.reps,
                            "paired_ratio": statistics.median(ratios), "inline_limit": _eager.inline_limit()})
    _eager.INLINE_BYTES = _eager.DEFAULT_INLINE_BYTES  # the overlap is the asynchronous path's
    records += _overlap(dist, ft_c, args, rank, n, group)
    if rank == 0:
        Path(args.out).write_text(json.dumps(records))
    dist.destroy_process_group()


def _overlap(dist: Any, ft_c: Any, args: argparse.Namespace, rank: int, n: int, group: Any) -> list[dict[str, Any]]:
    import torch

    count = args.overlap_bytes // 4
    total = n * (n + 1) / 2
    # Inputs taken in turn, each with a result of its own (total * (j + 1)): a call that
    # returned an earlier call's output fails the check. Every result is checked in full
    # after its loop, outside the timing.
    ring = [torch.full((count,), float((rank + 1) * (j + 1))) for j in range(5)]
    turn = [0]
    results: list[tuple[Any, float]] = []

    def comm() -> tuple[Any, float]:
        j = turn[0] % len(ring)
        turn[0] += 1
        return ft_c.all_reduce(ring[j], "sum", group), total * (j + 1)

    def t_of(fn: Any, keep: bool = False) -> float:
        fn()
        loops = []
        for _ in range(args.reps):
            results.clear()
            loops.append(back_to_back(dist, lambda i: fn(), 5))
            if keep:
                checked.extend(bool((y == want).all()) for y, want in results)
        results.clear()
        return statistics.median(loops)

    checked: list[bool] = []

    def comm_alone() -> None:
        y, want = comm()
        results.append((ft_c.wait_tensor(y), want))

    t_comm = t_of(comm_alone, keep=True)
    # a square matmul that takes about as long as the collective (same size on every rank)
    m = 64
    a = torch.randn(m, m)
    t_mm = t_of(lambda: a @ a)
    while t_mm < t_comm and m < 4096:
        m = int(m * 1.25) + 1
        a = torch.randn(m, m)
        t_mm = t_of(lambda a=a: a @ a)
    dims = torch.tensor([m])
    dist.all_reduce(dims, op=dist.ReduceOp.MAX)
    a = torch.randn(int(dims), int(dims))
    t_mm = t_of(lambda: a @ a)

    def both() -> None:
        y, want = comm()
        _ = a @ a
        results.append((ft_c.wait_tensor(y), want))  # the result used

    t_both = t_of(both, keep=True)
    ok = bool(checked) and all(checked)
    hidden = (t_comm + t_mm - t_both) / min(t_comm, t_mm)
    return [{"kind": "overlap", "backend": args.backend, "world_size": n, "bytes": count * 4,
             "matmul_n": int(dims), "comm_us": t_comm * 1e6, "matmul_us": t_mm * 1e6,
             "both_us": t_both * 1e6, "hidden": hidden, "correct": ok}]


def _print(records: list[dict[str, Any]]) -> None:
    rows = [r for r in records if r["kind"] == "funcol"]
    print("\nfunctional all_reduce + wait_tensor vs in-place all_reduce (back to back, max over ranks);"
          "\nfunctional: as configured on this host; async: forced asynchronous above 16 KiB")
    print(f"{'backend':>10} {'n':>2} {'size':>8} {'in-place us':>12} {'functional us':>14} {'ratio':>6} "
          f"{'async us':>9} {'ratio':>6} ok  (inline up to)")
    keys = sorted({(r["backend"], r["world_size"], r["bytes"]) for r in rows})
    for b, n, nb in keys:
        inpl, func, fasync = (next(r for r in rows if (r["backend"], r["world_size"], r["bytes"], r["api"]) == (b, n, nb, a))
                              for a in ("in-place", "functional", "functional-async"))
        ok = "yes" if inpl["correct"] and func["correct"] and fasync["correct"] else "NO"
        limit = func["inline_limit"]
        limit_text = "any size" if limit >= 1 << 60 else metrics.format_size(limit)
        print(f"{b:>10} {n:>2} {metrics.format_size(nb):>8} {inpl['time_us']:>12.1f} {func['time_us']:>14.1f} "
              f"{func['paired_ratio']:>5.2f}x {fasync['time_us']:>9.1f} {fasync['paired_ratio']:>5.2f}x {ok}   ({limit_text})")
    print("\noverlap: functional all_reduce started, a matmul, then the result used")
    print(f"{'backend':>10} {'n':>2} {'size':>8} {'comm us':>9} {'matmul us':>10} {'both us':>9} {'hidden':>7} ok")
    for r in (r for r in records if r["kind"] == "overlap"):
        print(f"{r['backend']:>10} {r['world_size']:>2} {metrics.format_size(r['bytes']):>8} {r['comm_us']:>9.0f} "
              f"{r['matmul_us']:>10.0f} {r['both_us']:>9.0f} {100 * r['hidden']:>6.0f}% "
              f"{'yes' if r['correct'] else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pyc10d.bench.funcol", description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="shm,tcp")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--sizes", type=lambda s: [metrics.parse_size(x) for x in s.split(",")], default=[8, metrics.MIB])
    p.add_argument("--overlap-bytes", type=metrics.parse_size, default=4 * metrics.MIB)
    p.add_argument("--iters", type=int, default=200, help="ops per timed loop up to 64 KiB (a tenth above)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    records: list[dict[str, Any]] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="pyc10d-funcol-") as tmp:
        for backend in args.backends.split(","):
            print(f"== {backend}, world size {args.world_size} ==", flush=True)
            worker_args = ["--backend", backend, "--sizes", ",".join(map(str, args.sizes)),
                           "--overlap-bytes", str(args.overlap_bytes), "--iters", str(args.iters),
                           "--reps", str(args.reps)]
            res = run_worker("pyc10d.bench.funcol", args.world_size, worker_args, Path(tmp) / f"{backend}.json", 900)
            if isinstance(res, str):
                failed = True
                print(f"   {backend} FAILED ({res})")
                continue
            records += res
    _print(records)
    failed = failed or not all(r["correct"] for r in records)
    path = write_result(args.out, "funcol", records)
    print(f"\nwrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
