"""Recovery under torchft: from a replica's death to the survivor's next good step.

``python -m pyc10d.bench.torchft_recovery`` runs ``examples/fault_tolerant_training.py``
(two replica groups under torchft's Manager and a Lighthouse; replica 1 SIGKILLs or
SIGSTOPs itself as it enters a gradient all-reduce, so replica 0 waits on it inside the
collective; it is restarted, heals from replica 0, equal parameters checked at the end)
``--trials`` times for each process group: pyc10d's ``ProcessGroupPyc10d`` and torchft's
``ProcessGroupGloo`` and ``ProcessGroupBabyGloo``, trials interleaved. Each trial gives the
seconds from the signal to replica 0's first committed step without replica 1; the table
shows their median and maximum, and how many trials failed (a hang, a wrong result: the
example exits non-zero).

The figure includes the Lighthouse's heartbeat timeout (the example sets 1 s): a replica
that stopped answering leaves the quorum only then, whichever process group is used. What
the process group adds is how soon the survivor's collective with the dead replica fails
(a SIGKILL closes its sockets; a SIGSTOP closes nothing, and the Manager's 10 s timeout
ends the step) and how soon the next group is up.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fault_tolerant_training.py"
GROUPS = ("pyc10d", "gloo", "baby_gloo")
_LINE = re.compile(r"next committed step \d+ ([\d.]+) s after the (kill|stop)")


def trial(pg: str, fault: str, steps: int, timeout_s: float) -> tuple[float | None, str]:
    """One run of the example: (seconds to the survivor's next good step, or None; detail)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, str(EXAMPLE), "--pg", pg, "--fault", fault, "--steps", str(steps),
               "--kill-at", "3", "--out-dir", out]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None, f"no end within {timeout_s:.0f} s"
    m = _LINE.search(proc.stdout)
    if proc.returncode != 0 or m is None or "equal parameters" not in proc.stdout:
        return None, (proc.stdout + proc.stderr).strip().splitlines()[-1][:200]
    return float(m.group(1)), ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=5, help="trials per process group and fault")
    ap.add_argument("--groups", default=",".join(GROUPS))
    ap.add_argument("--faults", default="kill,stop")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds before a trial counts as hung")
    ap.add_argument("--json", type=Path, help="write every trial here")
    args = ap.parse_args(argv)
    groups, faults = args.groups.split(","), args.faults.split(",")
    results: dict[str, dict[str, list]] = {f: {g: [] for g in groups} for f in faults}
    for i in range(args.trials):
        for fault in faults:
            for g in groups:
                t0 = time.monotonic()
                secs, detail = trial(g, fault, args.steps, args.timeout)
                results[fault][g].append({"seconds": secs, "detail": detail,
                                          "wall_s": round(time.monotonic() - t0, 1)})
                shown = f"{secs:.2f} s" if secs is not None else f"FAILED ({detail})"
                print(f"trial {i + 1}/{args.trials} {fault:4s} {g:9s}: {shown}", flush=True)
    print("\nseconds from the signal to the survivor's next good step (its first without the replica)")
    print(f"{'fault':6s} {'process group':22s} {'median':>7s} {'max':>7s} {'failed':>7s}")
    names = {"pyc10d": "ProcessGroupPyc10d", "gloo": "ProcessGroupGloo", "baby_gloo": "ProcessGroupBabyGloo"}
    for fault in faults:
        for g in groups:
            ok = [r["seconds"] for r in results[fault][g] if r["seconds"] is not None]
            bad = len(results[fault][g]) - len(ok)
            med = f"{statistics.median(ok):7.2f}" if ok else "      -"
            top = f"{max(ok):7.2f}" if ok else "      -"
            print(f"{fault:6s} {names.get(g, g):22s} {med} {top} {bad:7d}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
