"""Chaos under torchft: replicas SIGKILLed again and again while the others train on.

``python tests/chaos_torchft.py --failures 200`` (``make chaos-torchft``) runs the long
version and prints a summary; ``tests/integrations/test_chaos_torchft.py`` runs a few failures inside
``make test``, in a fresh interpreter: the replicas are forked from the driver, which must not
carry another test's threads (torchft's Rust runtimes among them) into them. One run:

* a Lighthouse (``torchft_lighthouse``, 1 s heartbeat timeout) and ``--replicas`` (3) replica
  groups of one rank each, forked from this process, each training a small model with
  torchft's ``Manager``, ``DistributedDataParallel`` and ``OptimizerWrapper`` on
  ``ProcessGroupPyc10d`` (pyc10d's shared-memory engine: one host);
* every replica reports each step: whether it committed, the participants, when the step
  began and ended, a digest of its parameters after the step, its thread and descriptor counts;
* after 0.5-1.5 s of healthy training (every replica committing together), a random replica
  is SIGKILLed 0-50 ms into a step and forked again at once; it rejoins and heals from its
  peers.

A failure passes when a survivor commits a step begun after the death within ``--deadline``
seconds (the Lighthouse needs its heartbeat timeout to drop the dead replica) and the
restarted replica commits within 30 s. The run passes when every failure passed, every
replica that committed a step reports the same digest for it (no wrong result), no replica's
thread or descriptor count grows with the failures it lived through (no leak: its last counts
are within a small slack of its counts after its first quorum changes), and nothing is left in
``/dev/shm`` by any replica.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

FORK = multiprocessing.get_context("fork")
LIGHTHOUSE = Path(sys.executable).parent / "torchft_lighthouse"
REJOIN_S = 30.0
#: Threads and descriptors a replica may gain between its early and its last steps without
#: counting as a leak (torch's and torchft's own pools start lazily).
THREAD_SLACK, FD_SLACK = 4, 24


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.blake2b(digest_size=8)
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def replica_main(rid: int, lighthouse: str, conn: Any, step_sleep: float) -> None:
    """One replica group (one rank): trains until it is killed, reporting every step."""
    torch.set_num_threads(1)
    os.environ["RUST_LOG"] = "warn"  # torchft's manager logs every quorum at info
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper

    from pyc10d.integrations.torchft import ProcessGroupPyc10d

    store = torch.distributed.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    manager = Manager(
        pg=ProcessGroupPyc10d(timeout=timedelta(seconds=10)), min_replica_size=2,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), optimizer.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": optimizer.state_dict()},
        replica_id=f"replica_{rid}", store_addr="localhost", store_port=store.port, rank=0,
        world_size=1, lighthouse_addr=lighthouse, timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
    )
    ddp, opt = DistributedDataParallel(manager, model), OptimizerWrapper(manager, optimizer)
    gen = torch.Generator().manual_seed(rid)
    while True:
        began, before = time.time(), manager.current_step()
        x = torch.randn(4, 8, generator=gen)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        step = manager.current_step()
        conn.send((rid, os.getpid(), step, step > before, manager.num_participants(), began,
                   time.time(), _digest(model), threading.active_count(), len(os.listdir("/proc/self/fd"))))
        time.sleep(step_sleep)


def _replica_entry(rid: int, lighthouse: str, conn: Any, step_sleep: float) -> None:
    try:
        replica_main(rid, lighthouse, conn, step_sleep)
    finally:
        os._exit(1)


@dataclass
class Step:
    rid: int
    pid: int
    step: int
    committed: bool
    participants: int
    began: float
    ended: float
    digest: str
    threads: int
    fds: int


@dataclass
class Run:
    replicas: int
    step_sleep: float = 0.01
    procs: dict[int, Any] = field(default_factory=dict)
    conns: dict[Any, int] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)

    def start(self, rid: int, lighthouse: str) -> None:
        recv_end, send_end = FORK.Pipe(duplex=False)
        p = FORK.Process(target=_replica_entry, args=(rid, lighthouse, send_end, self.step_sleep), daemon=True)
        p.start()
        send_end.close()
        self.procs[rid], self.conns[recv_end] = p, rid
        self.pids.add(p.pid)

    def pump(self, until: Any, timeout: float) -> Step | None:
        """Read step reports until ``until(step)`` holds (that step) or ``timeout`` (None)."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            for ready in multiprocessing.connection.wait(list(self.conns), timeout=left):
                try:
                    rec = Step(*ready.recv())
                except (EOFError, OSError):
                    del self.conns[ready]
                    continue
                self.steps.append(rec)
                if until(rec):
                    return rec
        return None


def _healthy(run: Run, since: float) -> Any:
    """A predicate: every replica committed a step with all replicas, begun after ``since``."""
    seen: set[int] = set()

    def check(s: Step) -> bool:
        if s.committed and s.participants == run.replicas and s.began > since:
            seen.add(s.rid)
        return len(seen) == run.replicas

    return check


