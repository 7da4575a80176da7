"""The per-rank body of a benchmark job; started by the driver through ``pyc10d.run``.

``python -m pyc10d.run --nproc-per-node N -m pyc10d.bench.worker --backend gloo --ops
all_reduce --sizes 8,1024 --iters 20 --out result.json``; for a threaded backend the driver
starts one worker with ``--world-size N`` instead, whose ranks are N threads.

Every rank joins the group over ``env://``; for each op and size it builds float32 tensors,
checks the result of the first call against values computed locally, runs the warm-up
calls, then the timed ones: ``barrier(); t0; op; t1`` per iteration. The per-iteration times
are reduced with MAX over the ranks (the op is done when its slowest rank is), and rank 0
writes one record per (op, size) with the median, mean and min of those to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from pyc10d.bench import metrics


def load_backend(name: str) -> tuple[ModuleType, str]:
    """``'pyc10d-tcp'`` -> (pyc10d, 'tcp'); ``'gloo'`` or ``'torch-X'`` -> (torch.distributed, ...)."""
    if name.startswith("pyc10d-"):
        return importlib.import_module("pyc10d"), name[len("pyc10d-"):]
    if name.startswith("torch-"):
        return importlib.import_module("torch.distributed"), name[len("torch-"):]
    if name == "gloo":
        return importlib.import_module("torch.distributed"), "gloo"
    raise ValueError(f"unknown backend {name!r}: use pyc10d-<name>, gloo or torch-<name>")


def make_op(dist: ModuleType, op: str, count: int, rank: int, n: int
            ) -> tuple[Callable[[], Any], Callable[[], bool], Callable[[], None]]:
    """(run, check, reset) for one op over ``count`` float32 elements of full message.

    ``check`` tells whether the first ``run`` gave the right answer; ``reset`` zeroes the
    buffers that in-place ops keep accumulating into, so timing never meets inf/NaN.
    """
    total = n * (n + 1) / 2  # sum over ranks of (rank + 1)
    if op in ("all_reduce", "reduce"):
        t = torch.full((count,), float(rank + 1))
        if op == "all_reduce":
            def run() -> Any:
                return dist.all_reduce(t)
        else:
            def run() -> Any:
                return dist.reduce(t, dst=0)

        def check() -> bool:
            return (rank != 0 and op == "reduce") or bool((t == total).all())

        return run, check, t.zero_
    if op == "broadcast":
        t = torch.full((count,), float(rank + 1))
        return (lambda: dist.broadcast(t, src=0)), (lambda: bool((t == 1).all())), lambda: None
    part = count // n
    if op == "all_gather_into_tensor":
        inp, out = torch.full((part,), float(rank + 1)), torch.empty(count)
        want = torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(part)
        return ((lambda: dist.all_gather_into_tensor(out, inp)),
                (lambda: bool(torch.equal(out, want))), lambda: None)
    if op == "reduce_scatter_tensor":
        inp, out = torch.full((count,), float(rank + 1)), torch.empty(part)
        return ((lambda: dist.reduce_scatter_tensor(out, inp)),
                (lambda: bool((out == total).all())), lambda: None)
    if op == "all_to_all_single":
        # chunk j of rank r holds r*n + j; rank r receives chunk r of every rank j
        inp = (rank * n + torch.arange(n, dtype=torch.float32)).repeat_interleave(part)
        out = torch.empty(count)
        want = (torch.arange(n, dtype=torch.float32) * n + rank).repeat_interleave(part)
        return ((lambda: dist.all_to_all_single(out, inp)),
                (lambda: bool(torch.equal(out, want))), lambda: None)
    raise ValueError(f"unknown op {op!r}")


def time_op(dist: ModuleType, run: Callable[[], Any], warmup: int, iters: int) -> list[float]:
    """Per-iteration seconds, each the max over ranks of ``barrier(); t0; op; t1``."""
    for _ in range(warmup):
        run()
    times = torch.empty(iters, dtype=torch.float64)
    for i in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        run()
        times[i] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.tolist()


def in_threads(name: str) -> bool:
    """Backends whose ranks are threads of one worker process, not processes of their own."""
    return name == "pyc10d-threaded"


def bench(args: argparse.Namespace, init: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Run every (op, size) of this job; every rank returns the same records.

    ``init`` joins the group (default: ``init_process_group`` over ``env://``).
    """
    dist, backend = load_backend(args.backend)
    if init is None:
        dist.init_process_group(backend=backend, init_method="env://")
    else:
        init()
    rank, n = dist.get_rank(), dist.get_world_size()
    records: list[dict[str, Any]] = []
    try:
        for op in args.ops.split(","):
            for nbytes in (int(s) for s in args.sizes.split(",")):
                count = metrics.element_count(op, nbytes, n)
                size = count * metrics.DTYPE_BYTES
                warmup, iters = metrics.iterations(size, args.iters)
                run, check, reset = make_op(dist, op, count, rank, n)
                run()
                ok = torch.tensor([1 if check() else 0], dtype=torch.int32)
                dist.all_reduce(ok, op=dist.ReduceOp.MIN)
                reset()
                times = time_op(dist, run, warmup, iters)
                med = statistics.median(times)
                algbw, busbw = metrics.bandwidths(op, size, med, n)
                rec = {"kind": "collective", "backend": args.backend, "op": op,
                       "world_size": n, "bytes": size, "count": count, "dtype": "float32",
                       "iters": iters, "warmup": warmup, "time_us": med * 1e6,
                       "mean_us": statistics.fmean(times) * 1e6, "min_us": min(times) * 1e6,
                       "algbw_GBps": algbw, "busbw_GBps": busbw, "correct": bool(ok.item())}
                records.append(rec)
                if rank == 0:
                    flag = "" if rec["correct"] else "  WRONG RESULT"
                    print(f"  {args.backend:>12} n={n} {op:<22} {metrics.format_size(size):>7}"
                          f" {rec['time_us']:>11.1f} us {busbw:>9.3g} GB/s busbw{flag}",
                          flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return records


def bench_threads(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The whole job in this process: ``--world-size`` ranks as threads (threaded backend)."""
    dist, backend = load_backend(args.backend)
    store = dist.HashStore()
    results: dict[int, list[dict[str, Any]]] = {}
    errors: list[str] = []

    def rank_main(rank: int) -> None:
        def init() -> None:
            dist.init_process_group(backend=backend, store=store, rank=rank,
                                    world_size=args.world_size)
        try:
            results[rank] = bench(args, init)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(f"rank {rank}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"rank{r}")
               for r in range(args.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return results[0]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m pyc10d.bench.worker`` (one rank)."""
    p = argparse.ArgumentParser(prog="python -m pyc10d.bench.worker")
    p.add_argument("--backend", required=True)
    p.add_argument("--ops", required=True, help="comma-separated op names")
    p.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    p.add_argument("--iters", type=int, default=30, help="timed iterations up to 1 MiB")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes its records to")
    p.add_argument("--world-size", type=int, default=0,
                   help="ranks as threads of this process (threaded backends; no launcher)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    # torch 2.13 marks *_into_tensor / *_tensor deprecated; the names are still what we time
    warnings.filterwarnings("ignore", message=".*is deprecated", category=FutureWarning)
    records = bench_threads(args) if args.world_size > 0 else bench(args)
    if int(os.environ.get("RANK", "0")) == 0:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(records, f, indent=1)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
