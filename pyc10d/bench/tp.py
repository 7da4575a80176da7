"""Tensor-parallel decoding, end to end: ``python -m pyc10d.bench --tp`` (or ``-m pyc10d.bench.tp``).

A decoder-style stack (``--layers`` blocks of ``x + W2 gelu(W1 x)``, ``d -> 4d -> d``, bf16,
random weights, batch 1) decodes ``--tokens`` tokens, one at a time, as inference does. The
implementations, each its own job:

* ``single``: one process with 2 threads (on 2 cores, the most tensor parallelism can reach);
* ``pyc10d-shm``, ``torch-pyc10d_shm``, ``torch-gloo``: 2 ranks, the shards applied by hand
  (``W1`` split by columns, ``W2`` by rows, one all_reduce of the ``d``-vector per layer, as
  vLLM-style TP does), on pyc10d's own API, on torch.distributed over pyc10d (the plugin) and
  over Gloo;
* ``dtensor-pyc10d_shm``, ``dtensor-gloo``: torch's own ``parallelize_module`` (DTensor,
  ``ColwiseParallel`` / ``RowwiseParallel``) on the plugin and on Gloo.

Timing: blocks of ``--tokens`` tokens back to back (``timing.back_to_back``: one barrier, the
block's time / tokens, max over ranks), median of ``--blocks`` blocks. Every output of every
timed token is checked against the one-process result, which each job computes itself
(untimed), from outputs poisoned with NaN before each block; bf16 sums in another order than
one process does, so the check allows a relative error (norm of the difference over the norm
of the one-process output, per token) of 2%: an all_reduce that did nothing leaves half of every
layer's update out, far outside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyc10d.bench.launch import keep_fastest, run_worker
from pyc10d.bench.report import cli_args, finish
from pyc10d.bench.timing import back_to_back

IMPLS = ["single", "pyc10d-shm", "torch-pyc10d_shm", "torch-gloo", "dtensor-pyc10d_shm", "dtensor-gloo"]
TOLERANCE = 0.02  # relative error per token, see the module docstring


def _stack(dim: int, layers: int) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Linear(dim, 4 * dim, bias=False)
            self.w2 = nn.Linear(4 * dim, dim, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.w2(torch.nn.functional.gelu(self.w1(x)))

    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(layers)]).to(torch.bfloat16)
    with torch.no_grad():  # keep activations O(1) through the residual stream
        for p in model.parameters():
            p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
    return model.eval()


def _inputs(dim: int, tokens: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(7)
    return torch.randn(tokens, 1, dim, generator=g).to(torch.bfloat16)


def relative_error(outs: Any, want: Any) -> float:
    """The largest per-token ``|out - want| / |want|`` (NaN when an output is NaN)."""
    diff = (outs.float() - want.float()).flatten(1).norm(dim=1)
    return float((diff / want.float().flatten(1).norm(dim=1)).max())


class _ByHand:
    """The shards of ``model`` for ``rank`` of ``world``, applied with one all_reduce per layer."""

    def __init__(self, model: Any, dist: Any, rank: int, world: int) -> None:
        import torch

        self.dist = dist
        self.layers = []
        # Shards kept in nn.Linear's (out, in) layout and applied with ``linear``: torch's CPU
        # bf16 matmul of a (1, k) row by a row-major (k, n) matrix takes a path ~20x slower
        # than by the transposed view of an (n, k) one (a one-process diagnostic, unchecked:
        # 9.7 vs 0.41 ms at k=1024, n=2048, one thread), which made the by-hand figures 16x
        # the one process's.
        for block in model:
            cols = block.w1.weight.shape[0] // world
            w1 = block.w1.weight.detach()[rank * cols:(rank + 1) * cols].contiguous()
            w2 = block.w2.weight.detach()[:, rank * cols:(rank + 1) * cols].contiguous()
            self.layers.append((w1, w2))
        self.gelu = torch.nn.functional.gelu
        self.linear = torch.nn.functional.linear

    def __call__(self, x: Any) -> Any:
        linear = self.linear
        for w1, w2 in self.layers:
            part = linear(self.gelu(linear(x, w1)), w2)
            self.dist.all_reduce(part)
            x = x + part
        return x


def worker(args: argparse.Namespace) -> None:
    import torch

    impl = args.impl
    model = _stack(args.dim, args.layers)
    xs = _inputs(args.dim, args.tokens)
    with torch.no_grad():
        want = torch.stack([model(x) for x in xs]).float()
    worst = 0.0
    if impl == "single":
        torch.set_num_threads(2)
        dist, rank, world, step = None, 0, 1, model
    else:
        torch.set_num_threads(1)
        if impl.startswith("pyc10d-"):
            import pyc10d as dist
        else:
            import torch.distributed as dist

            import pyc10d.torch_backend  # noqa: F401 - registers pyc10d_shm
        dist.init_process_group(backend=impl.split("-", 1)[1])
        rank, world = dist.get_rank(), dist.get_world_size()
        if impl.startswith("dtensor-"):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.parallel import (
                ColwiseParallel,
                RowwiseParallel,
                parallelize_module,
            )

            mesh = init_device_mesh("cpu", (world,))
            plan = {}
            for i in range(args.layers):
                plan[f"{i}.w1"], plan[f"{i}.w2"] = ColwiseParallel(), RowwiseParallel()
            step = parallelize_module(model, mesh, plan)
        else:
            step = _ByHand(model, dist, rank, world)
    outs = torch.empty(args.tokens, 1, args.dim, dtype=torch.bfloat16)

    def decode(i: int) -> None:
        outs[i] = step(xs[i])

    def block() -> float:
        nonlocal worst
        outs.fill_(float("nan"))
        with torch.no_grad():
            if dist is None:
                import time

                t0 = time.perf_counter()
                for i in range(args.tokens):
                    decode(i)
                took = (time.perf_counter() - t0) / args.tokens
            else:
                took = back_to_back(dist, decode, args.tokens)
        err = relative_error(outs, want)
        worst = max(worst, err)
        if not err <= TOLERANCE:  # NaN fails too
            raise SystemExit(f"tp bench ({impl}, rank {rank}): outputs differ from one process by "
                             f"{err:.2%} (relative; allowed {TOLERANCE:.0%})")
        return took

    for _ in range(args.warmup):
        block()
    times = [block() for _ in range(args.blocks)]
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            "impl": impl, "world_size": world, "dim": args.dim, "layers": args.layers,
            "tokens": args.tokens, "dtype": "bfloat16", "checked": True, "max_rel_err": worst,
            "ms_per_token": 1e3 * statistics.median(times), "blocks_ms": [1e3 * t for t in times],
        }))
    if dist is not None:
        dist.destroy_process_group()


def run_job(impl: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any] | str:
    out = workdir / f"{impl}.json"
    worker_args = ["--impl", impl, "--dim", str(args.dim), "--layers", str(args.layers),
                   "--tokens", str(args.tokens), "--blocks", str(args.blocks), "--warmup", str(args.warmup)]
    if impl != "single":
        return run_worker("pyc10d.bench.tp", 2, worker_args, out, args.timeout)
    cmd = [sys.executable, "-m", "pyc10d.bench.tp", "--worker", *worker_args, "--out", str(out)]
    try:
        code = subprocess.run(cmd, timeout=args.timeout).returncode
    except subprocess.TimeoutExpired:
        return f"timed out after {args.timeout:.0f} s"
    return json.loads(out.read_text()) if code == 0 and out.exists() else f"exit code {code}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pyc10d.bench --tp",
                                description="tensor-parallel decoding over 2 ranks, ms per token")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32, help="tokens per timed block, back to back")
    p.add_argument("--blocks", type=int, default=5, help="timed blocks; the median is reported")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2, help="runs of every job, interleaved; the fastest is kept")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    best: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pyc10d-tp-bench-") as tmp:
        for _ in range(args.rounds):
            for impl in args.impls.split(","):
                res = run_job(impl, args, Path(tmp))
                if isinstance(res, str):
                    failures.append(f"{impl}: {res}")
                    continue
                keep_fastest(best, impl, res, "ms_per_token", "round_ms")
    single = best.get("single", {}).get("ms_per_token")
    print(f"\nTP decode: {args.layers} layers of {args.dim} -> {4 * args.dim} -> {args.dim}, bf16, "
          f"batch 1, 2 ranks (single: 1 process, 2 threads); every token checked")
    print(f"{'impl':<20}{'ms/token':>10}{'vs single':>11}{'rounds (ms)':>24}")
    for impl, r in best.items():
        ratio = f"{r['ms_per_token'] / single:.3f}x" if single else "-"
        print(f"{impl:<20}{r['ms_per_token']:>10.3f}{ratio:>11}  {', '.join(f'{t:.3f}' for t in r['round_ms']):>22}")
    payload = {"args": cli_args(args), "records": list(best.values()), "failures": failures}
    return finish(args.out, "tp", payload, failures, "FAILED")


if __name__ == "__main__":
    sys.exit(main())
