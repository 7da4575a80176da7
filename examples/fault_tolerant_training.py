"""Fault-tolerant training with torchft over pyc10d: a replica is killed, comes back, heals.

Two replica groups train one model with torchft's ``Manager`` (a Lighthouse forms each step's
quorum; gradients are averaged across the replicas that are in it) on
``pyc10d.integrations.torchft.ProcessGroupPyc10d``. Mid-run this script SIGKILLs replica 1;
replica 0 goes on alone (its group with the dead replica fails at once, the Manager skips
that step's commit and the next quorum holds replica 0 only); replica 1 is started again,
joins the next quorum, heals from replica 0's state (model and optimizer, over torchft's HTTP
checkpoint transport) and the two train together to the end. Once replica 1 is back the script
names a stopping step a little ahead (``--steps`` at least); both replicas stop there, and the
script checks that both end with the same parameters, bit for bit. Run with:

    python examples/fault_tolerant_training.py --steps 40

The signal lands inside a gradient all-reduce: at step ``--kill-at`` replica 1 sends it to
itself as it enters one, before it posts anything, so replica 0 is left waiting on it in the
collective.
It prints the time from the signal to replica 0's next committed step (its first without
replica 1). ``--fault stop`` SIGSTOPs replica 1 instead (a hung replica: nothing closes; the
script kills and restarts it once replica 0 has gone on without it). ``--pg gloo`` / ``--pg baby_gloo`` run
torchft's own ``ProcessGroupGloo`` / ``ProcessGroupBabyGloo`` instead, for comparison
(``python -m pyc10d.bench.torchft_recovery`` does that many times). ``--replica N`` runs one
replica (the script starts its replicas that way); needs ``pip install torchft-nightly``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: How long the Lighthouse waits for a silent replica's heartbeat before it leaves the quorum
#: (torchft's default is 5 s); the time a survivor stalls after a peer dies is about this.
HEARTBEAT_TIMEOUT_MS = 1000
#: The process group's timeout, and the Manager's for a step's collectives and commit.
PG_TIMEOUT_S = 10
#: Steps between the moment the stopping step is named and the step itself: more than either
#: replica can run before it reads the file (its steps are paced by ``--step-sleep``).
STOP_MARGIN = 20


def make_model() -> nn.Module:
    torch.manual_seed(0)  # every replica starts equal (torchft also heals a newcomer at once)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def batch(step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each replica's own data for ``step`` (data parallel: different batches, one model)."""
    g = torch.Generator().manual_seed(1000 * step + replica)
    x = torch.randn(8, 16, generator=g)
    return x, (x[:, :4].sum(1) > 0).long() + (x[:, 4:8].sum(1) > 0).long()


