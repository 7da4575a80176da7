"""Symmetric memory: all-reduce straight out of the peers' memory, and the fused matmuls.

``python -m pyc10d.bench.symm_mem [--world-sizes 2,4] [--mib 64]`` launches, per world size,
one pyc10d job on the shm backend and one torch job on Gloo (``pyc10d.run``, 127.0.0.1).
Every figure is the median over ``--reps`` loops of the slowest rank's time per call.

* all_reduce (AVG) of a ``--mib`` MiB float32 tensor: ``pyc10d.all_reduce`` of a tensor
  from ``empty_strided_p2p`` (which the shm backend reduces straight out of the peers'
  memory), of an ordinary one (the arena), and torch's Gloo ``all_reduce``.
* ``fused_all_gather_matmul`` and ``fused_matmul_reduce_scatter`` against their
  ``_fallback`` (functional collective, then matmul), sized so that the collective alone and
  the matmul alone take similar time. ``overlap`` is the share of the shorter of the two
  that the fused op hid: ``(t_comm + t_mm - t_fused) / min(t_comm, t_mm)``, clipped to
  [0, 1] (0: the fused op took as long as both in turn).

Prints a table and writes ``<out>/symm_mem-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyc10d.bench.launch import run_worker
from pyc10d.bench.timing import back_to_back


def _times(dist: Any, fns: dict[str, Callable[[], Any]], k: int, reps: int) -> dict[str, float]:
    """Per name: median over ``reps`` of (``k`` calls of ``fn``) / k, the slowest rank's
    (seconds). The functions take turns within each round, so load from elsewhere on the
    host hits them alike."""
    for fn in fns.values():
        fn()  # warm-up
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            out[name].append(back_to_back(dist, lambda i, fn=fn: fn(), k))
    return {name: statistics.median(v) for name, v in out.items()}


def _overlap(t_comm: float, t_mm: float, t_fused: float) -> float:
    return min(1.0, max(0.0, (t_comm + t_mm - t_fused) / min(t_comm, t_mm)))


def _pyc10d_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import pyc10d as dist
    import pyc10d.functional as ft_c
    import pyc10d.symmetric_memory as symm

    dist.init_process_group(backend="shm", init_method="env://")
    n, rank, g = dist.get_world_size(), dist.get_rank(), "0"
    symm.enable_symm_mem_for_group(g)
    numel = args.mib * (1 << 20) // 4
    rec: dict[str, Any] = {"world_size": n}

    # AVG keeps the values where they are after the first call ((n + 1) / 2 everywhere), so
    # every timed call works on finite numbers and every result can be checked; SUM would
    # double them each call and time arithmetic on infinities.
    want = (n + 1) / 2
    plain = torch.full((numel,), float(rank + 1))
    sym = symm.empty_strided_p2p((numel,), (1,), torch.float32, "cpu", g)
    sym.fill_(float(rank + 1))
    ar = _times(dist, {"symm": lambda: dist.all_reduce(sym, op=dist.ReduceOp.AVG),
                       "shm": lambda: dist.all_reduce(plain, op=dist.ReduceOp.AVG)}, 1, args.reps)
    for what, t in (("symmetric", sym), ("shm", plain)):
        if not bool((t == want).all()):
            raise AssertionError(f"{what} all_reduce gave a wrong result")
    rec["allreduce_symm_ms"], rec["allreduce_shm_ms"] = 1e3 * ar["symm"], 1e3 * ar["shm"]

    torch.manual_seed(rank)
    rows, k_dim, n_dim = args.ag_shape
    a_shard = torch.rand(rows // n, k_dim)
    bs = [torch.rand(k_dim, n_dim)]
    gathered = ft_c.wait_tensor(ft_c.all_gather_tensor(a_shard, 0, g))
    ag = _times(dist, {
        "comm": lambda: ft_c.wait_tensor(ft_c.all_gather_tensor(a_shard, 0, g)),
        "mm": lambda: [torch.matmul(gathered, b) for b in bs],
        "fallback": lambda: symm._fused_all_gather_matmul_fallback(a_shard, bs, 0, g),
        "fused": lambda: symm.fused_all_gather_matmul(a_shard, bs, 0, g),
    }, 3, args.reps)
    rows, k_dim, n_dim = args.rs_shape
    a, b = torch.rand(rows, k_dim), torch.rand(k_dim, n_dim)
    product = a @ b
    rs = _times(dist, {
        "comm": lambda: ft_c.wait_tensor(ft_c.reduce_scatter_tensor(product, "sum", 0, g)),
        "mm": lambda: a @ b,
        "fallback": lambda: symm._fused_matmul_reduce_scatter_fallback(a, b, "sum", 0, g),
        "fused": lambda: symm.fused_matmul_reduce_scatter(a, b, "sum", 0, g),
    }, 3, args.reps)
    for name, d in (("ag_mm", ag), ("mm_rs", rs)):
        for key, value in d.items():
            rec[f"{name}_{key}_ms"] = 1e3 * value
        rec[f"{name}_overlap"] = _overlap(d["comm"], d["mm"], d["fused"])
        rec[f"{name}_speedup"] = d["fallback"] / d["fused"]
    dist.destroy_process_group()
    return rec


def _gloo_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="gloo", init_method="env://")
    # Gloo has no AVG: SUM of zeros stays finite (and checkable) however often it runs
    plain = torch.zeros(args.mib * (1 << 20) // 4)
    ms = 1e3 * _times(dist, {"gloo": lambda: dist.all_reduce(plain)}, 1, args.reps)["gloo"]
    if not bool((plain == 0).all()):
        raise AssertionError("gloo all_reduce gave a wrong result")
    rec = {"world_size": dist.get_world_size(), "allreduce_gloo_ms": ms}
    dist.destroy_process_group()
    return rec


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    rec = _gloo_worker(args) if args.impl == "torch-gloo" else _pyc10d_worker(args)
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.out).write_text(json.dumps(rec))


# ----------------------------------------------------------------------------- driver
def _run_job(impl: str, world: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any] | str:
    worker_args = ["--impl", impl, "--reps", str(args.reps), "--mib", str(args.mib),
                   "--ag-shape", ",".join(map(str, args.ag_shape)), "--rs-shape", ",".join(map(str, args.rs_shape))]
    return run_worker("pyc10d.bench.symm_mem", world, worker_args, workdir / f"{impl}-{world}.json", args.timeout)


def _shape(text: str) -> tuple[int, int, int]:
    rows, k, n = (int(x) for x in text.split(","))
    return rows, k, n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="symmetric memory: all_reduce and fused matmuls")
    p.add_argument("--world-sizes", default="2,4")
    p.add_argument("--mib", type=int, default=64, help="all_reduce size in MiB")
    # Shapes where the collective alone and the matmul alone take similar time: the
    # all-gather moves K floats per row against 2KN flops, the reduce-scatter N per 2KN.
    p.add_argument("--ag-shape", type=_shape, default=(8192, 512, 16), help="rows,K,N of A @ B")
    p.add_argument("--rs-shape", type=_shape, default=(8192, 32, 512), help="rows,K,N of A @ B")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-gloo", action="store_true")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="pyc10d-shm", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _table(records: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = [f"all_reduce of {args.mib} MiB float32 (ms; ratio = shm or gloo time / symmetric time)",
             f"{'n':>3}{'symm':>10}{'shm':>10}{'gloo':>10}{'vs shm':>9}{'vs gloo':>9}"]
    for r in records:
        gloo = r.get("allreduce_gloo_ms", float("nan"))
        lines.append(f"{r['world_size']:>3}{r['allreduce_symm_ms']:>10.1f}{r['allreduce_shm_ms']:>10.1f}"
                     f"{gloo:>10.1f}{r['allreduce_shm_ms'] / r['allreduce_symm_ms']:>8.2f}x"
                     f"{gloo / r['allreduce_symm_ms']:>8.2f}x")
    ag, rs = ("x".join(map(str, shape)) for shape in (args.ag_shape, args.rs_shape))
    lines.append(f"\nfused ops (ms), rows x K x N: ag_mm {ag}, mm_rs {rs}; comm and mm alone, then both")
    lines.append(f"{'op':<8}{'n':>3}{'comm':>9}{'mm':>9}{'fallback':>10}{'fused':>9}{'speedup':>9}{'overlap':>9}")
    for r in records:
        for op in ("ag_mm", "mm_rs"):
            lines.append(f"{op:<8}{r['world_size']:>3}{r[op + '_comm_ms']:>9.2f}{r[op + '_mm_ms']:>9.2f}"
                         f"{r[op + '_fallback_ms']:>10.2f}{r[op + '_fused_ms']:>9.2f}"
                         f"{r[op + '_speedup']:>8.2f}x{r[op + '_overlap']:>9.0%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    records, failures = [], []
    with tempfile.TemporaryDirectory(prefix="pyc10d-symm-bench-") as tmp:
        for world in [int(w) for w in args.world_sizes.split(",")]:
            rec = _run_job("pyc10d-shm", world, args, Path(tmp))
            if isinstance(rec, str):
                failures.append(f"pyc10d-shm x{world}: {rec}")
                continue
            if not args.no_gloo:
                gloo = _run_job("torch-gloo", world, args, Path(tmp))
                if isinstance(gloo, str):
                    failures.append(f"torch-gloo x{world}: {gloo}")
                else:
                    rec["allreduce_gloo_ms"] = gloo["allreduce_gloo_ms"]
            records.append(rec)
    print("\n".join(_table(records, args)))
    for f in failures:
        print("FAILED", f)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"symm_mem-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k not in ("worker", "impl")},
                                "records": records, "failures": failures}, indent=1))
    print(f"wrote {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
