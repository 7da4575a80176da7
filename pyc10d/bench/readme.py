"""The performance tables of ``docs/performance.md``, generated from a committed reference run.

``python -m pyc10d.bench.readme benchmarks/reference/<run>.json [--write docs/performance.md]``
prints (or writes between the document's ``<!-- bench-tables:begin -->`` and ``<!-- bench-tables:end
-->`` lines) markdown made only from that file: the run's conditions and memcpy bound, every
op's latency per backend and world size with the ratio to Gloo, and every (op, size, world
size) at which a pyc10d backend was slower than Gloo. Nothing is typed in by hand, so the
document cannot drift from the file it cites.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pyc10d.bench.metrics import format_size
from pyc10d.bench.report import C_PEER, REFERENCE, collectives, read_json

BEGIN, END = "<!-- bench-tables:begin -->", "<!-- bench-tables:end -->"
PYC10D = ("pyc10d-shm", "pyc10d-tcp", "pyc10d-threaded")
#: Compared with the C reference (Open MPI over its shared-memory transport) when the run has it.
C_COMPARED = "pyc10d-shm"


def _us(x: float) -> str:
    return f"{x:,.0f}".replace(",", " ") if x >= 100 else f"{x:.1f}"


def _ratio(mine: dict[str, Any] | None, ref: dict[str, Any] | None) -> str:
    if not mine or not ref or mine["time_us"] <= 0:
        return "-"
    text = f"{ref['time_us'] / mine['time_us']:.2f}x"
    return text if mine.get("correct", True) and ref.get("correct", True) else text + " (wrong!)"


def markdown(records: list[dict[str, Any]], source: str) -> str:
    meta = next((r for r in records if r.get("kind") == "meta"), {})
    mem = next((r for r in records if r.get("kind") == "memcpy"), None)
    coll = collectives(records)
    backends = [b for b in PYC10D if any(r["backend"] == b for r in coll)]
    by = {(r["backend"], r["op"], r["world_size"], r["bytes"]): r for r in coll}
    mode = meta.get("mode", "barrier")
    how = ("a loop of K ops back to back / K, max over ranks" if mode == "loop"
           else "each op after a barrier, max over ranks")
    peer = any(r["backend"] == C_PEER for r in coll) and C_COMPARED in backends
    out = [f"From `{source}` ({meta.get('time', '?')}, {meta.get('cpus', '?')} CPUs, "
           f"{meta.get('platform', '?')}; timing: {how}; each figure the faster of the run's "
           f"rounds). Ratio = Gloo's time / pyc10d's at the same size (above 1: pyc10d faster)."
           + (f" `{C_COMPARED[7:]} t/{C_PEER}` = pyc10d shm's time / Open MPI's (the C reference, "
              f"mpirun + mpi4py, same loop; below 1: pyc10d faster)." if peer else "")]
    if mem:
        out.append(f"\nMemory bound: a {format_size(mem['bytes'])} torch copy in one process ran at "
                   f"{mem['GBps']:.1f} GB/s during the run.")
    slower = []
    for op in dict.fromkeys(r["op"] for r in coll):
        sizes = sorted({r["bytes"] for r in coll if r["op"] == op})
        header = ["size", "n", *[f"{b[7:]} µs" for b in backends], f"{REFERENCE} µs",
                  *[f"{b[7:]} / gloo" for b in backends]]
        if peer:
            header += [f"{C_PEER} µs", f"{C_COMPARED[7:]} t/{C_PEER}"]
        rows = []
        for ws in sorted({r["world_size"] for r in coll if r["op"] == op}):
            for size in sizes:
                ref = by.get((REFERENCE, op, ws, size))
                mine = [by.get((b, op, ws, size)) for b in backends]
                if ref is None and not any(mine):  # a size of another world size's grid
                    continue
                rows.append([format_size(size), str(ws), *[_us(m["time_us"]) if m else "-" for m in mine],
                             _us(ref["time_us"]) if ref else "-", *[_ratio(m, ref) for m in mine]])
                if peer:
                    c, ours = by.get((C_PEER, op, ws, size)), by.get((C_COMPARED, op, ws, size))
                    rows[-1] += [_us(c["time_us"]) if c else "-", _ratio(c, ours)]
                for b, m in zip(backends, mine):
                    if m and ref and m["time_us"] > ref["time_us"]:
                        slower.append(f"{b} {op} {format_size(size)} n={ws}: {_ratio(m, ref)}")
        out.append(f"\n{op}:\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("| " + " | ".join("---" if i == 0 else "---:" for i in range(len(header))) + " |")
        out += ["| " + " | ".join(row) + " |" for row in rows]
    out.append("\nSlower than Gloo in this run: " + ("; ".join(slower) if slower else "nowhere") + ".")
    return "\n".join(out)


def write_into(readme: Path, text: str) -> None:
    doc = readme.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} block")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--write", type=Path, metavar="DOC", help="replace the generated block in this file")
    args = ap.parse_args(argv)
    text = markdown(read_json(args.json), args.json.as_posix())
    if args.write:
        write_into(args.write, text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
