"""A nanoGPT-sized language model trained with DDP under torchrun, on the backend named on
the command line (``pyc10d`` through torch.distributed, or ``gloo`` for the reference).

``torchrun --nproc-per-node 2 examples/clients/nanogpt_ddp.py --backend pyc10d --out f.json``:
a 2-layer causal transformer (character vocabulary, 64-wide, context 32) on a fixed synthetic
text, each rank its own batches, 20 AdamW steps; rank 0 writes every step's mean loss over the
ranks and a checksum of the parameters. Everything is seeded, so two backends that reduce
alike give the same losses (``pyc10d.testing.clients`` compares them).
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 - torch's usual name for it
from torch.nn.parallel import DistributedDataParallel as DDP

TEXT = ("the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. " * 64)
VOCAB = sorted(set(TEXT))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.heads = heads
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int = 64, layers: int = 2, heads: int = 4, context: int = 32) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads, context) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln(self.blocks(x)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(GPT(len(VOCAB)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.tensor([VOCAB.index(ch) for ch in TEXT])
    gen = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for _ in range(args.steps):
        starts = torch.randint(0, len(data) - 33, (8,), generator=gen)
        x = torch.stack([data[s:s + 32] for s in starts])
        y = torch.stack([data[s + 1:s + 33] for s in starts])
        loss = F.cross_entropy(model(x).view(-1, len(VOCAB)), y.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"backend": args.backend, "losses": losses, "checksum": checksum,
                       "group": dist.get_backend()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
