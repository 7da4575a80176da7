"""Turning benchmark records into tables, a JSON file and a plot.

A record is a dict. ``kind == "collective"`` records carry ``backend, op, world_size, bytes,
time_us, algbw_GBps, busbw_GBps`` (see :mod:`pyc10d.bench.worker`); one ``kind == "memcpy"``
record carries the single-process copy bandwidth ``GBps``; ``kind == "meta"`` describes the
run; ``kind == "failure"`` notes a job that gave no results.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pyc10d.bench.metrics import format_size

Record = dict[str, Any]
REFERENCE = "gloo"
#: The C reference (``--peer mpi``): its column is a *time* ratio, pyc10d's latency over MPI's
#: (lower is better; the targets are phrased that way: "8 B within 3x of Open MPI").
C_PEER = "mpi"
#: Open MPI forced onto TCP (``--mca btl tcp,self``): the C reference of the rows that cross
#: a network in pyc10d (``OVER_TCP``), the same transport in C; the others are compared with
#: Open MPI as it runs by default (shared memory on one host).
C_PEER_TCP = "mpi-tcp"
C_PEERS = (C_PEER, C_PEER_TCP)
OVER_TCP = ("pyc10d-tcp", "pyc10d-hier")


def c_reference(backend: str, backends: Sequence[str]) -> str | None:
    """The C reference ``backend``'s time is compared with in a run of ``backends``."""
    if backend in OVER_TCP and C_PEER_TCP in backends:
        return C_PEER_TCP
    return C_PEER if C_PEER in backends else None


