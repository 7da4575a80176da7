"""DDP step time: pyc10d's DistributedDataParallel on shm and tcp, and torch's DDP over
pyc10d's shm engine (the torch.distributed plugin, ``torch-pyc10d_shm``), vs torch's DDP
over Gloo.

``python -m pyc10d.bench.ddp [--world-sizes 2,4] [--steps 8] [--rounds 2]`` launches one
job per implementation and world size (``pyc10d.run`` on 127.0.0.1; ``--rounds`` times,
keeping each job's fastest run), each training the same small transformer language model
with the same seeds, batch size and ``bucket_cap_mb``, every rank on its own batch. Each phase
below runs ``--steps`` times back to back, as a training loop calls it (a barrier before the
block only), and counts the block's time / ``--steps``; the phases take turns, ``--blocks``
times, and each figure is the median block of the slowest rank:

* ``step_ms``: forward + backward (with gradient averaging) + optimizer step;
* ``compute_ms``: the same step under ``no_sync()``, i.e. without communication;
* ``comm_ms``: all-reducing buffers of the model's bucket sizes back to back, nothing else;
* ``hidden``: the share of ``comm_ms`` that did not lengthen the step,
  ``1 - (step_ms - compute_ms) / comm_ms`` clipped to [0, 1].

Every timed result is checked: before timing, one step's gradients against the average of
every rank's own; after each block of steps, that all ranks hold the same parameters (bit for
bit: different batches make replicas drift apart the moment a gradient is not averaged);
after each block of ``comm``, every buffer's value, which each all_reduce of the block fed
into the next. A failed check stops the job, which the table then lists as failed. The
``no_sync`` steps leave the replicas different by design; rank 0's parameters are broadcast
after each such block, untimed.

It prints a table and writes ``benchmarks/results/ddp-<time>.json``. torch.distributed is
used here only as the reference implementation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyc10d.bench.launch import keep_fastest, run_worker
from pyc10d.bench.report import cli_args, finish
from pyc10d.bench.timing import back_to_back

IMPLS = ["pyc10d-shm", "pyc10d-tcp", "torch-pyc10d_shm", "torch-gloo"]


# ----------------------------------------------------------------------------- worker
def _model(vocab: int, context: int, dim: int, layers: int) -> Any:
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(context, dim)
            block = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.head = nn.Linear(dim, vocab)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            return self.head(self.blocks(x, mask=self.mask, is_causal=True))

    return TinyLM()


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's spelling

    torch.set_num_threads(1)
    if args.impl.startswith("torch-"):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        if args.impl.startswith("torch-pyc10d"):  # torch's DDP over pyc10d's engine (the plugin)
            import pyc10d.torch_backend
    else:
        import pyc10d as dist
        from pyc10d.nn import DistributedDataParallel as DDP
    dist.init_process_group(backend=args.impl.split("-", 1)[1])
    rank, world = dist.get_rank(), dist.get_world_size()
    vocab, context = 64, args.context
    torch.manual_seed(0)
    model = _model(vocab, context, args.dim, args.layers)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    # Every rank its own batch: a gradient that was not averaged shows as replicas drifting apart.
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randint(0, vocab, (args.batch, context), generator=g)
    y = torch.randint(0, vocab, (args.batch, context), generator=g)
    params = [p for p in model.parameters() if p.requires_grad]

    def loss() -> torch.Tensor:
        return F.cross_entropy(ddp(x).reshape(-1, vocab), y.reshape(-1))

    def step() -> None:
        loss().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    def no_sync_step() -> None:
        with ddp.no_sync():
            step()

    from pyc10d.nn import compute_bucket_assignment_by_size

    cap = int(args.bucket_cap_mb * 1024 * 1024)
    buckets, _ = compute_bucket_assignment_by_size(
        params, [min(cap, 1024 * 1024), cap], tensor_indices=list(reversed(range(len(params))))
    )
    buffers = [torch.zeros(sum(params[i].numel() for i in b)) for b in buckets]

    def comm() -> None:
        for b in buffers:
            dist.all_reduce(b)

    def fail(what: str) -> None:
        raise SystemExit(f"ddp bench ({args.impl}, rank {rank}): {what}")

    def check_average() -> None:
        """One step's gradients are the average of every rank's own (checked once, untimed)."""
        opt.zero_grad(set_to_none=False)
        with ddp.no_sync():
            loss().backward()
        local = torch.cat([p.grad.reshape(-1) for p in params]).double()
        opt.zero_grad(set_to_none=False)
        loss().backward()
        averaged = torch.cat([p.grad.reshape(-1) for p in params]).double()
        opt.zero_grad(set_to_none=False)
        dist.all_reduce(local)
        if not torch.allclose(averaged, local / world, rtol=1e-4, atol=1e-6):
            fail(f"gradients are not the average over ranks (max error {(averaged - local / world).abs().max():.3g})")

    def resync() -> None:
        """After ``no_sync`` steps on different batches the replicas differ: rank 0's again."""
        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, 0)

    def check_replicas(block: int) -> None:
        """After a block of DDP steps every rank holds the same parameters, bit for bit: every
        parameter's bytes (as integers, so -0.0 is not 0.0 and a NaN is not equal to
        nothing) against every other rank's."""
        mine = torch.cat([p.detach().reshape(-1) for p in params]).view(torch.int32)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine)
        differ = [r for r, other in enumerate(everyone) if not torch.equal(other, mine)]
        if differ:
            fail(f"parameters differ between ranks after block {block} of DDP steps "
                 f"(rank {rank}'s against rank(s) {differ})")

    def fill_buffers() -> None:
        for b in buffers:
            b.fill_(rank + 1)

    def check_buffers(block: int) -> None:
        """Each buffer went through every timed all_reduce of the block: (1 + ... + n) n^(k-1)."""
        want = world * (world + 1) // 2 * world ** (args.steps - 1)  # exact in float32 while < 2^24
        for i, b in enumerate(buffers):
            err = float((b.double() - want).abs().max())
            if err > (0 if want < 1 << 24 else 1e-5 * want):
                fail(f"bucket buffer {i} after block {block}: expected {want} everywhere, off by up to {err:.6g}")

    check_average()
    resync()
    phases = (("step", step), ("compute", no_sync_step), ("comm", comm))
    for _ in range(args.warmup):
        for _, fn in phases:
            fn()
    resync()
    # Each phase runs ``steps`` times back to back (a barrier before the block only, as a
    # training loop runs), divided by ``steps``; the phases take turns block by block, so load
    # from elsewhere on the host hits them alike.
    times: dict[str, list[float]] = {name: [] for name, _ in phases}
    for block in range(args.blocks):
        for name, fn in phases:
            if name == "comm":
                fill_buffers()
            times[name].append(back_to_back(dist, lambda i, fn=fn: fn(), args.steps))
            if name == "step":
                check_replicas(block)
            elif name == "compute":
                resync()
            else:
                check_buffers(block)
    if rank == 0:
        rec = {
            "impl": args.impl, "world_size": world, "params": sum(p.numel() for p in params),
            "buckets": len(buckets), "bucket_cap_mb": args.bucket_cap_mb, "batch_per_rank": args.batch,
            "steps_per_block": args.steps, "checked": True,
            **{f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()},
            "times_s": times,
        }
        exposed = rec["step_ms"] - rec["compute_ms"]
        rec["hidden"] = min(1.0, max(0.0, 1 - exposed / rec["comm_ms"])) if rec["comm_ms"] > 0 else 1.0
        Path(args.out).write_text(json.dumps(rec))
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- driver
def run_job(impl: str, world: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any] | str:
    worker_args = ["--impl", impl, "--steps", str(args.steps), "--blocks", str(args.blocks),
                   "--warmup", str(args.warmup),
                   "--dim", str(args.dim), "--layers", str(args.layers), "--context", str(args.context),
                   "--batch", str(args.batch), "--bucket-cap-mb", str(args.bucket_cap_mb)]
    return run_worker("pyc10d.bench.ddp", world, worker_args, workdir / f"{impl}-{world}.json", args.timeout)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DDP step time: pyc10d vs torch+Gloo")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--world-sizes", default="2,4")
    p.add_argument("--steps", type=int, default=8, help="steps per timed block, back to back")
    p.add_argument("--blocks", type=int, default=3, help="timed blocks per phase; the median is reported")
    p.add_argument("--rounds", type=int, default=2, help="runs of every job; the fastest is kept")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank")
    p.add_argument("--bucket-cap-mb", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    best: dict[tuple[str, int], dict[str, Any]] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pyc10d-ddp-bench-") as tmp:
        for _ in range(args.rounds):  # rounds alternate the jobs; a shared host's load hits all alike
            for world in [int(w) for w in args.world_sizes.split(",")]:
                for impl in args.impls.split(","):
                    res = run_job(impl, world, args, Path(tmp))
                    if isinstance(res, str):
                        failures.append(f"{impl} x{world}: {res}")
                        continue
                    keep_fastest(best, (impl, world), res, "step_ms", "round_step_ms")
    records = list(best.values())
    ref = {r["world_size"]: r["step_ms"] for r in records if r["impl"] == "torch-gloo"}
    print(f"\nDDP step of a {args.layers}-layer transformer (dim {args.dim}), bucket_cap_mb={args.bucket_cap_mb}")
    print(f"{'impl':<12}{'ranks':>6}{'step ms':>10}{'compute':>10}{'comm':>10}{'hidden':>8}{'vs gloo':>9}")
    for r in records:
        ratio = r["step_ms"] / ref[r["world_size"]] if r["world_size"] in ref else float("nan")
        print(f"{r['impl']:<12}{r['world_size']:>6}{r['step_ms']:>10.1f}{r['compute_ms']:>10.1f}"
              f"{r['comm_ms']:>10.1f}{r['hidden']:>8.0%}{ratio:>8.2f}x")
    payload = {"args": cli_args(args), "records": records, "failures": failures}
    return finish(args.out, "ddp", payload, failures, "FAILED")


if __name__ == "__main__":
    sys.exit(main())
