"""Placement on a host pyc10d does not have to itself: several jobs at once, a CPU quota.

``python -m pyc10d.bench.placement [--rounds 3]`` runs each case with pyc10d's default
placement (``PYC10D_BIND=auto``), with ``PYC10D_BIND=none`` and with torch's Gloo, the three
alternated within every round:

* ``1 job``, ``2 jobs``, ``3 jobs``: that many 2-rank jobs started together on this host
  (``pyc10d.run`` each, timing from the same instant: ``bench.worker --start-at``);
* ``quota 1 CPU``: one 2-rank job in a cgroup whose quota is one CPU of time
  (``bench.quota``; the host has more);
* ``4 ranks``: one 4-rank job (more ranks than this 2-CPU host has CPUs);
* ``2 hosts``: one job of two namespace hosts x 2 ranks (``pyc10d.testing.hosts``, needs
  root; ``bench.multihost``'s loop, unshaped links) on this host's CPUs: pyc10d's ``auto``
  (hier), whose two hosts' placements know nothing of each other, and Gloo.

Each job times all_reduce (float32, SUM) of ``--sizes``, loops of K calls back to back / K,
the slower rank's, every result checked from poisoned outputs (``bench.worker``). A case's
figure is its slowest job's median loop; ``worst`` is the slowest loop of any of its jobs
(throttling shows there, not in a median). Reported: the median over rounds (which job gets
which CPU when is a draw on a shared host), every round's figure in the JSON. Writes ``<out>/placement-<time>.json`` and a bar chart beside it.
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
from pathlib import Path
from typing import Any

from pyc10d import settings
from pyc10d.bench.launch import finish_job, free_port
from pyc10d.bench.quota import QuotaUnavailable, cpu_quota_group
from pyc10d.bench.report import cli_args, finish, pyplot

CASES = {"1 job": (1, 2, None), "2 jobs": (2, 2, None), "3 jobs": (3, 2, None),
         "quota 1 CPU": (1, 2, 1.0), "4 ranks": (1, 4, None), "2 hosts": (1, 4, None)}
CONFIGS = {"default": ("pyc10d-shm", "auto"), "none": ("pyc10d-shm", "none"), "gloo": ("gloo", "auto")}


def _start(backend: str, bind: str, ranks: int, sizes: list[int], iters: int, start_at: float, out: Path,
           preexec: Any, tree: str | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pyc10d.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "--start-method", "fork", "-m", "pyc10d.bench.worker",
           "--backend", backend, "--ops", "all_reduce", "--sizes", ",".join(map(str, sizes)), "--iters", str(iters),
           "--start-at", str(start_at), "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYC10D_BIND=bind)
    if tree:  # another checkout's pyc10d (``--compare-tree``: the code before a change)
        env["PYTHONPATH"] = tree
    return subprocess.Popen(cmd, env=env, preexec_fn=preexec, stdout=subprocess.DEVNULL, cwd=tree or None)


def _two_hosts(config: str, sizes: list[int], tmp: Path) -> dict[int, dict[str, float]] | str:
    """The ``2 hosts`` case: multihost's loop (a figure per size, so worst = median)."""
    from pyc10d.bench.multihost import run_hosts
    from pyc10d.testing.hosts import Hosts, unavailable_reason

    why = unavailable_reason()
    if why is not None or config == "compared":
        return f"namespace hosts: {why or 'not with --compare-tree'}"
    backend, bind = CONFIGS[config]
    name = settings.BIND.name
    before = os.environ.get(name)
    os.environ[name] = bind  # (the hosts' ranks are forked with this environment)
    try:
        with Hosts(2) as hosts:
            got = run_hosts(hosts, "gloo" if backend == "gloo" else "auto", 4, 2, sizes, 1.0,
                            free_port(), tmp)
    except RuntimeError as e:
        return str(e)
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
    return {row["bytes"]: {"us": row["seconds"] * 1e6, "worst_us": row["seconds"] * 1e6} for row in got["rows"]}


