"""``python -m pyc10d.testing.clients``: programs written for torch.distributed, run unchanged
on pyc10d and on Gloo, their results compared (``make test-clients``, in its own venv with the
clients installed).

* ``examples/clients/nanogpt_ddp.py`` under ``torchrun --nproc-per-node 2``: a nanoGPT-sized
  transformer, DDP, ``init_process_group("pyc10d")`` vs ``"gloo"``;
* ``examples/clients/fabric_ddp.py``: Lightning Fabric, ``DDPStrategy(process_group_backend=
  "pyc10d")`` vs ``"gloo"``, Fabric's own launcher (needs ``lightning``).

Each pair must give the same losses at every step (to 1e-6: the same sums, maybe in another
order) and the same parameters, and each run must have used the backend it asked for (the
group's backend name as torch reports it). Prints one line per client; exit 1 on a mismatch
or a failed run.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "clients"


def _nanogpt(backend: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(EXAMPLES / "nanogpt_ddp.py"), "--backend", backend, "--out", str(out)]


def _fabric(backend: str, out: Path) -> list[str]:
    return [sys.executable, str(EXAMPLES / "fabric_ddp.py"), backend, str(out)]


CLIENTS = {"nanogpt": (_nanogpt, None), "fabric": (_fabric, "lightning")}


def run(client: str, backend: str, tmp: Path, timeout: float) -> dict | str:
    make, _ = CLIENTS[client]
    out = tmp / f"{client}-{backend}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    try:
        proc = subprocess.run(make(backend, out), env=env, cwd=tmp, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{client} on {backend}: timed out after {timeout:.0f} s"
    if proc.returncode != 0 or not out.exists():
        return f"{client} on {backend}: exit code {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def compare(client: str, ours: dict, ref: dict) -> list[str]:
    problems = []
    if ours["group"] != "pyc10d":
        problems.append(f"{client}: the run on pyc10d had a group on {ours['group']!r}")
    if len(ours["losses"]) != len(ref["losses"]) or not all(
            math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(ours["losses"], ref["losses"])):
        problems.append(f"{client}: losses differ: pyc10d {ours['losses']} gloo {ref['losses']}")
    if not math.isclose(ours["checksum"], ref["checksum"], rel_tol=1e-6):
        problems.append(f"{client}: parameters differ: {ours['checksum']} vs {ref['checksum']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pyc10d-clients-") as tmp:
        for client in args.clients.split(","):
            needs = CLIENTS[client][1]
            if needs and importlib.util.find_spec(needs) is None:
                problems.append(f"{client}: {needs} is not installed here (make test-clients installs it)")
                continue
            ours, ref = run(client, "pyc10d", Path(tmp), args.timeout), run(client, "gloo", Path(tmp), args.timeout)
            bad = [r for r in (ours, ref) if isinstance(r, str)]
            found = bad or compare(client, ours, ref)  # type: ignore[arg-type]
            problems += found
            if not found:
                print(f"{client}: {len(ours['losses'])} steps, losses equal to Gloo's "  # type: ignore[index]
                      f"(last {ours['losses'][-1]:.6f}), parameters equal")  # type: ignore[index]
    for p in problems:
        print("FAILED:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
