"""The per-rank body of a benchmark job; started by the driver through ``pyc10d.run``.

``python -m pyc10d.run --nproc-per-node N -m pyc10d.bench.worker --backend gloo --ops
all_reduce --sizes 8,1024 --iters 20 --out result.json``; for a threaded backend the driver
starts one worker with ``--world-size N`` instead, whose ranks are N threads.

Every rank joins the group over ``env://``; for each op and size it builds K sets of float32
buffers (``--dtype bfloat16``: bfloat16), and times loops of K calls back to back (``--mode
loop``, the default), K calls each after a barrier (``--mode barrier``), or K calls issued with ``async_op=True`` back to
back and then every Work waited (``--mode async``: DDP's buckets, FSDP's prefetches, a
pipeline's sends), or K calls each after a millisecond of the caller's own busy work, that
millisecond taken off (``--mode spaced``: a call as a training step makes it, its caches
cold; ``timing.spaced``); every loop starts from poisoned outputs and fresh
inputs (see ``Op``), and every timed call's result is checked against values computed
locally. Each loop's time per op is reduced with MAX over the ranks (the op is done when its
slowest rank is), and rank 0 writes one record per (op, size) with the median, mean and min
over loops to ``--out``.
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

from pyc10d.bench import metrics, timing


def load_backend(name: str) -> tuple[ModuleType, str]:
    """``'pyc10d-tcp'`` -> (pyc10d, 'tcp'); ``'gloo'`` or ``'torch-X'`` -> (torch.distributed, ...)."""
    if name.startswith("pyc10d-"):
        return importlib.import_module("pyc10d"), name[len("pyc10d-"):]
    if name.startswith("torch-"):
        return importlib.import_module("torch.distributed"), name[len("torch-"):]
    if name == "gloo":
        return importlib.import_module("torch.distributed"), "gloo"
    raise ValueError(f"unknown backend {name!r}: use pyc10d-<name>, gloo or torch-<name>")


class Op:
    """One op over ``count`` elements of ``dtype``, on ``k`` buffer sets of its own: call ``run(i)``
    for i < k, then ``check()`` tells whether every one of those calls gave the right answer.
    ``reset()``, outside any timing, starts a loop from scratch: every output is poisoned
    with NaN (which equals nothing, so an output a call left unwritten fails the check) and
    every input gets its rank's values back (in-place ops overwrite them; a call that did
    nothing leaves those values, which are not the result at world size 2 and up)."""

    def __init__(self, dist: ModuleType, op: str, count: int, rank: int, n: int, k: int,
                 async_op: bool = False, dtype: torch.dtype = torch.float32) -> None:
        self.run, self.check, self.reset = _make(dist, op, count, rank, n, k, async_op, dtype)


POISON = float("nan")

#: torch 2.13 renamed two collectives (``*_single``); the old names warn at every call (a
#: FutureWarning through ``warnings``: ~20 us of an 8-byte call through torch.distributed on
#: this VM, a diagnostic), so a module that has the new name is timed through it (pyc10d
#: has both spellings of one function). The tables keep the old names.
CURRENT_NAMES = {"all_gather_into_tensor": "all_gather_single", "reduce_scatter_tensor": "reduce_scatter_single"}


def function_name(dist: ModuleType, op: str) -> str:
    """The attribute of ``dist`` that ``_make`` calls for ``op``."""
    new = CURRENT_NAMES.get(op)
    return new if new is not None and hasattr(dist, new) else op


def _make(dist: ModuleType, op: str, count: int, rank: int, n: int, k: int, async_op: bool = False,
          dtype: torch.dtype = torch.float32) -> tuple[Callable[[int], Any], Callable[[], bool], Callable[[], None]]:
    # Every value below is an integer of at most n * n: exact in bfloat16 too while n is at
    # most ``metrics.BFLOAT16_MAX_WORLD`` (the driver refuses larger groups).
    kw = {"async_op": True} if async_op else {}  # (loop and barrier calls pass nothing extra)
    total = n * (n + 1) / 2  # sum over ranks of (rank + 1)
    mine = float(rank + 1)
    if op in ("all_reduce", "reduce", "broadcast"):
        bufs = [torch.full((count,), mine, dtype=dtype) for _ in range(k)]
        if op == "all_reduce":
            def run(i: int) -> Any:
                return dist.all_reduce(bufs[i], **kw)
            want = total
        elif op == "reduce":
            def run(i: int) -> Any:
                return dist.reduce(bufs[i], dst=0, **kw)
            want = total if rank == 0 else mine  # torch leaves a non-root's tensor alone
        else:
            def run(i: int) -> Any:
                return dist.broadcast(bufs[i], src=0, **kw)
            want = 1.0

        def reset() -> None:  # the buffer is input and output: its input is the poison
            for b in bufs:
                b.fill_(mine)

        return run, (lambda: all(bool((b == want).all()) for b in bufs)), reset
    part = count // n
    outs = [torch.full((count if op != "reduce_scatter_tensor" else part,), POISON, dtype=dtype)
            for _ in range(k)]

    def poison() -> None:
        for o in outs:
            o.fill_(POISON)

    call = getattr(dist, function_name(dist, op), None)
    if op == "all_gather_into_tensor":
        inp = torch.full((part,), mine, dtype=dtype)
        gathered = torch.arange(1, n + 1, dtype=dtype).repeat_interleave(part)
        return ((lambda i: call(outs[i], inp, **kw)),
                (lambda: all(torch.equal(o, gathered) for o in outs)), poison)
    if op == "reduce_scatter_tensor":
        inp = torch.full((count,), mine, dtype=dtype)
        return ((lambda i: call(outs[i], inp, **kw)),
                (lambda: all(bool((o == total).all()) for o in outs)), poison)
    if op == "all_to_all_single":
        # chunk j of rank r holds r*n + j; rank r receives chunk r of every rank j
        inp = (rank * n + torch.arange(n, dtype=dtype)).repeat_interleave(part)
        exchanged = (torch.arange(n, dtype=dtype) * n + rank).repeat_interleave(part)
        return ((lambda i: call(outs[i], inp, **kw)),
                (lambda: all(torch.equal(o, exchanged) for o in outs)), poison)
    raise ValueError(f"unknown op {op!r}")


def time_op(dist: ModuleType, op: Op, k: int, reps: int, mode: str) -> tuple[list[float], bool]:
    """Seconds per op, one figure per repetition, each the max over ranks; and whether every
    timed call gave the right answer.

    ``loop`` (the default, as training code calls collectives and nccl-tests times them):
    ``timing.back_to_back``: ``barrier(); t0; K ops back to back; (t1 - t0) / K``: ranks
    drifting apart costs what it costs. ``barrier``: a barrier before every op, each op
    timed alone (a second figure). ``spaced``: the loop of ``loop`` with ``timing.GAP_S`` of
    busy work before every op, less that gap per op. Every repetition starts from
    ``op.reset()`` (poisoned outputs, fresh inputs), untimed, and is checked after its loop.

    One untimed loop of K ops first (nccl-tests' warm-up iterations), for every backend: with
    a single warm-up call the first size of a job could read far above the next one while the
    job's ranks settled (shm all_reduce, n=2, two runs: 8 B 17.9 and 23.6 us, 32 B 14.5 and
    13.9 us; with the loop, 14.0 / 13.9 and 14.2 / 13.9).
    """
    body = _issue_then_wait(op.run, k) if mode == "async" else op.run
    if mode == "spaced":
        body = timing.spaced(body)
    for i in range(k):  # warm-up (every async Work waited); ``reset`` below restores the inputs
        body(i)
    times = torch.empty(reps, dtype=torch.float64)
    ok = True
    for r in range(reps):
        op.reset()
        if mode == "spaced":  # already the max over ranks
            times[r] = timing.per_call(timing.back_to_back(dist, body, k), timing.GAP_S)
        elif mode != "barrier":
            times[r] = timing.back_to_back(dist, body, k)
        else:
            total = 0.0
            for i in range(k):
                dist.barrier()
                t0 = time.perf_counter()
                op.run(i)
                total += time.perf_counter() - t0
            times[r] = total / k
        ok = op.check() and ok
    if mode == "barrier":
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return times.tolist(), ok


def _issue_then_wait(run: Callable[[int], Any], k: int) -> Callable[[int], None]:
    """The ``async`` loop's body: call ``i`` issues op ``i`` (``async_op=True``) and keeps its
    Work; the last call then waits for every one, so the loop's time covers them all."""
    works: list[Any] = []

    def body(i: int) -> None:
        work = run(i)
        if work is not None:  # (a call a test's saboteur dropped returns nothing to wait for)
            works.append(work)
        if i == k - 1:
            for w in works:
                w.wait()
            works.clear()

    return body


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
    if getattr(args, "start_at", 0.0):  # jobs started together time together (bench.placement)
        dist.barrier()
        time.sleep(max(0.0, args.start_at - time.time()))
    records: list[dict[str, Any]] = []
    itemsize, dtype = metrics.DTYPES[args.dtype], getattr(torch, args.dtype)
    try:
        for op in args.ops.split(","):
            for nbytes in (int(s) for s in args.sizes.split(",")):
                count = metrics.element_count(op, nbytes, n, itemsize)
                size = count * itemsize
                k, reps = metrics.loop_shape(size, args.iters)
                timed = Op(dist, op, count, rank, n, k, args.mode == "async", dtype)
                times, correct = time_op(dist, timed, k, reps, args.mode)
                ok = torch.tensor([1 if correct else 0], dtype=torch.int32)
                dist.all_reduce(ok, op=dist.ReduceOp.MIN)
                med = statistics.median(times)
                algbw, busbw = metrics.bandwidths(op, size, med, n)
                rec = {"kind": "collective", "backend": args.backend, "op": op, "mode": args.mode,
                       "world_size": n, "bytes": size, "count": count, "dtype": args.dtype,
                       "iters": k * reps, "ops_per_loop": k, "loops": reps, "time_us": med * 1e6,
                       "mean_us": statistics.fmean(times) * 1e6, "min_us": min(times) * 1e6,
                       "max_us": max(times) * 1e6,
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
    p.add_argument("--iters", type=int, default=30, help="timed ops per figure up to 1 MiB")
    p.add_argument("--mode", choices=timing.MODES, default="loop",
                   help="loop: K ops back to back per timing; barrier: a barrier before each op; "
                        "async: K async ops, then every Work waited; spaced: 1 ms of busy work before each op")
    p.add_argument("--dtype", choices=list(metrics.DTYPES), default="float32", help="element type")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes its records to")
    p.add_argument("--start-at", type=float, default=0.0,
                   help="wall-clock time (time.time()) to start timing at: jobs run side by side")
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
