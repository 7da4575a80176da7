"""One-sided windows: ``put`` + ``signal`` against a two-sided ``send``/``recv``, one way, 2 ranks.

``python -m pyc10d.bench.window [--sizes 8,1048576] [--rounds 3]`` launches 2-rank jobs on
this host, alternating them round by round, and times a ping-pong in each: rank 0 hands
rank 1 a message, rank 1 hands one back, ``--iters`` times back to back; the figure is the
loop's time / (2 x iters), the slower rank's, the median of ``--loops`` loops (one way: what
one message costs from the writer's call to the reader holding the data).

* ``put_signal`` (pyc10d, shm and tcp): ``win.put(src, peer, 0)`` + ``win.signal(peer)``;
  the reader's ``win.wait_signal(writer)`` returns with the data in its registered tensor
  (``pyc10d/window/``: on shm the put is a copy into the peer's memory, on tcp one message
  its receiving thread writes into the tensor).
* ``send_recv``: ``send(src, peer)`` and ``recv(dst, writer)``, on pyc10d (shm, tcp), on
  torch's Gloo, and on Open MPI through mpi4py (``Send``/``Recv`` of numpy buffers, under its
  own ``mpirun``; ``--no-mpi`` leaves it out): the C reference of a two-sided message.

Every message is checked: the writer stamps its first and last element with the message's
number before sending it, the reader compares both with what it expects when it has the
data (after ``wait_signal`` or ``recv``), and the buffers start each loop poisoned (-1): a
call that moved nothing leaves a stale or poisoned stamp, counted in ``wrong`` and failing
the run. Writes ``<out>/window-<time>.json`` and a bar chart beside it (with matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyc10d.bench.launch import finish_job, run_worker
from pyc10d.bench.report import cli_args, finish, pyplot

MODULE = "pyc10d.bench.window"  # (``__name__`` is ``__main__`` when run with ``-m``)
#: job -> the (op) rows it times
JOBS = {"shm": ("put_signal", "send_recv"), "tcp": ("put_signal", "send_recv"), "gloo": ("send_recv",),
        "mpi": ("send_recv",)}


def _pingpong(rank: int, nbytes: int, move: Callable[[Any, int], None], recv_buf: Any, send_buf: Any
              ) -> tuple[Callable[[int], None], Callable[[], int]]:
    """(body(i): one round trip, wrong()): ``move(buf, i)`` sends (rank 0 first) or waits."""
    n = max(nbytes // 4, 1)
    wrong = [0]
    rnp, snp = recv_buf[:n], send_buf[:n]

    def stamp(i: int, sender: int) -> float:
        return float(2 * i + sender + 1)

    def body(i: int) -> None:
        for sender in (0, 1):
            if rank == sender:
                snp[0] = snp[n - 1] = stamp(i, sender)
                move("send", i)
            else:
                move("recv", i)
                want = stamp(i, sender)
                if rnp[0] != want or rnp[n - 1] != want:
                    wrong[0] += 1

    return body, lambda: wrong[0]


def _loops(nbytes: int, make: Callable[[], tuple[Callable, Callable, Any]], iters: int,
           loops: int, timer: Callable[[Callable[[int], None], int], float]) -> dict[str, Any]:
    times, wrong = [], 0
    for _ in range(loops):
        body, wrong_of, poison = make()
        poison()
        times.append(timer(body, iters) / 2)  # a round trip is two messages
        wrong += wrong_of()
    return {"bytes": nbytes, "us": 1e6 * statistics.median(times), "loops_us": [1e6 * t for t in times],
            "wrong": wrong}


def _torch_worker(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from pyc10d.bench.timing import back_to_back

    if args.impl == "gloo":
        import torch.distributed as dist
        dist.init_process_group("gloo")
    else:
        import pyc10d as dist
        dist.init_process_group(args.impl)
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    records = []
    for nbytes in args.sizes:
        n = max(nbytes // 4, 1)
        for op in JOBS[args.impl]:
            def make(op: str = op, n: int = n, nbytes: int = nbytes) -> tuple[Callable, Callable, Any]:
                recv_t, send_t = torch.full((n,), -1.0), torch.full((n,), -1.0)
                recv_np, send_np = recv_t.numpy(), send_t.numpy()
                if op == "put_signal":
                    win = dist._new_window(recv_t)
                    recv_np = recv_t.numpy()  # (registering moved its memory: view it again)

                    def move(what: str, i: int) -> None:
                        if what == "send":
                            win.put(send_t, peer, 0)
                            win.signal(peer)
                        else:
                            win.wait_signal(peer)
                else:
                    def move(what: str, i: int) -> None:
                        if what == "send":
                            dist.send(send_t, peer)
                        else:
                            dist.recv(recv_t, peer)
                body, wrong = _pingpong(rank, nbytes, move, recv_np, send_np)
                return body, wrong, lambda: (recv_t.fill_(-1.0), dist.barrier())

            rec = _loops(nbytes, make, args.iters, args.loops,
                         lambda body, k: back_to_back(dist, body, k))
            records.append({"impl": args.impl, "op": op, **rec})
    dist.destroy_process_group()
    return records


def _mpi_worker(args: argparse.Namespace) -> list[dict[str, Any]]:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()

    def timer(body: Callable[[int], None], k: int) -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        for i in range(k):
            body(i)
        return float(comm.allreduce((time.perf_counter() - t0) / k, op=MPI.MAX))

    records = []
    for nbytes in args.sizes:
        n = max(nbytes // 4, 1)

        def make(n: int = n, nbytes: int = nbytes) -> tuple[Callable, Callable, Any]:
            recv_np, send_np = np.full(n, -1.0, np.float32), np.full(n, -1.0, np.float32)

            def move(what: str, i: int) -> None:
                if what == "send":
                    comm.Send(send_np, dest=peer)
                else:
                    comm.Recv(recv_np, source=peer)
            body, wrong = _pingpong(rank, nbytes, move, recv_np, send_np)
            return body, wrong, lambda: (recv_np.fill(-1.0), comm.Barrier())

        records.append({"impl": "mpi", "op": "send_recv", **_loops(nbytes, make, args.iters, args.loops, timer)})
    return records


def worker(args: argparse.Namespace) -> None:
    records = _mpi_worker(args) if args.impl == "mpi" else _torch_worker(args)
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if rank == 0:
        Path(args.out).write_text(json.dumps(records))


def _run_mpi(args: argparse.Namespace, out: Path) -> Any:
    from pyc10d.bench.__main__ import mpirun

    cmd = [mpirun(), "--oversubscribe", "-np", "2", sys.executable, "-m", MODULE, "--worker", "--impl", "mpi",
           "--sizes", ",".join(map(str, args.sizes)), "--iters", str(args.iters), "--loops", str(args.loops),
           "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    code = finish_job(subprocess.Popen(cmd, env=env), args.timeout)
    if code != 0 or not out.exists():
        return f"exit code {code}"
    return json.loads(out.read_text())


def _plot(rows: list[dict[str, Any]], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    sizes = sorted({r["bytes"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4))
    for ax, size in zip(axes if len(sizes) > 1 else [axes], sizes):
        here = [r for r in rows if r["bytes"] == size]
        ax.bar([f"{r['impl']}\n{r['op']}" for r in here], [r["us"] for r in here])
        ax.set_title(f"{size} B, one way (us, lower is better)")
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="one-sided put+signal vs send/recv")
    p.add_argument("--sizes", default="8,1048576", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--loops", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", default=",".join(JOBS))
    p.add_argument("--no-mpi", action="store_true")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="shm", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    jobs = [j for j in args.jobs.split(",") if not (j == "mpi" and args.no_mpi)]
    rounds: dict[tuple[str, str, int], list[float]] = {}
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pyc10d-window-bench-") as tmp:
        for rnd in range(args.rounds):
            for job in jobs:  # alternated: every round runs each job once, in turn
                out = Path(tmp) / f"{job}-{rnd}.json"
                got = _run_mpi(args, out) if job == "mpi" else run_worker(
                    MODULE, 2, ["--impl", job, "--sizes", ",".join(map(str, args.sizes)), "--iters",
                                  str(args.iters), "--loops", str(args.loops)], out, args.timeout)
                if isinstance(got, str):
                    problems.append(f"{job} round {rnd}: {got}")
                    continue
                for r in got:
                    if r["wrong"]:
                        problems.append(f"{job} {r['op']} {r['bytes']} B: {r['wrong']} messages wrong")
                    rounds.setdefault((job, r["op"], r["bytes"]), []).append(r["us"])
    rows = [{"impl": j, "op": op, "bytes": b, "us": min(v), "rounds_us": v} for (j, op, b), v in rounds.items()]
    print("one way, 2 ranks, best round of the medians (us); ratios: this row's time / put_signal's")
    for size in sorted({r["bytes"] for r in rows}):
        here = {(r["impl"], r["op"]): r["us"] for r in rows if r["bytes"] == size}
        for (impl, op), us in sorted(here.items()):
            ref = [here[k] for k in (("shm", "put_signal"), ("tcp", "put_signal")) if k in here]
            ratio = " ".join(f"{us / x:.2f}x" for x in ref)
            print(f"{size:>9} B  {impl:<5} {op:<11} {us:>9.1f}   vs shm/tcp put_signal: {ratio}")
    payload = {"args": cli_args(args), "rows": rows, "problems": problems}
    return finish(args.out, "window", payload, problems,
                  plot=lambda png: bool(rows) and _plot(rows, png))


if __name__ == "__main__":
    sys.exit(main())
