"""Train a small transformer language model with DistributedDataParallel.

Written as for ``torch.distributed``; only the two pyc10d imports below differ from the
torch version (``from torch.distributed import init_process_group, destroy_process_group``
and ``from torch.nn.parallel import DistributedDataParallel``). Run with:

    python -m pyc10d.run --nproc-per-node 2 examples/train_ddp.py --steps 30

The corpus is generated here (no download): sentences from a small grammar, read one
character at a time. Every rank draws the same global batch each step and trains on its own
slice of it, so N ranks follow the same trajectory as one process on the whole batch.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F  # noqa: N812 - torch's spelling
from torch import nn

from pyc10d import destroy_process_group, init_process_group
from pyc10d.nn import DistributedDataParallel

SUBJECTS = ["the cat", "a dog", "my friend", "the old man", "a small bird", "the teacher", "our neighbour"]
VERBS = ["sees", "likes", "follows", "paints", "finds", "calls", "remembers"]
OBJECTS = ["the moon", "a red ball", "the river", "an apple", "the garden", "a quiet song", "the city"]
ENDINGS = [".", " today.", " at night.", " again.", " in the morning."]


def make_corpus(sentences: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}"
        for _ in range(sentences)
    )


class TinyLM(nn.Module):
    """A decoder-only transformer: token and position embeddings, causal self-attention blocks."""

    def __init__(self, vocab: int, context: int, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


def get_batch(data: torch.Tensor, step: int, batch: int, context: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step`` (the same on every rank)."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=g)
    x = torch.stack([data[s:s + context] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + 1 + context] for s in starts.tolist()])
    return x, y


def progress(step: int, total: int, loss: float, started: float) -> None:
    width = 30
    done = int(width * step / total)
    rate = step / max(time.perf_counter() - started, 1e-9)
    line = f"[{'#' * done}{'.' * (width - done)}] step {step:>4}/{total} loss {loss:.3f} {rate:5.1f} it/s"
    if sys.stdout.isatty():
        print("\r" + line, end="" if step < total else "\n", flush=True)
    elif step == total or step % max(1, total // 10) == 0:
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32, help="global batch (split across ranks)")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()

    init_process_group(backend=args.backend)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} must be divisible by the world size {world}")

    text = make_corpus(4000, seed=args.seed)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)

    torch.manual_seed(args.seed)
    model = TinyLM(len(chars), args.context)
    ddp_model = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp_model.parameters(), lr=args.lr)
    per_rank = args.batch // world
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"{world} ranks, {params / 1e3:.0f}k parameters, vocabulary {len(chars)}, "
              f"corpus {len(text)} chars; loss starts near ln({len(chars)}) = {math.log(len(chars)):.2f}")

    first = last = float("nan")
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = get_batch(data, step, args.batch, args.context, args.seed)
        x, y = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]
        logits = ddp_model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        last = loss.item()
        first = last if step == 1 else first
        if rank == 0:
            progress(step, args.steps, last, started)

    if rank == 0:
        print(f"loss {first:.3f} -> {last:.3f} in {time.perf_counter() - started:.1f}s")
        model.eval()
        with torch.no_grad():
            idx = torch.tensor([[chars.index(c) for c in "the "]])
            for _ in range(40):
                nxt = model(idx[:, -args.context:])[0, -1].argmax()
                idx = torch.cat([idx, nxt.view(1, 1)], dim=1)
        print("sample:", "".join(chars[i] for i in idx[0].tolist()))
    destroy_process_group()


if __name__ == "__main__":
    main()
