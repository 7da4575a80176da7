"""Symmetric memory: all-reduce straight out of the peers' memory, and the fused matmuls.

``python -m pyc10d.bench.symm_mem [--world-sizes 2,4] [--mib 64]`` launches, per world size,
one pyc10d job on the shm backend and one torch job on Gloo (``pyc10d.run``, 127.0.0.1).
Every figure is the median over ``--reps`` loops of the slowest rank's time per call.

* all_reduce (AVG) of a ``--mib`` MiB float32 tensor: ``pyc10d.all_reduce`` of a tensor
  from ``empty_strided_p2p`` (which the shm backend reduces straight out of the peers'
  memory), of an ordinary one (the arena), and torch's Gloo ``all_reduce`` (SUM: Gloo has no
  AVG). One call a loop, its input refilled before it (untimed) and its result checked.
* ``fused_all_gather_matmul`` and ``fused_matmul_reduce_scatter`` against their
  ``_fallback`` (functional collective, then matmul), sized so that the collective alone and
  the matmul alone take similar time. ``overlap`` is the share of the shorter of the two
  that the fused op hid: ``(t_comm + t_mm - t_fused) / min(t_comm, t_mm)``, clipped to
  [0, 1] (0: the fused op took as long as both in turn). The inputs are small integers held
  as floats, so every result is exact: each timed call's, fused or not, must equal the
  unfused result bit for bit (each call of a loop has inputs of its own).

A failed check is named in the record's ``wrong`` and makes the run exit 1.

Prints a table and writes ``<out>/symm_mem-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyc10d.bench.launch import run_worker
from pyc10d.bench.report import cli_args, finish
from pyc10d.bench.timing import back_to_back

Body = Callable[[int], Any]


def _times(dist: Any, fns: dict[str, tuple[Body, Callable[[], None], Callable[[], bool]]], k: int,
           reps: int, wrong: list[str], what: str) -> dict[str, float]:
    """Per name: median over ``reps`` of (``k`` calls ``body(0) .. body(k - 1)``) / k, the
    slowest rank's (seconds). Before each loop ``prepare()`` resets its inputs and poisons its
    outputs, after it ``check()`` compares every call's result with the exact expected one
    (both untimed); a failed check is added to ``wrong``. The functions take turns within each
    round, so load from elsewhere on the host hits them alike."""
    for body, prepare, _ in fns.values():  # warm-up
        prepare()
        body(0)
    out: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(reps):
        for name, (body, prepare, check) in fns.items():
            prepare()
            out[name].append(back_to_back(dist, body, k))
            if not check():
                wrong.append(f"{what} {name}: a timed call of loop {r} gave a wrong result")
    return {name: statistics.median(v) for name, v in out.items()}


def _overlap(t_comm: float, t_mm: float, t_fused: float) -> float:
    return min(1.0, max(0.0, (t_comm + t_mm - t_fused) / min(t_comm, t_mm)))


def _calls(k: int, fn: Callable[[int], Any], want: list[Any]
           ) -> tuple[Body, Callable[[], None], Callable[[], bool]]:
    """Timed calls of a function that returns its result (``fn(i)``, i < k): each call's
    result is kept (the slots poisoned with None before the loop) and checked bit for bit
    against ``want[i]``, which may be a tensor or a tuple / list of tensors."""
    import torch

    got: list[Any] = [None] * k

    def body(i: int) -> None:
        got[i] = fn(i)

    def prepare() -> None:
        got[:] = [None] * k

    def same(a: Any, b: Any) -> bool:
        if isinstance(b, (list, tuple)):
            return isinstance(a, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
        return isinstance(a, torch.Tensor) and torch.equal(a, b)

    return body, prepare, lambda: all(same(g, w) for g, w in zip(got, want))


def _in_place(t: Any, fill: float, want: float, call: Callable[[], Any]
              ) -> tuple[Body, Callable[[], None], Callable[[], bool]]:
    """A timed in-place all_reduce of ``t``: its input refilled with ``fill`` before every
    call (untimed: one call a loop), its result compared with ``want`` everywhere."""
    return (lambda i: call(), lambda: t.fill_(fill), lambda: bool((t == want).all()))


def _everyones(dist: Any, wrong: list[str]) -> list[str]:
    """Every rank's failed checks, each named by its rank (rank 0 writes the record)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, wrong)
    return [f"rank {r}: {w}" for r, ws in enumerate(everyone) for w in ws]