def _fmt(x: float | None, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def render(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = [list(r) for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def collectives(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if r.get("kind") == "collective"]


def _ordered(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def table(records: Sequence[Record], op: str, world_size: int,
          backends: Sequence[str]) -> str:
    """One op x world size: size, then latency/algbw/busbw per backend, then busbw ratios."""
    by_key = {(r["backend"], r["bytes"]): r for r in records
              if r["op"] == op and r["world_size"] == world_size}
    sizes = sorted({b for _, b in by_key})
    ours = [b for b in backends if b.startswith("pyc10d-")]
    ratio_of = ours if REFERENCE in backends else []
    time_of = [(b, c_reference(b, backends)) for b in ours if c_reference(b, backends)]
    header = ["size"]
    for b in backends:
        header += [f"{b} us", "algbw", "busbw"]
    header += [f"{b}/{REFERENCE}" for b in ratio_of] + [f"{b} t/{c}" for b, c in time_of]
    rows = []
    for size in sizes:
        row = [format_size(size)]
        for b in backends:
            r = by_key.get((b, size))
            lat = r and r["time_us"]
            row += [_fmt(lat, ".1f"), _fmt(r and r["algbw_GBps"]), _fmt(r and r["busbw_GBps"])]
            if r is not None and not r.get("correct", True):
                row[-1] += "!"
        ref = by_key.get((REFERENCE, size))
        for b in ratio_of:
            r = by_key.get((b, size))
            ok = r and ref and ref["busbw_GBps"] > 0
            row.append(_fmt(r["busbw_GBps"] / ref["busbw_GBps"], ".2f") if ok else "-")
        for b, c in time_of:
            r, peer = by_key.get((b, size)), by_key.get((c, size))
            row.append(_fmt(r["time_us"] / peer["time_us"], ".2f") if r and peer and peer["time_us"] > 0 else "-")
        rows.append(row)
    dtypes = ", ".join(sorted({r.get("dtype", "float32") for r in by_key.values()}))
    title = (f"{op}, world size {world_size}, {dtypes}  (us = median latency; algbw, busbw in GB/s; "
             f"/{REFERENCE} = busbw / {REFERENCE}'s, higher is better"
             + (f"; t/{C_PEER} = latency / Open MPI's, lower is better; t/{C_PEER_TCP}: / Open MPI's "
                "over TCP)" if time_of else ")"))
    return title + "\n" + render(header, rows)


def print_report(records: Sequence[Record]) -> None:
    """Every op x world size table, then the memcpy bound and any failures."""
    coll = collectives(records)
    backends = _ordered(r["backend"] for r in coll)
    for op in _ordered(r["op"] for r in coll):
        for ws in sorted({r["world_size"] for r in coll if r["op"] == op}):
            print("\n" + table(coll, op, ws, backends))
    if any(not r.get("correct", True) for r in coll):
        print("\n'!' marks a size whose first result was WRONG on some rank.")
    for r in records:
        if r.get("kind") == "memcpy":
            print(f"\nmemcpy bound: torch copy_ of {format_size(r['bytes'])} in one process, "
                  f"{r['threads']} thread(s): {r['GBps']:.2f} GB/s")
            print("\n" + memcpy_table(coll, r["GBps"], backends))
        elif r.get("kind") == "failure":
            print(f"\nFAILED: {r['backend']} world size {r['world_size']}: {r['error']}")


def memcpy_table(records: Sequence[Record], memcpy: float, backends: Sequence[str]) -> str:
    """Per op x world size: each backend's busbw at the largest size as a fraction of memcpy."""
    header = ["op", "n", "size"] + [f"{b} busbw" for b in backends] + [f"{b} /memcpy" for b in backends]
    rows = []
    for op in _ordered(r["op"] for r in records):
        for ws in sorted({r["world_size"] for r in records if r["op"] == op}):
            mine = [r for r in records if r["op"] == op and r["world_size"] == ws]
            size = max(r["bytes"] for r in mine)
            by_backend = {r["backend"]: r for r in mine if r["bytes"] == size}
            bw = [by_backend[b]["busbw_GBps"] if b in by_backend else None for b in backends]
            rows.append([op, str(ws), format_size(size)] + [_fmt(x) for x in bw]
                        + ["-" if x is None else f"{x / memcpy:.0%}" for x in bw])
    return (f"busbw at the largest size as a fraction of the memcpy bound ({memcpy:.2f} GB/s)\n"
            + render(header, rows))


def write_json(records: Sequence[Record], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(records), indent=1) + "\n")


def read_json(path: Path) -> list[Record]:
    return list(json.loads(path.read_text()))


def plot(records: Sequence[Record], path: Path) -> bool:
    """busbw vs size (log-log), one subplot per op x world size; False if nothing to plot."""
    coll = [r for r in collectives(records) if r["busbw_GBps"] > 0]
    if not coll:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = _ordered(r["op"] for r in coll)
    sizes = sorted({r["world_size"] for r in coll})
    backends = _ordered(r["backend"] for r in coll)
    memcpy = [r["GBps"] for r in records if r.get("kind") == "memcpy"]
    fig, axes = plt.subplots(len(ops), len(sizes), figsize=(5.2 * len(sizes), 3.4 * len(ops)),
                             squeeze=False, sharex=True)
    for i, op in enumerate(ops):
        for j, ws in enumerate(sizes):
            ax = axes[i][j]
            for b in backends:
                pts = sorted((r["bytes"], r["busbw_GBps"]) for r in coll
                             if r["op"] == op and r["world_size"] == ws and r["backend"] == b)
                if pts:
                    ax.plot(*zip(*pts), marker="o", markersize=3, label=b)
            if memcpy:
                ax.axhline(memcpy[0], color="gray", linestyle="--", linewidth=1,
                           label="memcpy (1 proc)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{op}, n={ws}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("busbw (GB/s)")
            if i == len(ops) - 1:
                ax.set_xlabel("message size (bytes)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_result(out: str | Path, name: str, payload: Any) -> Path:
    """Write ``payload`` to ``<out>/<name>-<YYYYmmdd-HHMMSS>.json``, creating ``out``; the path.
    Every benchmark names its results this way (tests and the README find them by the prefix)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(payload, indent=1))
    return path


def pyplot() -> Any:
    """matplotlib's pyplot on its file-only backend, or None where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def finish(out: str | Path, name: str, payload: dict[str, Any], problems: list[str],
           label: str = "problem:", plot: Callable[[Path], bool] | None = None) -> int:
    """A benchmark driver's last step: print each problem, write ``payload`` (with the problems
    under ``problems``'s own key in it already) and, with ``plot``, a PNG beside it
    (``plot(path)``: False when it drew nothing), say where; the exit status (1 on problems)."""
    for line in problems:
        print(label, line)
    path = write_result(out, name, payload)
    print(f"wrote {path}")
    if plot is not None and plot(path.with_suffix(".png")):
        print(f"wrote {path.with_suffix('.png')}")
    return 1 if problems else 0


def cli_args(args: Any) -> dict[str, Any]:
    """A driver's options for its JSON, without the worker-only ones."""
    return {k: v for k, v in vars(args).items() if k not in ("worker", "impl")}
