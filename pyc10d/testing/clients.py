"""``python -m pyc10d.testing.clients``: programs written for torch.distributed, run unchanged
on pyc10d and on Gloo, their results compared (``make test-clients``, in its own venv with the
clients installed).

* ``examples/clients/nanogpt_ddp.py`` under ``torchrun --nproc-per-node 2``: a nanoGPT-sized
  transformer, DDP, ``init_process_group("pyc10d")`` vs ``"gloo"``;
* ``examples/clients/fabric_ddp.py``: Lightning Fabric, ``DDPStrategy(process_group_backend=
  "pyc10d")`` vs ``"gloo"``, Fabric's own launcher (needs ``lightning``);
* ``examples/clients/accelerate_ddp.py`` under torchrun: Hugging Face accelerate, which names
  no backend but Gloo on CPU, run unchanged on Gloo, with ``PYC10D_SERVE_GLOO=1`` (pyc10d serves
  the name gloo) and under ``init_first.py pyc10d`` (the default group made on pyc10d before
  ``Accelerator()``) (needs ``accelerate``).

Every pyc10d run must give Gloo's losses at every step (to 1e-6: the same sums, maybe in
another order) and Gloo's parameters, and must have run on pyc10d (the group's backend name as
torch reports it, or, where torch reports the name gloo, the group's class); the Gloo run must
not have. Prints one line per run; exit 1 on a mismatch or a failed run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "clients"


def _nanogpt(backend: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(EXAMPLES / "nanogpt_ddp.py"), "--backend", backend, "--out", str(out)]


def _fabric(backend: str, out: Path) -> list[str]:
    return [sys.executable, str(EXAMPLES / "fabric_ddp.py"), backend, str(out)]


def _accelerate(way: str, out: Path) -> list[str]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    script = [str(EXAMPLES / "accelerate_ddp.py"), "--out", str(out)]
    if way == "init-first":
        return [*torchrun, str(EXAMPLES / "init_first.py"), "pyc10d", *script]
    return [*torchrun, *script]


Maker = Callable[[str, Path], list[str]]
#: client -> (its command for a way of running it, the package it needs, its pyc10d ways:
#: way -> extra environment). The reference way is always "gloo".
CLIENTS: dict[str, tuple[Maker, str | None, dict[str, dict[str, str]]]] = {
    "nanogpt": (_nanogpt, None, {"pyc10d": {}}),
    "fabric": (_fabric, "lightning", {"pyc10d": {}}),
    "accelerate": (_accelerate, "accelerate", {"serve-gloo": {"PYC10D_SERVE_GLOO": "1"}, "init-first": {}}),
}


def run(client: str, way: str, tmp: Path, timeout: float, extra_env: dict[str, str] | None = None) -> dict | str:
    make = CLIENTS[client][0]
    out = tmp / f"{client}-{way}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", **(extra_env or {}))
    if way == "gloo":
        env.pop("PYC10D_SERVE_GLOO", None)  # the reference is Gloo whatever the caller has set
    try:
        proc = subprocess.run(make(way, out), env=env, cwd=tmp, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{client} {way}: timed out after {timeout:.0f} s"
    if proc.returncode != 0 or not out.exists():
        return f"{client} {way}: exit code {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def on_pyc10d(result: dict) -> bool:
    """Whether a run's group was pyc10d's: by the name torch reports, or, where torch reports
    the name asked for (gloo, served by pyc10d), by the group's class."""
    return result.get("group") == "pyc10d" or str(result.get("process_group", "")).startswith("pyc10d.")


def compare(client: str, way: str, ours: dict, ref: dict) -> list[str]:
    problems = []
    if not on_pyc10d(ours):
        problems.append(f"{client} {way}: the run did not use pyc10d: {ours.get('group') or ours.get('process_group')!r}")
    for label, r in (("pyc10d", ours), ("gloo", ref)):
        if r.get("num_processes", 2) != 2:  # (a framework that did not see the job as distributed)
            problems.append(f"{client} {way}: the {label} run trained on {r['num_processes']} process(es), not 2")
    if on_pyc10d(ref):
        problems.append(f"{client}: the Gloo reference ran on pyc10d: {ref.get('process_group')!r}")
    if len(ours["losses"]) != len(ref["losses"]) or not all(
            math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(ours["losses"], ref["losses"])):
        problems.append(f"{client} {way}: losses differ: pyc10d {ours['losses']} gloo {ref['losses']}")
    if not math.isclose(ours["checksum"], ref["checksum"], rel_tol=1e-6):
        problems.append(f"{client} {way}: parameters differ: {ours['checksum']} vs {ref['checksum']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pyc10d-clients-") as tmp:
        for client in args.clients.split(","):
            _, needs, ways = CLIENTS[client]
            if needs and importlib.util.find_spec(needs) is None:
                problems.append(f"{client}: {needs} is not installed here (make test-clients installs it)")
                continue
            ref = run(client, "gloo", Path(tmp), args.timeout)
            if isinstance(ref, str):
                problems.append(ref)
                continue
            for way, extra in ways.items():
                ours = run(client, way, Path(tmp), args.timeout, extra)
                found = [ours] if isinstance(ours, str) else compare(client, way, ours, ref)
                problems += found
                if not found:
                    print(f"{client} {way}: {len(ours['losses'])} steps, losses equal to Gloo's "  # type: ignore[index]
                          f"(last {ours['losses'][-1]:.6f}), parameters equal")  # type: ignore[index]
    for p in problems:
        print("FAILED:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
