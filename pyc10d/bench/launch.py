"""Start one benchmark job: ``world`` ranks of a worker module on this host, via ``pyc10d.run``.

Shared by the DDP, functional-collective and symmetric-memory benchmarks: each worker writes
its records as JSON to ``out``, and the caller gets them back, or a one-line reason.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


def keep_fastest(best: dict[Any, dict[str, Any]], key: Any, record: dict[str, Any], field: str,
                 rounds_field: str) -> None:
    """Keep, under ``key``, the record with the lowest ``field`` over a benchmark's rounds, with
    every round's ``field`` listed in ``rounds_field`` (the rounds are reported beside it)."""
    kept = best.get(key)
    rounds = (kept[rounds_field] if kept else []) + [record[field]]
    if kept is None or record[field] < kept[field]:
        kept = record
    best[key] = {**kept, rounds_field: rounds}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_worker(module: str, world: int, worker_args: list[str], out: Path, timeout: float,
               env: dict[str, str] | None = None) -> Any:
    """Run ``python -m module --worker ... --out out`` on ``world`` ranks (with ``env`` added
    to the environment); the JSON it wrote, or a string saying why there is none.

    The ranks are forked from the launcher (``--start-method fork``): it has imported torch
    already, so a job costs one interpreter start instead of ``world + 1``. Every worker
    module times from after its imports, so the figures are the same either way."""
    cmd = [sys.executable, "-m", "pyc10d.run", "--nproc-per-node", str(world), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "--start-method", "fork", "-m", module, "--worker",
           *worker_args, "--out", str(out)]
    try:
        code = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})),
                              timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if code != 0 or not out.exists():
        return f"exit code {code}"
    return json.loads(out.read_text())
