"""Chaos trials: a rank is SIGKILLed at a random point of a random sequence of collectives.

``python tests/chaos.py --trials 500`` (``make chaos``) runs the full suite and prints a table;
``tests/test_chaos.py`` runs a few trials inside ``make test``. Each trial:

* forks ``world`` ranks (3 or 4) of ``tcp`` or ``shm`` over a FileStore (the store outlives
  any rank, as a launcher's or a cluster's does) with a 60 s group timeout, so that every
  failure must come from failure detection, never from a timeout;
* every rank runs the same seeded sequence of collectives (sizes from 4 elements to 1 MiB)
  and checks every result against values computed locally;
* the victim arms a timer when it enters the chosen collective and SIGKILLs itself after a
  random delay of 0-3 ms: inside that collective or one of the next ones (or, if it got
  through the whole sequence first, before the closing barrier).

With ``--backends pyc10d_shm,pyc10d_tcp`` the ranks run torch's own DDP or FSDP2 training
through ``torch.distributed`` on pyc10d's plugin instead (``tests/chaos_plugin.py``), the
victim SIGKILLed 0-10 ms into a random training step.

A trial passes when every survivor raises within ``--deadline`` seconds (3) of the death with
an error naming the dead rank, no rank returns a wrong result as success, and nothing new
is left in ``/dev/shm``. A survivor still running 15 s after the death counts as a hang.
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import torch

import pyc10d as dist
from pyc10d.transport.shm.segment import created_by

FORK = multiprocessing.get_context("fork")
OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
       "all_to_all_single", "reduce", "barrier")
SIZES = (4, 1000, 65536, 262144)  # float32 elements: 16 B to 1 MiB
HANG_S = 15.0


@dataclass
class Trial:
    seed: int
    backend: str
    world: int
    victim: int
    kill_at: int
    delay_s: float
    ops: list[tuple[str, int, int]] = field(default_factory=list)  # (op, numel, root)
    workload: str = "collectives"  # or the plugin's "ddp" / "fsdp" (``chaos_plugin``)
    steps: int = 0

    @staticmethod
    def make(seed: int, backend: str) -> Trial:
        rng = random.Random(seed)
        world = rng.choice((3, 4))
        if backend.startswith("pyc10d_"):
            from chaos_plugin import make
            return Trial(seed, backend, world, rng.randrange(world), **make(rng))
        ops = [(rng.choice(OPS), rng.choice(SIZES) // world * world, rng.randrange(world))
               for _ in range(rng.randint(6, 14))]
        return Trial(seed, backend, world, rng.randrange(world), rng.randrange(len(ops) - 2),
                     rng.uniform(0.0, 0.003), ops)


def _value(rank: int, step: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) % 7 + (rank + 1) * (step + 1)


def _run_op(op: str, n: int, root: int, rank: int, world: int, step: int) -> str | None:
    """Run one collective; return a description of a wrong result, or None."""
    x = _value(rank, step, n)
    total = sum(_value(r, step, n) for r in range(world))
    if op == "all_reduce":
        dist.all_reduce(x)
        ok = torch.equal(x, total)
    elif op == "reduce":
        dist.reduce(x, dst=root)
        ok = torch.equal(x, total) if rank == root else True
    elif op == "broadcast":
        dist.broadcast(x, src=root)
        ok = torch.equal(x, _value(root, step, n))
    elif op == "all_gather_into_tensor":
        out = torch.empty(n * world)
        dist.all_gather_into_tensor(out, x)
        ok = torch.equal(out, torch.cat([_value(r, step, n) for r in range(world)]))
    elif op == "reduce_scatter_tensor":
        out = torch.empty(n // world)
        dist.reduce_scatter_tensor(out, x)
        ok = torch.equal(out, total.chunk(world)[rank])
    elif op == "all_to_all_single":
        out = torch.empty(n)
        dist.all_to_all_single(out, x)
        ok = torch.equal(out, torch.cat([_value(r, step, n).chunk(world)[rank] for r in range(world)]))
    else:
        dist.barrier()
        ok = True
    return None if ok else f"{op} #{step + 1} (numel {n}, root {root}) returned a wrong result"


def _collectives_main(trial: Trial, rank: int, store_path: str) -> tuple:
    """One rank of a native trial: the seeded sequence of checked collectives."""
    store = dist.FileStore(store_path, trial.world)
    dist.init_process_group(trial.backend, store=store, rank=rank, world_size=trial.world,
                            timeout=timedelta(seconds=60))
    dist.barrier()
    for step, (op, n, root) in enumerate(trial.ops):
        if rank == trial.victim and step == trial.kill_at:
            threading.Timer(trial.delay_s, os.kill, (os.getpid(), signal.SIGKILL)).start()
        wrong = _run_op(op, n, root, rank, trial.world, step)
        if wrong:
            return ("wrong", wrong)
    if rank == trial.victim:  # the timer did not fire in time: die before the last barrier
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return ("ok", "")


def _rank_main(trial: Trial, rank: int, store_path: str, conn: multiprocessing.connection.Connection) -> None:
    torch.set_num_threads(1)
    stacks = open(f"{store_path}.stack{rank}", "w")  # lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True, chain=False)
    result: tuple
    try:
        if trial.workload == "collectives":
            result = (*_collectives_main(trial, rank, store_path), time.time())
        else:
            from chaos_plugin import rank_main
            result = (*rank_main(trial, rank, store_path), time.time())
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        result = ("error", f"{type(e).__name__}: {e}", time.time())
    try:
        conn.send_bytes(pickle.dumps(result))
    finally:
        atexit._run_exitfuncs()  # as a process that ends normally would (fork children skip it)
        os._exit(0)


def run_trial(trial: Trial, deadline_s: float = 3.0) -> dict:
    """Run one trial; return its verdict (``ok`` and, when not ok, ``why``)."""
    tmp = tempfile.mkdtemp(prefix="pyc10d-chaos-")
    procs, conns = [], {}
    for rank in range(trial.world):
        recv_end, send_end = FORK.Pipe(duplex=False)
        p = FORK.Process(target=_rank_main, args=(trial, rank, os.path.join(tmp, "store"), send_end), daemon=True)
        p.start()
        send_end.close()
        procs.append(p)
        conns[recv_end] = rank
    victim = procs[trial.victim]
    results: dict[int, tuple] = {}
    died_at: float | None = None
    start = time.monotonic()
    waiting = {**conns, victim.sentinel: -1}
    while waiting:
        limit = (died_at + HANG_S - time.time()) if died_at else (start + HANG_S + 30 - time.monotonic())
        if limit <= 0:
            break
        for ready in multiprocessing.connection.wait(list(waiting), timeout=limit):
            rank = waiting.pop(ready)
            if rank == -1:
                died_at = time.time()
                continue
            try:
                results[rank] = pickle.loads(ready.recv_bytes())
            except (EOFError, OSError):
                results[rank] = ("died", "", time.time())
    stuck = {}
    for rank, p in enumerate(procs):
        if p.is_alive():
            os.kill(p.pid, signal.SIGUSR1)
            time.sleep(0.5)
            with open(os.path.join(tmp, f"store.stack{rank}")) as f:
                stuck[rank] = f.read()
            p.kill()
        p.join(timeout=5)
    for c in conns:
        c.close()
    shutil.rmtree(tmp, ignore_errors=True)
    time.sleep(0.05)
    leaked = created_by(*(p.pid for p in procs))
    verdict: dict = {"seed": trial.seed, "backend": trial.backend, "world": trial.world,
                     "victim": trial.victim, "ok": True, "why": "", "slowest_s": 0.0, "leaked": sorted(leaked)}
    problems = []
    if victim.exitcode != -signal.SIGKILL:
        problems.append(("no kill", f"victim exit code {victim.exitcode}: {results.get(trial.victim)}"))
    for rank in range(trial.world):
        if rank == trial.victim:
            continue
        res = results.get(rank)
        if res is None:
            problems.append(("hang", f"rank {rank} still running {HANG_S:.0f}s after rank {trial.victim} died; "
                                     f"its stacks:\n{stuck.get(rank, '')}"))
        elif res[0] == "wrong":
            problems.append(("wrong result", f"rank {rank}: {res[1]}"))
        elif res[0] == "ok":
            problems.append(("no error", f"rank {rank} finished although rank {trial.victim} died"))
        elif res[0] == "died":
            problems.append(("died", f"rank {rank} died without reporting"))
        else:
            took = res[2] - (died_at or res[2])
            verdict["slowest_s"] = max(verdict["slowest_s"], took)
            if f"rank {trial.victim}" not in res[1]:
                problems.append(("wrong blame", f"rank {rank}: {res[1][:400]}"))
            elif took > deadline_s:
                problems.append(("slow", f"rank {rank} raised {took:.1f}s after the death"))
    if leaked:
        problems.append(("leak", f"left in /dev/shm: {sorted(leaked)}"))
    if problems:
        verdict["ok"] = False
        verdict["kind"] = problems[0][0]
        verdict["why"] = "; ".join(f"{k}: {w}" for k, w in problems)
    return verdict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backends", default="tcp,shm")
    ap.add_argument("--deadline", type=float, default=3.0)
    args = ap.parse_args(argv)
    backends = args.backends.split(",")
    table: dict[tuple[str, int], Counter] = {}
    failures = []
    t0 = time.monotonic()
    for i in range(args.trials):
        trial = Trial.make(args.seed * 1_000_003 + i, backends[i % len(backends)])
        v = run_trial(trial, args.deadline)
        label = trial.backend if trial.workload == "collectives" else f"{trial.backend}:{trial.workload}"
        row = table.setdefault((label, trial.world), Counter())
        row["trials"] += 1
        row["ok" if v["ok"] else v["kind"]] += 1
        row["max_s"] = max(row["max_s"], int(v["slowest_s"] * 1000))
        if not v["ok"]:
            failures.append(v)
            print(f"trial {i} (seed {trial.seed}, {trial.backend}, world {trial.world}, victim {trial.victim}): "
                  f"{v['why']}", flush=True)
    kinds = ["hang", "wrong result", "no error", "wrong blame", "slow", "leak", "died", "no kill"]
    print(f"\n{args.trials} chaos trials in {time.monotonic() - t0:.0f}s "
          f"(deadline {args.deadline:.0f}s after the death)")
    print(f"{'backend':16} {'world':>5} {'trials':>6} {'ok':>5} " + " ".join(f"{k:>12}" for k in kinds)
          + f" {'slowest s':>9}")
    for (backend, world), row in sorted(table.items()):
        print(f"{backend:16} {world:>5} {row['trials']:>6} {row['ok']:>5} "
              + " ".join(f"{row[k]:>12}" for k in kinds) + f" {row['max_s'] / 1000:>9.2f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
