"""``ray.util.collective`` between actors, on pyc10d's backend and on Ray's Gloo backend in
the same run. ``python collective.py ITERS OUT.json`` on a Ray cluster (``RAY_ADDRESS``).

Four actors of one CPU each (two per node). For each backend (``PYC10D``, registered by
``pyc10d.integrations.ray.register()`` in the driver and in every actor, and Ray's ``GLOO``):
a group of the four, then at each size an all-reduce checked against the sum every actor can
compute (a broadcast and an all-gather too, checked), then K all-reduces back to back from a
poisoned buffer (time of the K / K, the slowest actor), the result checked after the loop.
"""

from __future__ import annotations

import json
import sys
import time

import ray
import ray.util.collective as col
import torch

SIZES = [8, 64 * 1024, 1024 * 1024]  # bytes
WORLD = 4


@ray.remote(num_cpus=1)
class Member:
    def __init__(self, rank: int) -> None:
        from pyc10d.integrations import ray as pyc10d_ray

        pyc10d_ray.register()
        self.rank = rank

    def host(self) -> str:
        import socket

        return socket.gethostname()

    def join(self, backend: str, group: str) -> None:
        col.init_collective_group(WORLD, self.rank, backend=backend, group_name=group)

    def check(self, group: str) -> list[str]:
        problems = []
        t = torch.arange(6, dtype=torch.float32) + self.rank
        col.allreduce(t, group_name=group)
        want = torch.arange(6, dtype=torch.float32) * WORLD + sum(range(WORLD))
        if not torch.equal(t, want):
            problems.append(f"allreduce: {t.tolist()} != {want.tolist()}")
        b = torch.full((3,), float(self.rank))
        col.broadcast(b, src_rank=1, group_name=group)
        if not torch.equal(b, torch.full((3,), 1.0)):
            problems.append(f"broadcast from 1: {b.tolist()}")
        outs = [torch.zeros(2) for _ in range(WORLD)]
        col.allgather(outs, torch.full((2,), float(self.rank)), group_name=group)
        if [o.tolist() for o in outs] != [[float(r)] * 2 for r in range(WORLD)]:
            problems.append(f"allgather: {[o.tolist() for o in outs]}")
        return [f"rank {self.rank}: {p}" for p in problems]

    def time_allreduce(self, group: str, nbytes: int, iters: int) -> tuple[float, bool]:
        n = max(nbytes // 4, 1)
        x = torch.full((n,), float(self.rank + 1))
        col.allreduce(x, group_name=group)  # warm up
        col.barrier(group_name=group)
        x.fill_(-1.0)  # poisoned: a loop that does nothing leaves -1 or a wrong power
        start = time.perf_counter()
        for _ in range(iters):
            col.allreduce(x, group_name=group)
        took = (time.perf_counter() - start) / iters
        # from -1, each all-reduce multiplies by WORLD: (-1) * WORLD**iters
        ok = bool(torch.all(x == -float(WORLD) ** iters))
        return took, ok


def main() -> None:
    from pyc10d.integrations import ray as pyc10d_ray

    iters, out = int(sys.argv[1]), sys.argv[2]
    ray.init()
    pyc10d_ray.register()
    members = [Member.remote(r) for r in range(WORLD)]
    result: dict = {"hosts": ray.get([m.host.remote() for m in members]), "backends": {}}
    for backend in ("PYC10D", "GLOO"):
        group = f"g_{backend.lower()}"
        ray.get([m.join.remote(backend, group) for m in members])
        problems = sum(ray.get([m.check.remote(group) for m in members]), [])
        rows = []
        for nbytes in SIZES:
            got = ray.get([m.time_allreduce.remote(group, nbytes, iters) for m in members])
            rows.append({"bytes": nbytes, "us": max(t for t, _ in got) * 1e6, "ok": all(ok for _, ok in got)})
        result["backends"][backend] = {"problems": problems, "allreduce": rows}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
