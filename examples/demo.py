"""A tour of pyc10d's collectives; run it with ``make demo`` or

    python -m pyc10d.run --nproc-per-node 4 examples/demo.py

Every rank runs each collective on small CPU tensors, checks its result against the value
it computes locally, and rank 0 prints one line per op: whether every rank got the right
answer and how long the call took on rank 0. The exit code is 1 if any result was wrong.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

import pyc10d as dist


def demo(rank: int, n: int) -> list[tuple[str, bool, float]]:
    """Run every op once; return (op, ok on this rank, milliseconds) for each."""
    results: list[tuple[str, bool, float]] = []

    def step(name: str, call: Callable[[], object], check: Callable[[], bool]) -> None:
        t0 = time.perf_counter()
        call()
        ms = (time.perf_counter() - t0) * 1e3
        results.append((name, bool(check()), ms))

    f32 = torch.float32
    total = n * (n + 1) // 2  # sum over ranks of (rank + 1)

    t = torch.full((4,), float(rank + 1))
    step("all_reduce", lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM),
         lambda: torch.equal(t, torch.full((4,), float(total))))

    src = 1 % n
    b = torch.arange(4, dtype=f32) + 10 * rank
    step("broadcast", lambda: dist.broadcast(b, src=src),
         lambda: torch.equal(b, torch.arange(4, dtype=f32) + 10 * src))

    parts = [torch.empty(2) for _ in range(n)]
    step("all_gather", lambda: dist.all_gather(parts, torch.full((2,), float(rank))),
         lambda: all(torch.equal(p, torch.full((2,), float(i))) for i, p in enumerate(parts)))

    flat = torch.empty(2 * n)
    step("all_gather_into_tensor",
         lambda: dist.all_gather_into_tensor(flat, torch.full((2,), float(rank))),
         lambda: torch.equal(flat, torch.arange(n, dtype=f32).repeat_interleave(2)))

    rs_in = torch.arange(2 * n, dtype=f32) + rank
    rs_out = torch.empty(2)
    want_rs = n * torch.arange(2 * rank, 2 * rank + 2, dtype=f32) + n * (n - 1) / 2
    step("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(rs_out, rs_in),
         lambda: torch.equal(rs_out, want_rs))

    r = torch.tensor([float(rank)])
    step("reduce(MAX)", lambda: dist.reduce(r, dst=0, op=dist.ReduceOp.MAX),
         lambda: rank != 0 or r.item() == n - 1)

    g_in = torch.tensor([float(rank * rank)])
    g_out = [torch.empty(1) for _ in range(n)] if rank == 0 else None
    step("gather", lambda: dist.gather(g_in, g_out, dst=0),
         lambda: rank != 0 or [x.item() for x in g_out or []] == [i * i for i in range(n)])

    s_out = torch.empty(2)
    s_in = [torch.full((2,), 3.0 * i) for i in range(n)] if rank == 0 else None
    step("scatter", lambda: dist.scatter(s_out, s_in, src=0),
         lambda: torch.equal(s_out, torch.full((2,), 3.0 * rank)))

    a_in = 100 * rank + torch.arange(n, dtype=f32)
    a_out = torch.empty(n)
    step("all_to_all_single", lambda: dist.all_to_all_single(a_out, a_in),
         lambda: torch.equal(a_out, 100 * torch.arange(n, dtype=f32) + rank))

    nxt, prv = (rank + 1) % n, (rank - 1) % n
    ring_in = torch.empty(3)

    def ring() -> None:
        out = torch.full((3,), float(rank))
        if rank % 2 == 0:
            dist.send(out, dst=nxt)
            dist.recv(ring_in, src=prv)
        else:
            dist.recv(ring_in, src=prv)
            dist.send(out, dst=nxt)

    step("send/recv ring", ring, lambda: torch.equal(ring_in, torch.full((3,), float(prv))))

    step("barrier", dist.barrier, lambda: True)

    objs: list[object] = [None] * n
    step("all_gather_object",
         lambda: dist.all_gather_object(objs, {"rank": rank, "name": f"worker-{rank}"}),
         lambda: objs == [{"rank": i, "name": f"worker-{i}"} for i in range(n)])

    payload = [{"lr": 0.1, "layers": [64, 32]}, "hello", 42]
    box: list[object] = list(payload) if rank == 0 else [None] * len(payload)
    step("broadcast_object_list", lambda: dist.broadcast_object_list(box, src=0),
         lambda: box == payload)
    return results


def main() -> int:
    dist.init_process_group(init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    try:
        if n < 2:
            print("demo.py needs at least 2 ranks (use --nproc-per-node 4)", file=sys.stderr)
            return 2
        results = demo(rank, n)
        # every rank's verdict per op, so rank 0 can report the whole group
        oks = torch.tensor([int(ok) for _, ok, _ in results], dtype=torch.int32)
        dist.all_reduce(oks, op=dist.ReduceOp.MIN)
        if rank == 0:
            print(f"pyc10d demo: {n} ranks, backend {dist.get_backend()}")
            print(f"{'op':<24}{'ok':<6}{'ms (rank 0)':>12}")
            for (name, _, ms), ok in zip(results, oks.tolist()):
                print(f"{name:<24}{'yes' if ok else 'NO':<6}{ms:>12.2f}")
            print("all results correct" if all(oks.tolist()) else "SOME RESULTS WRONG")
        return 0 if all(oks.tolist()) else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