def replica_main(args: argparse.Namespace) -> int:
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupBabyGloo, ProcessGroupGloo

    from pyc10d.integrations.torchft import ProcessGroupPyc10d

    make_pg = {"pyc10d": ProcessGroupPyc10d, "gloo": ProcessGroupGloo,
               "baby_gloo": ProcessGroupBabyGloo}[args.pg]

    store = torch.distributed.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        optimizer.load_state_dict(sd["optim"])

    manager = Manager(
        pg=make_pg(timeout=timedelta(seconds=PG_TIMEOUT_S)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"replica_{args.replica}",
        store_addr="localhost",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
        timeout=timedelta(seconds=PG_TIMEOUT_S),
        quorum_timeout=timedelta(seconds=30),
    )
    if args.fail_at is not None:
        fail_inside_allreduce(manager, args)
    ddp = DistributedDataParallel(manager, model)
    opt = OptimizerWrapper(manager, optimizer)
    loss_fn = nn.CrossEntropyLoss()
    try:
        while True:
            before = manager.current_step()
            x, y = batch(before, args.replica)
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()  # commits only if every replica of the quorum succeeded
            step, n = manager.current_step(), manager.num_participants()
            print(json.dumps({"replica": args.replica, "step": step, "committed": step > before,
                              "participants": n, "loss": round(loss.item(), 4), "t": time.time()}),
                  flush=True)
            # Both replicas see the same step and quorum, so both stop at the same step.
            if n == 2 and os.path.exists(args.stop_file) and step >= int(Path(args.stop_file).read_text()):
                break
            time.sleep(args.step_sleep)
        torch.save({"step": manager.current_step(), "model": model.state_dict()}, args.out)
    finally:
        manager.shutdown(wait=False)
    return 0


def fail_inside_allreduce(manager: Any, args: argparse.Namespace) -> None:
    """Make this replica signal itself (``args.fault``) as it enters an all-reduce of its
    process group, at step ``args.fail_at`` or later once it trains with its peer, and print
    when: its peer enters the same collective and waits on it."""
    pg = manager._pg
    allreduce = pg.allreduce
    sig = signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP

    def failing_allreduce(tensors: Any, opts: Any) -> Any:
        if manager.current_step() >= args.fail_at and manager.num_participants() == 2:
            print(json.dumps({"replica": args.replica, "signal_at": time.time(),
                              "step": manager.current_step()}), flush=True)
            pg.allreduce = allreduce
            os.kill(os.getpid(), sig)
        return allreduce(tensors, opts)

    pg.allreduce = failing_allreduce


def start(replica: int, lighthouse: str, args: argparse.Namespace, out: Path,
          fail_at: int | None = None) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--replica", str(replica), "--lighthouse",
           lighthouse, "--step-sleep", str(args.step_sleep), "--out", str(out), "--pg", args.pg,
           "--stop-file", str(out.parent / "stop_at"), "--fault", args.fault]
    if fail_at is not None:
        cmd += ["--fail-at", str(fail_at)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def read_until(proc: subprocess.Popen, done: Any, seen: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Read ``proc``'s step lines (into ``seen``) until ``done(line)``; None at its end."""
    for raw in proc.stdout:  # type: ignore[union-attr]
        if raw.startswith("{"):
            rec = json.loads(raw)
            seen.append(rec)
            if done(rec):
                return rec
    return None


def main(args: argparse.Namespace) -> int:
    import threading

    os.environ.setdefault("RUST_LOG", "warn")  # the Lighthouse logs every quorum at info
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=200,
                                  heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "replica0.pt", out / "replica1.pt"]
    (out / "stop_at").unlink(missing_ok=True)
    steps0: list[dict[str, Any]] = []
    steps1: list[dict[str, Any]] = []
    r0 = start(0, lighthouse.address(), args, paths[0])
    r1 = start(1, lighthouse.address(), args, paths[1], fail_at=args.kill_at)
    reader = threading.Thread(target=read_until, args=(r0, lambda r: False, steps0), daemon=True)
    reader.start()
    try:
        # Replica 1 signals itself inside an all-reduce once both have trained a few steps.
        signalled = read_until(r1, lambda r: "signal_at" in r, steps1)
        if signalled is None:
            raise SystemExit("replica 1 ended before its fault")
        killed_at = signalled["signal_at"]
        if args.fault == "kill":
            r1.wait()
            print(f"killed replica 1 (SIGKILL) in an all-reduce of step {signalled['step']}")
        else:  # hung: its sockets stay open; killed once replica 0 has gone on alone
            print(f"stopped replica 1 (SIGSTOP) in an all-reduce of step {signalled['step']}")
            deadline = time.time() + 120
            while not any(r["t"] > killed_at and r["participants"] == 1 and r["committed"] for r in steps0):
                if r0.poll() is not None or time.time() > deadline:
                    raise SystemExit("replica 0 did not go on while replica 1 hung")
                time.sleep(0.05)
            r1.kill()
            r1.wait()
        r1 = start(1, lighthouse.address(), args, paths[1])
        steps1 = []  # the restarted replica's steps
        if read_until(r1, lambda r: r["committed"] and r["participants"] == 2, steps1) is None:
            raise SystemExit("the restarted replica 1 ended before it trained with replica 0")
        # Both are back in step: stop a little ahead of where either is now.
        ahead = max(r["step"] for r in steps0 + steps1) + STOP_MARGIN
        (out / "stop_at").write_text(str(max(args.steps, ahead)))
        read_until(r1, lambda r: False, steps1)
        codes = (r0.wait(timeout=120), r1.wait(timeout=120))
        reader.join(timeout=10)
    finally:
        for p in (r0, r1):
            if p.poll() is None:
                p.kill()
        lighthouse.shutdown()
    if codes != (0, 0):
        raise SystemExit(f"replicas exited with {codes}")
    # The survivor's next good step: the first it commits without the dead replica.
    alone = [r for r in steps0 if r["t"] > killed_at and r["participants"] == 1 and r["committed"]]
    good = alone[0]
    healed = next(r for r in steps1 if r["committed"])  # its first step, after healing
    print(f"replica 0: next committed step {good['step']} {good['t'] - killed_at:.2f} s after the {args.fault}; "
          f"{len(alone)} steps trained alone; replica 1 back (healed) at step {healed['step']}")
    a, b = (torch.load(p) for p in paths)
    if a["step"] != b["step"]:
        raise SystemExit(f"replicas stopped at different steps: {a['step']} and {b['step']}")
    diff = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    if diff:
        raise SystemExit(f"parameters differ across replicas at step {a['step']}: {diff}")
    print(f"both replicas ended at step {a['step']} with equal parameters")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="train at least this many steps")
    ap.add_argument("--kill-at", type=int, default=5, help="replica 1's fault comes at this step")
    ap.add_argument("--step-sleep", type=float, default=0.02, help="pause between steps (s)")
    ap.add_argument("--out-dir", default="fault_tolerant_out", help="where the final states go")
    ap.add_argument("--fault", choices=["kill", "stop"], default="kill",
                    help="SIGKILL replica 1 (default) or SIGSTOP it (hung)")
    ap.add_argument("--pg", choices=["pyc10d", "gloo", "baby_gloo"], default="pyc10d",
                    help="process group: pyc10d's, or torchft's Gloo classes for comparison")
    ap.add_argument("--replica", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--fail-at", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--lighthouse", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--stop-file", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sys.exit(replica_main(a) if a.replica is not None else main(a))
