"""Shrink and go on: the survivors of a dead rank rebuild the world and finish training.

    python examples/elastic_shrink.py [--world 4] [--kill-rank 2] [--kill-step 5] [--steps 12]
                                      [--backend auto|shm|tcp]

The job's store lives in this launcher process (as a cluster's rendezvous service does), so
it outlives any rank. Each worker trains a linear model by full-batch gradient descent: the
fixed global batch is split over the ranks alive, each rank sums its samples' gradients and
``all_reduce`` adds them, so every step gives the same parameters whatever the world size.

At ``--kill-step`` one rank SIGKILLs itself. The others get an error naming it, call
``abort_process_group()``, agree on who is left through the store (generation ``g``: each
survivor registers, and after a join window the registered set is the new world, numbered in
the old order), call ``init_process_group`` again under the prefix ``gen<g>/`` and take the
most advanced state among them (a survivor may have finished the step the others failed in).
At the end every survivor's parameters must equal those of one process on the full batch.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time
from datetime import timedelta

import torch

import pyc10d as dist

DIM, BATCH, LR = 8, 48, 0.1
JOIN_WINDOW_S = 2.0


def say(line: str) -> None:
    """One line from a worker in one write: the workers share the launcher's stdout, and
    buffered prints of two processes can run together on one line."""
    os.write(1, (line + "\n").encode())


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, DIM, generator=g, dtype=torch.float64)
    y = x @ torch.linspace(-1, 1, DIM, dtype=torch.float64) + 0.5
    return x, y


def grad_sum(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum over the samples of the squared error's gradient (weights and bias)."""
    err = x @ w[:-1] + w[-1] - y
    return torch.cat([2 * x.T @ err, (2 * err.sum()).reshape(1)])


def reference(steps: int) -> torch.Tensor:
    x, y = batch()
    w = torch.zeros(DIM + 1, dtype=torch.float64)
    for _ in range(steps):
        w -= LR * grad_sum(w, x, y) / BATCH
    return w


def rejoin(store: dist.Store, gen: int, me: int, old: list[int]) -> list[int]:
    """Agree on the survivors of generation ``gen - 1``: the members registered in time."""
    store.set(f"gen{gen}/alive/{me}", b"1")
    store.compare_set(f"gen{gen}/opened", b"", str(time.time()).encode())
    opened = float(store.get(f"gen{gen}/opened"))
    time.sleep(max(0.0, opened + JOIN_WINDOW_S - time.time()))
    return [r for r in old if store.check([f"gen{gen}/alive/{r}"])]


def worker(me: int, world: int, host: str, port: int, args: argparse.Namespace, out: multiprocessing.Queue) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
    x, y = batch()
    w = torch.zeros(DIM + 1, dtype=torch.float64)
    step, gen, members = 0, 0, list(range(world))
    while step < args.steps:
        try:
            rank, size = members.index(me), len(members)
            dist.init_process_group(args.backend, store=dist.PrefixStore(f"gen{gen}/", store), rank=rank,
                                    world_size=size, timeout=timedelta(seconds=30))
            if gen:  # resync: the most advanced survivor's state wins
                steps = [None] * size
                dist.all_gather_object(steps, step)
                src = max(range(size), key=lambda r: steps[r])
                state = torch.cat([w, torch.tensor([float(step)], dtype=torch.float64)])
                dist.broadcast(state, src=src)
                w, step = state[:-1].clone(), int(state[-1])
                if rank == 0:
                    say(f"generation {gen}: {size} ranks {members}, resuming at step {step}")
            while step < args.steps:
                if me == args.kill_rank and step == args.kill_step and gen == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                shard = torch.arange(BATCH).chunk(size)[rank]
                g = grad_sum(w, x[shard], y[shard])
                dist.all_reduce(g)
                w -= LR * g / BATCH
                step += 1
            dist.destroy_process_group()
        except RuntimeError as e:
            say(f"rank {me} (generation {gen}): {str(e)[:160]}")
            dist.abort_process_group()
            gen += 1
            members = rejoin(store, gen, me, members)
    out.put((me, w.tolist()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--kill-rank", type=int, default=2)
    ap.add_argument("--kill-step", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--backend", default="auto")
    args = ap.parse_args(argv)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.world, "127.0.0.1", server.port, args, out))
             for r in range(args.world)]
    for p in procs:
        p.start()
    survivors = args.world - (0 <= args.kill_rank < args.world)
    results = dict(out.get(timeout=60) for _ in range(survivors))
    for p in procs:
        p.join(timeout=10)
    want = reference(args.steps)
    ok = all(torch.allclose(torch.tensor(w, dtype=torch.float64), want) for w in results.values())
    print(f"survivors {sorted(results)}: parameters after {args.steps} steps "
          f"{'equal' if ok else 'DIFFER from'} one process on the full batch")
    return 0 if ok and len(results) == survivors else 1


if __name__ == "__main__":
    sys.exit(main())