def _pyc10d_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import pyc10d as dist
    import pyc10d.functional as ft_c
    import pyc10d.symmetric_memory as symm

    dist.init_process_group(backend="shm", init_method="env://")
    n, rank, g = dist.get_world_size(), dist.get_rank(), "0"
    symm.enable_symm_mem_for_group(g)
    numel = args.mib * (1 << 20) // 4
    wrong: list[str] = []
    rec: dict[str, Any] = {"world_size": n, "wrong": wrong}

    # Rank r holds n * (r + 1): the AVG is n (n + 1) / 2 exactly whichever way it is computed,
    # and each loop's one call starts from these values again (they are not the result).
    mine, want = float(n * (rank + 1)), n * (n + 1) / 2
    plain = torch.empty(numel)
    sym = symm.empty_strided_p2p((numel,), (1,), torch.float32, "cpu", g)
    ar = _times(dist, {
        "symm": _in_place(sym, mine, want, lambda: dist.all_reduce(sym, op=dist.ReduceOp.AVG)),
        "shm": _in_place(plain, mine, want, lambda: dist.all_reduce(plain, op=dist.ReduceOp.AVG)),
    }, 1, args.reps, wrong, "all_reduce")
    rec["allreduce_symm_ms"], rec["allreduce_shm_ms"] = 1e3 * ar["symm"], 1e3 * ar["shm"]

    # Small integers as floats: every product and sum is exact, so the fused ops must equal
    # the unfused ones bit for bit whatever order they add in. Each of the k calls of a loop
    # has inputs of its own, so a call that handed back an earlier result fails its check.
    k = 3
    gen = torch.Generator().manual_seed(rank)

    def ints(*shape: int) -> torch.Tensor:
        return torch.randint(-4, 5, shape, generator=gen).float()

    rows, k_dim, n_dim = args.ag_shape
    shards = [ints(rows // n, k_dim) for _ in range(k)]
    bs = [ints(k_dim, n_dim) for _ in range(k)]
    ag_ref = [symm._fused_all_gather_matmul_fallback(shards[i], [bs[i]], 0, g) for i in range(k)]
    gathered = [ref[0] for ref in ag_ref]
    ag = _times(dist, {
        "comm": _calls(k, lambda i: ft_c.wait_tensor(ft_c.all_gather_tensor(shards[i], 0, g)), gathered),
        "mm": _calls(k, lambda i: torch.matmul(gathered[i], bs[i]), [ref[1][0] for ref in ag_ref]),
        "fallback": _calls(k, lambda i: symm._fused_all_gather_matmul_fallback(shards[i], [bs[i]], 0, g), ag_ref),
        "fused": _calls(k, lambda i: symm.fused_all_gather_matmul(shards[i], [bs[i]], 0, g), ag_ref),
    }, k, args.reps, wrong, "ag_mm")
    rows, k_dim, n_dim = args.rs_shape
    as_, bs = [ints(rows, k_dim) for _ in range(k)], [ints(k_dim, n_dim) for _ in range(k)]
    products = [a @ b for a, b in zip(as_, bs)]
    rs_ref = [symm._fused_matmul_reduce_scatter_fallback(as_[i], bs[i], "sum", 0, g) for i in range(k)]
    rs = _times(dist, {
        "comm": _calls(k, lambda i: ft_c.wait_tensor(ft_c.reduce_scatter_tensor(products[i], "sum", 0, g)), rs_ref),
        "mm": _calls(k, lambda i: as_[i] @ bs[i], products),
        "fallback": _calls(k, lambda i: symm._fused_matmul_reduce_scatter_fallback(as_[i], bs[i], "sum", 0, g), rs_ref),
        "fused": _calls(k, lambda i: symm.fused_matmul_reduce_scatter(as_[i], bs[i], "sum", 0, g), rs_ref),
    }, k, args.reps, wrong, "mm_rs")
    for name, d in (("ag_mm", ag), ("mm_rs", rs)):
        for key, value in d.items():
            rec[f"{name}_{key}_ms"] = 1e3 * value
        rec[f"{name}_overlap"] = _overlap(d["comm"], d["mm"], d["fused"])
        rec[f"{name}_speedup"] = d["fallback"] / d["fused"]
    rec["wrong"] = _everyones(dist, wrong)
    dist.destroy_process_group()
    return rec


def _gloo_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="gloo", init_method="env://")
    n, rank = dist.get_world_size(), dist.get_rank()
    # Gloo has no AVG: SUM, of the same values as pyc10d's side, refilled before every call
    plain = torch.empty(args.mib * (1 << 20) // 4)
    wrong: list[str] = []
    ms = 1e3 * _times(dist, {"gloo": _in_place(plain, float(n * (rank + 1)), n * n * (n + 1) / 2,
                                               lambda: dist.all_reduce(plain))}, 1, args.reps, wrong,
                       "all_reduce")["gloo"]
    rec = {"world_size": n, "allreduce_gloo_ms": ms, "wrong": _everyones(dist, wrong)}
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
            failures += [f"pyc10d-shm x{world}: {w}" for w in rec["wrong"]]
            if not args.no_gloo:
                gloo = _run_job("torch-gloo", world, args, Path(tmp))
                if isinstance(gloo, str):
                    failures.append(f"torch-gloo x{world}: {gloo}")
                else:
                    rec["allreduce_gloo_ms"] = gloo["allreduce_gloo_ms"]
                    failures += [f"torch-gloo x{world}: {w}" for w in gloo["wrong"]]
            records.append(rec)
    print("\n".join(_table(records, args)))
    payload = {"args": cli_args(args), "records": records, "failures": failures}
    return finish(args.out, "symm_mem", payload, failures, "FAILED")


if __name__ == "__main__":
    sys.exit(main())
