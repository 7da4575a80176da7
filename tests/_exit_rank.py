"""Programs that end right after their last collective (``tests/test_threads.py``).

``python _exit_rank.py threaded``: 8 ranks of the ``threaded`` backend as threads of this
process, 60 collectives of every kind over float16..int64 up to 300k elements, each rank checks
its results and calls ``destroy_process_group()``; the main thread joins the ranks and returns
at once.

``python -m pyc10d.run --nproc-per-node 2 _exit_rank.py BACKEND`` (BACKEND ``shm``, ``tcp``,
or ``pyc10d_shm`` / ``pyc10d_tcp`` for torch.distributed on the plugin): each rank runs the
same mix on the default group, then makes a second group that only a list holds, runs an
all_reduce on it, lets a daemon thread drop it, and returns at once (the default group not
destroyed either: the exit shuts it down).

Either way the process must exit 0: no pyc10d thread may still be inside torch when the
interpreter finalizes (``pyc10d.threads``).
"""

from __future__ import annotations

import sys
import threading
from datetime import timedelta

import torch

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64]
SIZES = [1, 17, 1000, 300_000]


def mix(dist: object, rank: int, world: int) -> None:
    """60 collectives, every result checked (a wrong one raises, and the exit code says so)."""
    for i in range(60):
        dt, n, k, root = DTYPES[i % len(DTYPES)], SIZES[i % len(SIZES)], i % 6, i % world
        n -= n % world
        n = max(n, world)
        x = torch.full((n,), rank + 1, dtype=dt)
        if k == 0:
            dist.all_reduce(x)
            want = torch.full((n,), world * (world + 1) // 2, dtype=dt)
        elif k == 1:
            dist.broadcast(x, src=root)
            want = torch.full((n,), root + 1, dtype=dt)
        elif k == 2:
            out = torch.empty(n * world, dtype=dt)
            dist.all_gather_into_tensor(out, x)
            x, want = out, torch.arange(1, world + 1, dtype=dt).repeat_interleave(n)
        elif k == 3:
            out = torch.empty(n // world, dtype=dt)
            dist.reduce_scatter_tensor(out, x)
            x, want = out, torch.full((n // world,), world * (world + 1) // 2, dtype=dt)
        elif k == 4:
            out = torch.empty(n, dtype=dt)
            dist.all_to_all_single(out, x)
            x, want = out, torch.arange(1, world + 1, dtype=dt).repeat_interleave(n // world)
        else:
            dist.barrier()
            continue
        if not torch.equal(x, want):
            raise AssertionError(f"rank {rank}: collective {i} ({k}) of {dt} x {n} gave a wrong result")


def threaded_ranks(world: int = 8) -> None:
    import pyc10d as dist

    store = dist.HashStore()
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        try:
            dist.init_process_group("threaded", rank=r, world_size=world, store=store)
            mix(dist, r, world)
            dist.destroy_process_group()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    ranks = [threading.Thread(target=rank_main, args=(r,), name=f"rank{r}") for r in range(world)]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join()
    if errors:
        raise errors[0]


def launched_rank(backend: str) -> None:
    if backend.startswith("pyc10d_"):
        import torch.distributed as dist

        import pyc10d.torch_backend  # registers pyc10d's backends with torch
    else:
        import pyc10d as dist  # type: ignore[no-redef]
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    mix(dist, rank, world)

    import pyc10d
    from pyc10d.process_group import ProcessGroup, make_engine

    plugin = backend.startswith("pyc10d_")
    engine_backend = backend.removeprefix("pyc10d_")
    if plugin:
        from pyc10d.torch_backend import TorchProcessGroup

        default_store = dist.distributed_c10d._get_default_store()
    else:
        from pyc10d.groups import _get_default_store

        default_store = _get_default_store()
    store = pyc10d.PrefixStore("dropped", default_store)
    engine = make_engine(engine_backend, store, rank, world, timedelta(seconds=20), "dropped")
    if plugin:
        held = [TorchProcessGroup(engine, rank, world, backend)]
    else:
        held = [ProcessGroup(rank, world, engine=engine, group_name="dropped")]
    del engine
    x = torch.full((300_000,), 1.0)
    held[0].allreduce([x]).wait()
    if x[0].item() != world:
        raise AssertionError(f"rank {rank}: all_reduce on the second group gave {x[0].item()}")
    threading.Thread(target=held.clear, daemon=True, name="user-drop").start()


if __name__ == "__main__":
    if sys.argv[1] == "threaded":
        threaded_ranks()
    else:
        launched_rank(sys.argv[1])
