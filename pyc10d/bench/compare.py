"""Base against head: the collective grid of two checkouts, alternated in one run, fresh jobs.

``python -m pyc10d.bench.compare BASE`` (``make bench-compare BASE=<commit>``) checks BASE out
beside this tree (a ``git worktree`` under ``.bench-base/``, once), then runs ``--jobs`` rounds;
each round runs one fresh ``python -m pyc10d.bench`` job of each tree, their order swapped
from round to round, so both trees meet the host's slow and fast stretches alike. Each job is
the same grid (default: all_reduce, n=2, 8 B to 16 MiB, on shm, tcp and torch.distributed's
``"pyc10d_shm"``: the plugin), timed as ``pyc10d.bench`` times it (loops of K calls back to
back / K, the slower rank's, every result checked from poisoned outputs).

Both trees run on this venv's interpreter with ``PYTHONPATH`` set to the tree (the editable
install's finder comes after it). ``--head-imports`` imports modules in every process of the
head's jobs first (a ``sitecustomize`` on its path): with the optional rooms imported, the
head must stay as fast, since no import may change a call.

Printed per figure: each tree's fastest, median and slowest job, and head / base of the
fastest (the ratio to quote) and of the medians. Writes ``<out>/compare-<time>.json`` and a
plot of the ratios beside it.
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

from pyc10d.bench.metrics import format_size
from pyc10d.bench.report import finish, pyplot
from pyc10d.env import parse_size

ROOT = Path(__file__).resolve().parents[2]
Key = tuple[str, str, int, int]  # backend, op, world size, bytes


def checkout(base: str) -> Path:
    """A directory holding ``base``: the path itself, or a worktree of that commit."""
    if Path(base).is_dir():
        return Path(base).resolve()
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{base}^{{commit}}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = ROOT / ".bench-base" / sha[:12]
    if not (tree / "pyc10d").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(tree), sha], cwd=ROOT, check=True,
                       capture_output=True)
    return tree


def _imports_dir(modules: list[str], tmp: Path) -> Path:
    d = tmp / "head-imports"
    d.mkdir(exist_ok=True)
    (d / "sitecustomize.py").write_text("".join(f"import {m}\n" for m in modules))
    return d


def run_job(tree: Path, grid: list[str], out: Path, extra_path: Path | None, timeout: float) -> dict[Key, float]:
    """One fresh ``pyc10d.bench`` job of ``tree``: each figure's time (µs)."""
    path = [str(tree)] + ([str(extra_path)] if extra_path else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    proc = subprocess.run([sys.executable, "-m", "pyc10d.bench", *grid, "--rounds", "1", "--out", str(out)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"bench job of {tree} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = json.loads((out / "latest.json").read_text())
    got = {}
    for r in rows:
        if r.get("kind") == "collective":
            if not r.get("correct", False):
                raise RuntimeError(f"bench job of {tree}: a wrong result at {r}")
            got[(r["backend"], r["op"], r["world_size"], r["bytes"])] = r["time_us"]
    if not got:
        raise RuntimeError(f"bench job of {tree} timed nothing:\n{proc.stdout[-2000:]}")
    return got


def summarize(base: list[dict[Key, float]], head: list[dict[Key, float]]) -> list[dict[str, Any]]:
    """Per figure: each tree's fastest / median / slowest job and head / base ratios."""
    rows = []
    for key in sorted(set().union(*base) & set().union(*head)):
        b = [j[key] for j in base if key in j]
        h = [j[key] for j in head if key in j]
        rows.append({"backend": key[0], "op": key[1], "world_size": key[2], "bytes": key[3],
                     "base_us": sorted(b), "head_us": sorted(h),
                     "ratio_min": min(h) / min(b), "ratio_median": statistics.median(h) / statistics.median(b),
                     "spread_base": max(b) / min(b), "spread_head": max(h) / min(h)})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'backend':<17} {'op':<10} {'n':>2} {'size':>6}  {'base min/med/max us':>24}  "
            f"{'head min/med/max us':>24}  {'head/base min':>13}  {'median':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        def span(v: list[float]) -> str:
            return f"{min(v):.1f}/{statistics.median(v):.1f}/{max(v):.1f}"
        lines.append(f"{r['backend']:<17} {r['op']:<10} {r['world_size']:>2} {format_size(r['bytes']):>6}  "
                     f"{span(r['base_us']):>24}  {span(r['head_us']):>24}  {r['ratio_min']:>13.3f}  "
                     f"{r['ratio_median']:>6.3f}")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for backend in dict.fromkeys(r["backend"] for r in rows):
        mine = [r for r in rows if r["backend"] == backend]
        ax.plot([r["bytes"] for r in mine], [r["ratio_min"] for r in mine], marker="o", label=backend)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes")
    ax.set_ylabel("head / base (fastest job)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base", help="a commit (checked out under .bench-base/) or a directory")
    ap.add_argument("--jobs", type=int, default=6, help="fresh jobs per tree (default 6)")
    ap.add_argument("--backends", default="pyc10d-shm,pyc10d-tcp,torch-pyc10d_shm")
    ap.add_argument("--ops", default="all_reduce")
    ap.add_argument("--world-sizes", default="2")
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="16M")
    ap.add_argument("--step", type=int, default=4, help="size multiplier (default 4)")
    ap.add_argument("--head-imports", default="pyc10d.symmetric_memory,pyc10d.window,pyc10d.functional",
                    help="modules every process of the head's jobs imports first ('' for none)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    ap.add_argument("--out", default="benchmarks/results/compare")
    args = ap.parse_args(argv)
    base = checkout(args.base)
    grid = ["--backends", args.backends, "--ops", args.ops, "--world-sizes", args.world_sizes,
            "--min-bytes", str(parse_size(args.min_bytes)), "--max-bytes", str(parse_size(args.max_bytes)), "--step", str(args.step)]
    runs: dict[str, list[dict[Key, float]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="pyc10d-compare-") as tmp_s:
        tmp = Path(tmp_s)
        imports = [m for m in args.head_imports.split(",") if m]
        extra = {"base": None, "head": _imports_dir(imports, tmp) if imports else None}
        trees = {"base": base, "head": ROOT}
        for j in range(args.jobs):
            for side in (("base", "head") if j % 2 == 0 else ("head", "base")):
                t0 = time.monotonic()
                runs[side].append(run_job(trees[side], grid, tmp / f"{side}{j}", extra[side], args.timeout))
                print(f"job {j + 1}/{args.jobs} {side}: {time.monotonic() - t0:.0f} s", flush=True)
    rows = summarize(runs["base"], runs["head"])
    print(f"\nbase {base} against head {ROOT} ({args.jobs} fresh jobs each, alternated; "
          f"head imports: {args.head_imports or 'none'})")
    print(table(rows))
    meta = {"kind": "meta", "base": str(base), "head": str(ROOT), "jobs": args.jobs, "grid": grid,
            "head_imports": imports}
    return finish(args.out, "compare", {"meta": meta, "rows": rows}, [], plot=lambda p: plot(rows, p))


if __name__ == "__main__":
    sys.exit(main())
