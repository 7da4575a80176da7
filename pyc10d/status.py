"""``python -m pyc10d.status``: where every rank of a running job is, read from its store.

Each rank's watchdog (``backends/watchdog.py``) already publishes its progress per group to
the job's store, for stuck-rank detection; this reads it (no second heartbeat): one row per
rank with the last operation it finished, the one it waits in now and for which ranks (those
that have not entered it), for how long, and its operations per second of the last period.
The store is ``--store host:port`` or ``MASTER_ADDR``/``MASTER_PORT``; ``--watch`` redraws
the table every ``--interval`` seconds, like ``top``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from typing import Any

from .backends.watchdog import KEY
from .hostport import format_hostport, split_hostport


def read(store: Any, group: str = "0") -> dict[int, dict[str, Any]]:
    """rank -> what it published for ``group`` (see ``watchdog.publish``)."""
    prefix = f"{KEY}/{group}/"
    keys = sorted((k for k in store.list_keys() if k.startswith(prefix)), key=lambda k: int(k[len(prefix):]))
    rows: dict[int, dict[str, Any]] = {}
    for key, raw in zip(keys, store.multi_get(keys) if keys else []):
        f = raw.decode().split("|")
        f += [""] * (10 - len(f))
        rows[int(key[len(prefix):])] = {
            "entered": int(f[0]), "entered_op": f[1], "completed": int(f[2]), "completed_op": f[3],
            "running": int(f[4] or 0), "running_op": f[5], "since": float(f[6] or 0),
            "rate": float(f[7] or 0), "at": float(f[8] or 0),
        }
    return rows


def waiting_for(rows: dict[int, dict[str, Any]], rank: int) -> list[int]:
    """The ranks that have not entered the operation ``rank`` waits in (empty: none or idle)."""
    seq = rows[rank]["running"]
    return [r for r, row in sorted(rows.items()) if r != rank and seq and row["entered"] < seq] if seq else []


def table(rows: dict[int, dict[str, Any]], group: str = "0", now: float | None = None) -> str:
    """The status table (one line per rank)."""
    now = time.time() if now is None else now
    if not rows:
        return f"group {group!r}: no rank has published progress yet"
    lines = [f"group {group!r}, {len(rows)} ranks reporting, {time.strftime('%H:%M:%S', time.localtime(now))}",
             f"{'rank':>4}  {'last finished':<24} {'waiting in':<24} {'for ranks':<14} {'since':>8} {'ops/s':>7}"]
    for r, row in sorted(rows.items()):
        done = f"#{row['completed']} {row['completed_op']}" if row["completed"] else "-"
        if row["running"]:
            waits = f"#{row['running']} {row['running_op']}"
            whom = ",".join(map(str, waiting_for(rows, r))) or "(in it)"
            since = f"{now - row['since']:.1f}s"
        else:
            waits, whom, since = "-", "", ""
        lines.append(f"{r:>4}  {done:<24} {waits:<24} {whom:<14} {since:>8} {row['rate']:>7.1f}")
    return "\n".join(lines)


def connect(address: str | None, timeout_s: float = 10.0) -> Any:
    """A client of the job's TCPStore (``host:port``, else ``MASTER_ADDR``/``MASTER_PORT``)."""
    from .store import TCPStore

    if address is None:
        if "MASTER_PORT" not in os.environ:
            raise SystemExit("pyc10d.status: give --store host:port or set MASTER_ADDR/MASTER_PORT")
        address = format_hostport(os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ["MASTER_PORT"])
    host, port = split_hostport(f"127.0.0.1{address}" if address.startswith(":") else address)
    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s),
                    wait_for_workers=False)


def snapshot(address: str, group: str = "0", timeout_s: float = 2.0) -> str:
    """The table for the job at ``address``, or why there is none (never raises: the
    launcher prints it on Ctrl-C, while the ranks, and the store rank 0 serves, go down)."""
    try:
        return table(read(connect(address, timeout_s), group), group)
    except Exception as e:  # noqa: BLE001 - a view, not a failure
        return f"(no status: the store at {address} did not answer: {e})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyc10d.status", description=__doc__.split("\n")[0])
    ap.add_argument("--store", help="host:port of the job's TCPStore (default: MASTER_ADDR:MASTER_PORT)")
    ap.add_argument("--group", default="0", help="the group's name (default: the default group, '0')")
    ap.add_argument("--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C")
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args(argv)
    try:
        while True:  # --watch waits for a job that is not up yet
            try:
                store = connect(args.store)
                break
            except (OSError, RuntimeError) as e:
                if not args.watch:
                    raise
                sys.stdout.write(f"\x1b[H\x1b[2Jwaiting for the store: {e}\n")
                sys.stdout.flush()
                time.sleep(args.interval)
        while True:
            text = table(read(store, args.group), args.group)
            if not args.watch:
                print(text)
                return 0
            sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")  # home, clear: a top-like redraw
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
