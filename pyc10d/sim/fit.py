"""Fit the simulator to this host and check it: parameters from a tcp ping-pong between two
ranks (a broadcast from each in turn: one message each way, through the path collectives
take) and from one timed reduction, never from the collectives compared afterwards; then
all_reduce at n = 2, 4, 8 tcp ranks (processes) measured here beside the simulation of the
same algorithm with the fitted parameters.

On one host every message is CPU work on both ends (loopback), so the fitted ``Net`` puts
all ranks on one host with this machine's cores, with no NIC term. One way of the ping-pong
is ``2·o + local_latency + bytes·cpu_beta``: the per-message work of the two sides runs one
after the other, their copies at the same time (the receiver copies out of the socket buffer
while the sender still fills it), so a rank that sends and receives at once pays two copies:
on this loopback a C program moves 512 KiB each way in turn in 193 µs and 1 MiB each way at
once in 430-630 µs. ``o`` and ``cpu_beta`` come from the ping-pong between two ranks (a CPU
each) at 8 B and 1 MiB. (A ping-ping, both sending at once, fitted ``cpu_beta`` worse: its
1 MiB took 620-640 µs, twice a 1 MiB all_reduce's two 512 KiB exchanges, and put the
simulated n = 2 1 MiB all_reduce at 1.7-1.9x the measured against 1.5-1.6x.)
At n ranks the ping-pong runs in n/2 pairs at once (each pair a group of its own); with more
ranks than cores a waiting rank gives its CPU away (``transport.tcp.owner.spin_yields``) and
runs again only when the scheduler gets to it, so its 8 B one way takes longer than at n = 2 by a
delay that is not CPU work of either rank: that difference is ``local_latency`` at n. (Fitted
as CPU work instead, ``o`` = half the pairs' 8 B one way, the simulated n = 8 small
all_reduce came out 3.2-3.5x the measured: 8 ranks queued for 2 simulated cores.)
"""

from __future__ import annotations

import gc
import json
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

PINGPONG = [8, 1 << 20]
SIZES = [8, 4 << 10, 1 << 20]
WORLDS = [2, 4, 8]


