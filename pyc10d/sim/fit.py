"""Fit the simulator to this host and check it: parameters from a tcp ping-pong between two
ranks (a broadcast from each in turn: one message each way, through the path collectives
take) and from one timed reduction, never from the collectives compared afterwards; then
all_reduce at n = 2, 4, 8 tcp ranks (processes) measured here beside the simulation of the
same algorithm with the fitted parameters.

On one host every message is CPU work on both ends (loopback), so the fitted ``Net`` puts
all ranks on one host with this machine's cores: ``o`` and ``cpu_beta`` per side are half
of the ping-pong's one-way cost per message and per byte, there is no NIC term.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import tempfile
import time
from typing import Any

import torch

from .. import algorithms as algo
from ..transport.cpus import usable_cpus
from .network import Net
from .table import outcome

# 64 KiB is left out on purpose: on this loopback a 64 KiB message (header and payload in
# one send) took 3-4 ms one way against 1.2 ms for 1 MiB, an artefact no linear model fits.
PINGPONG = [8, 4 << 10, 256 << 10, 1 << 20]
SIZES = [8, 4 << 10, 1 << 20]
WORLDS = [2, 4, 8]


def _rank(rank: int, n: int, path: str, job: str, out: Any) -> None:
    import pyc10d as dist

    # One thread of torch's per rank: forked from a process whose pool was sized for the whole
    # machine, each rank's 1 MiB add spread over every core, and n=2 all_reduce 1 MiB took
    # 7.4 ms against 0.67 ms with one thread (launchers set OMP_NUM_THREADS=1 for that reason).
    torch.set_num_threads(1)
    dist.init_process_group("tcp", init_method=f"file://{path}", rank=rank, world_size=n)
    res = {}
    for s in PINGPONG if job == "pingpong" else SIZES:
        t = torch.ones(max(1, s // 4))
        reps = 40 if s < (1 << 20) else 12
        times = []
        for i in range(reps + 3):
            dist.barrier()
            t0 = time.perf_counter()
            if job == "pingpong":  # through the path the collectives take (tcp's lane)
                dist.broadcast(t, src=0)
                dist.broadcast(t, src=1)
            else:
                dist.all_reduce(t)
            if i >= 3:
                times.append(time.perf_counter() - t0)
        res[s] = statistics.median(times)
    out.put((rank, res))
    dist.destroy_process_group()


def measure(job: str, n: int) -> dict[int, float]:
    """Median seconds per call at each size (rank 0's view; a ping-pong: one way)."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank, args=(r, n, path, job, out)) for r in range(n)]
        for p in procs:
            p.start()
        got = dict(out.get(timeout=300) for _ in range(n))
        for p in procs:
            p.join(30)
    res = got[0]
    return {s: t / 2 for s, t in res.items()} if job == "pingpong" else res


def fit_gamma() -> float:
    a, b = torch.ones(1 << 20), torch.ones(1 << 20)
    for _ in range(3):
        torch.add(a, b, out=a)
    t0 = time.perf_counter()
    for _ in range(20):
        torch.add(a, b, out=a)
    return (time.perf_counter() - t0) / 20 / a.nbytes


def fitted_net(n: int, one_way: dict[int, float], gamma: float) -> Net:
    """One way = 2·o + bytes·2·cpu_beta, least squares over the ping-pong sizes."""
    xs, ys = list(one_way), [one_way[s] for s in one_way]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - k * mx
    return Net(ranks_per_host=n, cores_per_host=usable_cpus(), latency=0.0, local_latency=0.0,
               o=max(a, 0.0) / 2, nic_beta=0.0, cpu_beta=max(k, 0.0) / 2, gamma=gamma)


def validate() -> list[dict]:
    one_way = measure("pingpong", 2)
    measured = {n: measure("allreduce", n) for n in WORLDS}
    gamma = fit_gamma()  # after the forks: a forked child of a process that ran torch's
    # thread pool can hang in its first parallel kernel
    print("ping-pong one way (tcp, 2 processes): "
          + ", ".join(f"{s} B {t * 1e6:.0f} us" for s, t in one_way.items())
          + f"; reduction {1 / gamma / 1e9:.2f} GB/s")
    rows = []
    print("| n | size | algorithm | measured | simulated | sim / measured |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in WORLDS:
        net = fitted_net(n, one_way, gamma)
        got = measured[n]
        for s in SIZES:
            fn = algo.select("allreduce", n, (max(1, s // 4)) * 4)
            sim = outcome("allreduce", fn, n, max(1, s // 4) * 4, net).seconds
            rows.append({"n": n, "bytes": s, "algorithm": fn.__name__, "measured": got[s], "sim": sim})
            print(f"| {n} | {s} | {fn.__name__} | {got[s] * 1e6:.0f} us | {sim * 1e6:.0f} us | "
                  f"{sim / got[s]:.2f} |", flush=True)
    print(f"fitted: {fitted_net(2, one_way, gamma)}")
    return rows