def run_case(case: str, config: str, args: argparse.Namespace, tmp: Path) -> dict[int, dict[str, float]] | str:
    """{bytes: {"us": slowest job's median, "worst_us": slowest loop}}, or why there is none."""
    if case == "2 hosts":
        return _two_hosts(config, args.sizes, tmp)
    jobs, ranks, quota = CASES[case]
    backend, bind = CONFIGS.get(config, CONFIGS["default"])
    tree = args.compare_tree if config == "compared" else None
    start_at = time.time() + args.lead
    outs = [tmp / f"{case.replace(' ', '_')}-{config}-{j}.json" for j in range(jobs)]

    def launch(preexec: Any) -> list[int | None]:
        procs = [_start(backend, bind, ranks, args.sizes, args.iters, start_at, out, preexec, tree) for out in outs]
        return [finish_job(p, args.timeout) for p in procs]

    try:
        if quota is None:
            codes = launch(None)
        else:
            with cpu_quota_group(quota) as enter:
                codes = launch(enter)
    except QuotaUnavailable as e:
        return str(e)
    if any(c != 0 for c in codes) or not all(o.exists() for o in outs):
        return f"exit codes {codes}"
    got: dict[int, dict[str, float]] = {}
    for out in outs:
        for r in json.loads(out.read_text()):
            if r.get("kind") != "collective":
                continue
            if not r["correct"]:
                return f"wrong result at {r['bytes']} B"
            cell = got.setdefault(r["bytes"], {"us": 0.0, "worst_us": 0.0})
            cell["us"] = max(cell["us"], r["time_us"])
            cell["worst_us"] = max(cell["worst_us"], r["max_us"])
    return got


def _plot(rows: list[dict[str, Any]], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    sizes = sorted({r["bytes"] for r in rows})
    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        width = 0.8 / len(CONFIGS)
        for i, config in enumerate(CONFIGS):
            ys = [next((r["us"] for r in rows if r["case"] == c and r["config"] == config and r["bytes"] == size),
                       0.0) for c in cases]
            ax.bar([x + i * width for x in range(len(cases))], ys, width, label=config)
        ax.set_xticks([x + width for x in range(len(cases))], cases, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"all_reduce {size} B, slowest job (us)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="placement on a shared host")
    p.add_argument("--cases", default=",".join(CASES), type=lambda s: s.split(","))
    p.add_argument("--configs", default=",".join(CONFIGS), type=lambda s: s.split(","))
    p.add_argument("--sizes", default="65536,1048576", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lead", type=float, default=6.0, help="seconds from launch to the common start")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--compare-tree", metavar="DIR",
                   help="also run config 'compared': the default placement of the pyc10d checkout in DIR")
    args = p.parse_args(argv)
    if args.compare_tree and "compared" not in args.configs:
        args.configs.append("compared")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rounds: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pyc10d-placement-") as tmp:
        for rnd in range(args.rounds):
            for case in args.cases:
                # alternated within the round, in an order that turns from round to round (the
                # first job after another case's ran slower in every round: measured, 4 ranks)
                for config in args.configs[rnd % len(args.configs):] + args.configs[:rnd % len(args.configs)]:
                    got = run_case(case, config, args, Path(tmp))
                    if isinstance(got, str):
                        problems.append(f"{case} / {config} round {rnd}: {got}")
                        continue
                    for size, cell in got.items():
                        rounds.setdefault((case, config, size), []).append(cell)
    rows = []
    for (case, config, size), cells in rounds.items():
        # The median round: on a shared host which job gets which CPU when is a draw, and the
        # best of a few draws says more about luck than about the policy.
        us = statistics.median(c["us"] for c in cells)
        worst = statistics.median(c["worst_us"] for c in cells)
        rows.append({"case": case, "config": config, "bytes": size, "us": us, "worst_us": worst,
                     "best_us": min(c["us"] for c in cells),
                     "rounds_us": [c["us"] for c in cells], "rounds_worst_us": [c["worst_us"] for c in cells]})
    print("all_reduce, slowest job's median loop (worst loop), median of rounds, us; ratios: default's time / the other's")
    for case in args.cases:
        for size in args.sizes:
            cell = {r["config"]: r for r in rows if r["case"] == case and r["bytes"] == size}
            text = "  ".join(f"{c} {cell[c]['us']:8.1f} ({cell[c]['worst_us']:8.1f})" for c in args.configs if c in cell)
            ratios = ""
            if "default" in cell:
                ratios = "  ".join(f"/{c} {cell['default']['us'] / cell[c]['us']:.2f}"
                                   for c in ("none", "gloo", "compared") if c in cell)
            print(f"{case:<12} {size:>8} B  {text}  {ratios}")
    return finish(args.out, "placement", {"args": cli_args(args), "rows": rows, "problems": problems}, problems,
                  plot=lambda png: bool(rows) and _plot(rows, png))


if __name__ == "__main__":
    sys.exit(main())