def _rank(rank: int, n: int, path: str, job: str, out: Any) -> None:
    # The parent's heap stays out of this rank's collections (``measure`` forks with the
    # collector off): a finalizer of the parent's objects may wait on a lock one of its
    # threads held at the fork (seen once: a rank stuck "Garbage-collecting" in a barrier).
    gc.freeze()
    gc.enable()
    import pyc10d as dist

    # One thread of torch's per rank: forked from a process whose pool was sized for the whole
    # machine, each rank's 1 MiB add spread over every core, and n=2 all_reduce 1 MiB took
    # 7.4 ms against 0.67 ms with one thread (launchers set OMP_NUM_THREADS=1 for that reason).
    torch.set_num_threads(1)
    dist.init_process_group("tcp", init_method=f"file://{path}", rank=rank, world_size=n)
    pair = [dist.new_group([i, i + 1]) for i in range(0, n - 1, 2)] if job == "pingpong" else []
    me = pair[rank // 2] if rank // 2 < len(pair) else None
    res: dict[Any, Any] = {}
    wrong = 0
    for s in PINGPONG if job == "pingpong" else SIZES:
        t, back = torch.empty(max(1, s // 4)), torch.empty(max(1, s // 4))
        reps = 100 if s < (1 << 20) else 30
        times = []
        for i in range(reps + 3):
            t.fill_(float(rank + 1 + i))  # each call starts from this rank's own values
            back.fill_(-1.0)
            dist.barrier()
            t0 = time.perf_counter()
            if job == "pingpong":  # through the path the collectives take (tcp's lane)
                if me is not None:  # the even rank's values there, and back into its ``back``
                    dist.broadcast(t, src=rank & ~1, group=me)
                    dist.broadcast(back if rank % 2 == 0 else t, src=rank | 1, group=me)
            else:
                dist.all_reduce(t)
            if i >= 3:
                times.append(time.perf_counter() - t0)
            # checked outside the timing: the round trip's values; the sum of every rank's
            if job == "pingpong":
                ok = me is None or bool(torch.all((back if rank % 2 == 0 else t) == float((rank & ~1) + 1 + i)))
            else:
                ok = bool(torch.all(t == float(n * (n + 1) // 2 + n * i)))
            wrong += not ok
        res[s] = statistics.median(times)
    res["wrong"] = wrong
    out.put((rank, res))
    dist.destroy_process_group()


def measure(job: str, n: int) -> dict[int, float]:
    """Median seconds per call at each size (rank 0's view; a ping-pong: one way)."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank, args=(r, n, path, job, out)) for r in range(n)]
        gc.collect()
        gc.disable()
        try:
            for p in procs:
                p.start()
        finally:
            gc.enable()
        got = dict(out.get(timeout=300) for _ in range(n))
        for p in procs:
            p.join(30)
    wrong = {r: got[r].pop("wrong") for r in got}
    bad = {r: w for r, w in wrong.items() if w}
    if bad:
        raise RuntimeError(f"sim --fit: {job} at n={n} gave wrong results on ranks {bad} (calls per rank)")
    res = got[0]
    return {s: t / 2 for s, t in res.items()} if job == "pingpong" else res


def fit_gamma() -> float:
    """Seconds per byte of a 1 MiB float32 add on one thread (what each rank runs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.ones(1 << 20), torch.ones(1 << 20)
        for _ in range(3):
            torch.add(a, b, out=a)
        t0 = time.perf_counter()
        for _ in range(20):
            torch.add(a, b, out=a)
        return (time.perf_counter() - t0) / 20 / a.nbytes
    finally:
        torch.set_num_threads(threads)


def fitted_net(n: int, fit: dict[str, Any]) -> Net:
    """The model of ``n`` ranks on this host (see the module)."""
    two, here = fit["pingpong"][2], fit["pingpong"][n]
    small, big = min(two), max(two)
    return Net(ranks_per_host=n, cores_per_host=fit["cores"], latency=0.0,
               local_latency=max(here[small] - two[small], 0.0), o=two[small] / 2, nic_beta=0.0,
               cpu_beta=max(two[big] - two[small], 0.0) / (big - small), gamma=fit["gamma"])


def measure_all() -> dict[str, Any]:
    """Every measurement the fit and the check use (seconds; JSON-able)."""
    fit: dict[str, Any] = {"pingpong": {n: measure("pingpong", n) for n in WORLDS},
                           "allreduce": {n: measure("allreduce", n) for n in WORLDS}}
    # after the forks: a forked child of a process that ran torch's thread pool can hang in
    # its first parallel kernel
    fit["gamma"] = fit_gamma()
    fit["cores"] = usable_cpus()
    return fit


def _keys_to_int(d: Any) -> Any:
    if isinstance(d, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: _keys_to_int(v) for k, v in d.items()}
    return d


def validate(saved: str | None = None, save: str | None = None) -> list[dict]:
    """Measure (or load ``saved``: a previous run's ``save``), fit, simulate, compare."""
    if saved:
        with open(saved) as f:
            fit = _keys_to_int(json.load(f))
    else:
        fit = measure_all()
    if save:
        with open(save, "w") as f:
            json.dump(fit, f, indent=1)
    for n in WORLDS:
        print(f"ping-pong one way, tcp, {n} processes in pairs: "
              + ", ".join(f"{s} B {t * 1e6:.0f} us" for s, t in fit["pingpong"][n].items()))
    print(f"reduction {1 / fit['gamma'] / 1e9:.2f} GB/s; {fit['cores']} cores")
    rows = []
    print("| n | size | algorithm | measured | simulated | sim / measured |")
    print("| --- | --- | --- | --- | --- | --- |")
    nets = {n: fitted_net(n, fit) for n in WORLDS}
    for n, net in nets.items():
        got = fit["allreduce"][n]
        for s in SIZES:
            fn = algo.select("allreduce", n, (max(1, s // 4)) * 4)
            sim = outcome("allreduce", fn, n, max(1, s // 4) * 4, net).seconds
            rows.append({"n": n, "bytes": s, "algorithm": fn.__name__, "measured": got[s], "sim": sim})
            print(f"| {n} | {s} | {fn.__name__} | {got[s] * 1e6:.0f} us | {sim * 1e6:.0f} us | "
                  f"{sim / got[s]:.2f} |", flush=True)
    for n, net in nets.items():
        print(f"fitted (n={n}): {net}")
    return rows