def chaos(failures: int, replicas: int = 3, seed: int = 1, deadline_s: float = 10.0,
          log: Any = print) -> dict[str, Any]:
    """Run ``failures`` kills; return the verdict (``ok``, ``problems``, recovery times)."""
    from pyc10d.bench.launch import free_port
    from pyc10d.transport.shm.segment import created_by

    rng = random.Random(seed)
    port = free_port()
    env = dict(os.environ, RUST_LOG="warn")
    lh = subprocess.Popen([str(LIGHTHOUSE), "--bind", f"[::]:{port}", "--min_replicas", "2",
                           "--join_timeout_ms", "200", "--heartbeat_timeout_ms", "1000"],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"http://localhost:{port}"
    run = Run(replicas)
    problems: list[str] = []
    recovery: list[float] = []
    try:
        for rid in range(replicas):
            run.start(rid, address)
        if run.pump(_healthy(run, 0.0), REJOIN_S + 30) is None:
            raise RuntimeError("the replicas never trained together")
        for i in range(failures):
            time.sleep(rng.uniform(0.5, 1.5))
            victim = rng.randrange(replicas)
            # 0-50 ms into one of the victim's steps
            run.pump(lambda s, v=victim: s.rid == v, 10)
            time.sleep(rng.uniform(0.0, 0.05))
            proc = run.procs[victim]
            killed = time.time()
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(5)
            run.start(victim, address)
            good = run.pump(lambda s, v=victim, k=killed: s.rid != v and s.committed and s.began > k,
                            deadline_s)
            if good is None:
                problems.append(f"failure {i + 1} (replica {victim}): no survivor committed a step "
                                f"within {deadline_s:.0f} s of the death (hang)")
                break
            recovery.append(good.ended - killed)
            if run.pump(_healthy(run, killed), REJOIN_S) is None:
                problems.append(f"failure {i + 1}: replica {victim} did not train with the others "
                                f"again within {REJOIN_S:.0f} s")
                break
            if (i + 1) % 20 == 0:
                log(f"{i + 1}/{failures} failures, recovery median "
                    f"{sorted(recovery)[len(recovery) // 2]:.2f} s, max {max(recovery):.2f} s")
    finally:
        for p in run.procs.values():
            if p.is_alive():
                p.kill()
            p.join(5)
        lh.kill()
        lh.wait()
    problems += _wrong_results(run.steps) + _leaks(run.steps)
    time.sleep(0.1)
    left = created_by(*run.pids)
    if left:
        problems.append(f"left in /dev/shm: {sorted(left)}")
    return {"ok": not problems, "problems": problems, "failures": len(recovery),
            "recovery_s": recovery, "steps": sum(s.committed for s in run.steps)}


def _wrong_results(steps: list[Step]) -> list[str]:
    """Replicas that committed the same step must hold the same parameters after it."""
    by_step: dict[int, dict[str, list[int]]] = {}
    for s in steps:
        if s.committed:
            by_step.setdefault(s.step, {}).setdefault(s.digest, []).append(s.rid)
    return [f"step {k}: replicas disagree on the parameters ({v})" for k, v in sorted(by_step.items()) if len(v) > 1][:5]


def _leaks(steps: list[Step]) -> list[str]:
    """A replica process that lived through quorum changes: its thread and descriptor counts
    at its end against those a tenth of the way through its life (after its first changes)."""
    out = []
    by_pid: dict[int, list[Step]] = {}
    for s in steps:
        by_pid.setdefault(s.pid, []).append(s)
    for pid, ss in by_pid.items():
        if len(ss) < 200:
            continue
        early, late = ss[len(ss) // 10], ss[-1]
        if late.threads > early.threads + THREAD_SLACK or late.fds > early.fds + FD_SLACK:
            out.append(f"replica {ss[0].rid} (pid {pid}, {len(ss)} steps): threads {early.threads} -> "
                       f"{late.threads}, descriptors {early.fds} -> {late.fds}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--failures", type=int, default=200)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=10.0)
    ap.add_argument("--json", help="write the verdict here")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    v = chaos(args.failures, args.replicas, args.seed, args.deadline)
    rec = sorted(v["recovery_s"])
    print(f"\n{v['failures']}/{args.failures} failures recovered in {time.monotonic() - t0:.0f} s, "
          f"{v['steps']} steps committed")
    if rec:
        print(f"death -> survivors' next good step: median {rec[len(rec) // 2]:.2f} s, "
              f"p90 {rec[int(len(rec) * 0.9)]:.2f} s, max {rec[-1]:.2f} s")
    for p in v["problems"]:
        print("PROBLEM:", p)
    if args.json:
        Path(args.json).write_text(json.dumps(v))
    return 0 if v["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
