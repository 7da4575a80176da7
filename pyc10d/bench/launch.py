"""Start one benchmark job: ``world`` ranks of a worker module on this host, via ``pyc10d.run``.

Shared by the DDP, functional-collective and symmetric-memory benchmarks: each worker writes
its records as JSON to ``out``, and the caller gets them back, or a one-line reason.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
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


def start_job(module: str, args: list[str], env: dict[str, str], log: Path | None = None) -> Any:
    """``python -m module args`` with the environment ``env`` (stdout and stderr to the file
    ``log`` when given): a ``Popen``-like handle.

    Forked from this process when it is a benchmark's driver (``python -m pyc10d.bench...``)
    that has imported torch and runs one thread (no other thread can hold a lock across the
    fork): the job then skips a fresh interpreter's torch import, ~2.5 s of CPU. Anywhere
    else a fresh interpreter: a process that ran other work (a pytest worker) hands a fork
    its state, and a torch-suite job forked from one hung once in DDP where the same job from
    a fresh interpreter never has. torch's thread pool was sized here at import: the child
    sizes it from ``OMP_NUM_THREADS`` in ``env``, as a fresh interpreter would."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    driver = main_spec is not None and main_spec.name.startswith("pyc10d.bench")
    if not driver or "torch" not in sys.modules or threading.active_count() != 1:
        if log is None:
            return subprocess.Popen([sys.executable, "-m", module, *args], env=env)
        with log.open("wb") as f:
            return subprocess.Popen([sys.executable, "-m", module, *args], env=env, stdout=f,
                                    stderr=subprocess.STDOUT)
    from pyc10d.run_fork import start

    def prepare() -> None:
        if log is not None:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        if env.get("OMP_NUM_THREADS", "").isdigit():
            sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))

    return start([module, *args], True, env, prepare)


def finish_job(proc: Any, timeout: float) -> int | None:
    """The exit code of a job from ``start_job``, or None when it ran past ``timeout``: then
    SIGTERM (a ``pyc10d.run`` launcher stops its ranks), and SIGKILL 15 s later."""
    try:
        return int(proc.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return None
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        raise


def run_worker(module: str, world: int, worker_args: list[str], out: Path, timeout: float,
               env: dict[str, str] | None = None) -> Any:
    """Run ``python -m module --worker ... --out out`` on ``world`` ranks (with ``env`` added
    to the environment); the JSON it wrote, or a string saying why there is none.

    The ranks are forked from the launcher (``--start-method fork``), itself forked from this
    process where ``start_job`` can: a job costs at most one interpreter start instead of
    ``world + 1``. Every worker module times from after its imports, so the figures are the
    same either way."""
    args = ["--nproc-per-node", str(world), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            "--start-method", "fork", "-m", module, "--worker", *worker_args, "--out", str(out)]
    code = finish_job(start_job("pyc10d.run", args, dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))), timeout)
    if code is None:
        return f"timed out after {timeout:.0f} s"
    if code != 0 or not out.exists():
        return f"exit code {code}"
    return json.loads(out.read_text())
