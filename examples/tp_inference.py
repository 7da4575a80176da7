"""Tensor-parallel decoding on pyc10d: each rank holds half of every layer's weights.

Run: .venv/bin/python -m pyc10d.run --nproc-per-node 2 examples/tp_inference.py

A stack of MLP blocks (``x + W2 gelu(W1 x)``, d -> 4d -> d, bf16) decodes tokens one at a time.
``W1`` is split by its outputs and ``W2`` by its inputs (Megatron's split), so each rank computes a
partial ``W2 gelu(W1 x)`` from its own halves and one ``all_reduce`` per layer sums them: the
``d``-vector of one token, a few KiB, which is where pyc10d's small-message latency matters.
Rank 0 checks every token against the whole stack run in one process.
"""

from __future__ import annotations

import argparse
import time

import torch

import pyc10d as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group()  # env:// from pyc10d.run; shm on one host
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # every rank makes the same full weights, then keeps its shard
    d, hidden = args.dim, 4 * args.dim
    # nn.Linear's layout, (out, in), applied with ``linear``: torch's CPU bf16 kernel for a row
    # times a row-major (in, out) matrix is ~20x slower than for the transposed (out, in) one.
    full = [(torch.randn(hidden, d) / d**0.5, torch.randn(d, hidden) / hidden**0.5) for _ in range(args.layers)]
    rows = slice(rank * hidden // world, (rank + 1) * hidden // world)
    shards = [(w1[rows].bfloat16().contiguous(), w2[:, rows].bfloat16().contiguous()) for w1, w2 in full]
    linear, gelu = torch.nn.functional.linear, torch.nn.functional.gelu

    def decode(x: torch.Tensor) -> torch.Tensor:
        for w1, w2 in shards:
            part = linear(gelu(linear(x, w1)), w2)
            dist.all_reduce(part)  # the other ranks' halves of this layer's update
            x = x + part
        return x

    def one_process(x: torch.Tensor) -> torch.Tensor:
        for w1, w2 in full:
            x = x + linear(gelu(linear(x, w1.bfloat16())), w2.bfloat16())
        return x

    tokens = torch.randn(args.tokens, 1, d, generator=torch.Generator().manual_seed(1)).bfloat16()
    dist.barrier()
    t0 = time.perf_counter()
    outs = [decode(x) for x in tokens]
    took = (time.perf_counter() - t0) / args.tokens
    if rank == 0:
        worst = max(float((o.float() - one_process(x).float()).norm() / one_process(x).float().norm())
                    for o, x in zip(outs, tokens))
        assert worst < 0.02, f"tensor-parallel output differs from one process by {worst:.2%}"
        print(f"{args.tokens} tokens, {args.layers} layers, d={d}, {world} ranks: "
              f"{took * 1e3:.2f} ms/token, max relative error vs one process {worst:.2%}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
