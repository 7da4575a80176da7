"""Recovery from a dead rank: ``shrink_group`` against abort + a fresh ``init_process_group``.

``python -m pyc10d.bench.shrink [--world 4] [--rounds 5] [--backends shm,tcp,pyc10d_shm,pyc10d_tcp]``

Each round forks ``--world`` ranks; the job's TCPStore lives in this launcher process (as in
``examples/elastic_shrink.py``), so it outlives every rank. The ranks all-reduce once, rank 2
SIGKILLs itself, and each survivor's next all_reduce fails. From the moment a survivor has
caught that error, it recovers one of two ways and all-reduces once on the new group:

* ``shrink``: ``shrink_group([2])`` (pyc10d's, or ``torch.distributed``'s on a ``pyc10d_*``
  backend);
* ``rebuild``: ``abort_process_group()`` then ``init_process_group`` under a new store
  prefix with the survivors renumbered (the example's path, less its join window: here the
  survivors know who died; agreeing on it through the store costs the example 2 s more).

Reported per method: ``recover_s``, the slowest survivor's time from the error to the end of
its first all_reduce on the new group, and ``call_s``, the slowest survivor's time in the
recovery call alone (``shrink_group``, or abort + init); the median over rounds, and min-max.
A backend name starting with ``pyc10d_`` runs through ``torch.distributed`` on the plugin.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import time
from datetime import timedelta
from typing import Any

DEAD = 2


def _worker(rank: int, world: int, backend: str, method: str, port: int, out: Any) -> None:
    import torch

    torch.set_num_threads(1)
    if backend.startswith("pyc10d_"):
        import torch.distributed as dist

        import pyc10d.torch_backend  # registers the backends
    else:
        import pyc10d as dist  # type: ignore[no-redef]
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    timeout = timedelta(seconds=30)
    dist.init_process_group(backend, store=dist.PrefixStore("gen0/", store), rank=rank, world_size=world,
                            timeout=timeout)
    dist.all_reduce(torch.ones(4))
    if rank == DEAD:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError:
        pass
    t0 = time.monotonic()
    if method == "shrink":
        dist.shrink_group([DEAD])
    else:
        dist.distributed_c10d._abort_process_group()
        survivors = [r for r in range(world) if r != DEAD]
        dist.init_process_group(backend, store=dist.PrefixStore("gen1/", store), rank=survivors.index(rank),
                                world_size=len(survivors), timeout=timeout)
    t1 = time.monotonic()
    t = torch.ones(4)
    dist.all_reduce(t)
    t2 = time.monotonic()
    assert t.tolist() == [world - 1.0] * 4, t
    dist.destroy_process_group()
    out.put((rank, t1 - t0, t2 - t0))


def _round(world: int, backend: str, method: str) -> tuple[float, float]:
    if backend.startswith("pyc10d_"):  # torch's store client speaks to torch's server only
        import torch.distributed as dist
    else:
        import pyc10d as dist  # type: ignore[no-redef]
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, backend, method, server.port, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = [out.get(timeout=30) for _ in range(world - 1)]
    for p in procs:
        p.join(timeout=10)
    return max(r[1] for r in results), max(r[2] for r in results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backends", default="shm,tcp,pyc10d_shm,pyc10d_tcp")
    args = ap.parse_args(argv)
    print(f"{'backend':<12} {'method':<8} {'call_s median (min-max)':>28} {'recover_s median (min-max)':>30}")
    for backend in args.backends.split(","):
        for method in ("shrink", "rebuild"):
            runs = [_round(args.world, backend, method) for _ in range(args.rounds)]
            cells = []
            for k in (0, 1):
                xs = [r[k] for r in runs]
                cells.append(f"{statistics.median(xs) * 1e3:8.2f} ms ({min(xs) * 1e3:.2f}-{max(xs) * 1e3:.2f})")
            print(f"{backend:<12} {method:<8} {cells[0]:>28} {cells[1]:>30}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
