"""The collective grid of ``docs/collectives-grid.md``, generated from a committed reference run.

``python -m pyc10d.bench.readme benchmarks/reference/<run>.json [--write docs/collectives-grid.md]
[--headline README.md]`` prints (or writes between the document's ``<!-- bench-tables:begin -->``
and ``<!-- bench-tables:end -->`` lines) markdown made only from that file: the run's conditions
and memcpy bound, every op's latency per backend and world size with the ratio to Gloo, and
every (op, size, world size) at which a pyc10d backend was slower than Gloo. ``--headline``
writes the README's one table (all_reduce at a few sizes: pyc10d, Gloo and Open MPI from the
same run) between ``<!-- bench-headline:begin -->`` and ``<!-- bench-headline:end -->``.
Nothing is typed in by hand, so neither document can drift from the file it cites
(``tests/test_docs.py`` regenerates both and compares).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pyc10d.bench.metrics import format_size
from pyc10d.bench.report import C_PEER, C_PEER_TCP, REFERENCE, collectives, read_json

BEGIN, END = "<!-- bench-tables:begin -->", "<!-- bench-tables:end -->"
HEADLINE_BEGIN, HEADLINE_END = "<!-- bench-headline:begin -->", "<!-- bench-headline:end -->"
#: The README's table: all_reduce at these sizes, each world size of the run.
HEADLINE_OP, HEADLINE_SIZES = "all_reduce", (8, 32 << 10, 2 << 20, 64 << 20)
#: Its columns: (backend in the records, heading).
HEADLINE_COLUMNS = (("pyc10d-shm", "pyc10d shm"), ("pyc10d-tcp", "pyc10d tcp"), (REFERENCE, "Gloo"),
                    (C_PEER, "Open MPI"), (C_PEER_TCP, "Open MPI over TCP"))
PYC10D = ("pyc10d-shm", "pyc10d-tcp", "pyc10d-threaded")
#: Compared with the C reference when the run has it: shm with Open MPI on its shared-memory
#: transport, tcp with Open MPI forced onto TCP (``mpi-tcp``), the same transport in C.
C_COMPARED = (("pyc10d-shm", C_PEER), ("pyc10d-tcp", C_PEER_TCP))


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
    peers = [(b, c) for b, c in C_COMPARED if b in backends and any(r["backend"] == c for r in coll)]
    said = {C_PEER: "Open MPI's (the C reference, mpirun + mpi4py, same loop)",
            C_PEER_TCP: "Open MPI's forced onto its TCP transport (`--mca btl tcp,self`)"}
    out = [f"From `{source}` ({meta.get('time', '?')}, {meta.get('cpus', '?')} CPUs, "
           f"{meta.get('platform', '?')}; timing: {how}; each figure the faster of the run's "
           f"rounds). Ratio = Gloo's time / pyc10d's at the same size (above 1: pyc10d faster)."
           + "".join(f" `{b[7:]} t/{c}` = pyc10d {b[7:]}'s time / {said[c]}; below 1: pyc10d faster."
                     for b, c in peers)]
    if mem:
        out.append(f"\nMemory bound: a {format_size(mem['bytes'])} torch copy in one process ran at "
                   f"{mem['GBps']:.1f} GB/s during the run.")
    slower = []
    for op in dict.fromkeys(r["op"] for r in coll):
        sizes = sorted({r["bytes"] for r in coll if r["op"] == op})
        header = ["size", "n", *[f"{b[7:]} µs" for b in backends], f"{REFERENCE} µs",
                  *[f"{b[7:]} / gloo" for b in backends]]
        for b, c in peers:
            header += [f"{c} µs", f"{b[7:]} t/{c}"]
        rows = []
        for ws in sorted({r["world_size"] for r in coll if r["op"] == op}):
            for size in sizes:
                ref = by.get((REFERENCE, op, ws, size))
                mine = [by.get((b, op, ws, size)) for b in backends]
                if ref is None and not any(mine):  # a size of another world size's grid
                    continue
                rows.append([format_size(size), str(ws), *[_us(m["time_us"]) if m else "-" for m in mine],
                             _us(ref["time_us"]) if ref else "-", *[_ratio(m, ref) for m in mine]])
                for b, c in peers:
                    theirs, ours = by.get((c, op, ws, size)), by.get((b, op, ws, size))
                    rows[-1] += [_us(theirs["time_us"]) if theirs else "-", _ratio(theirs, ours)]
                for b, m in zip(backends, mine):
                    if m and ref and m["time_us"] > ref["time_us"]:
                        slower.append(f"{b} {op} {format_size(size)} n={ws}: {_ratio(m, ref)}")
        out.append(f"\n{op}:\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("| " + " | ".join("---" if i == 0 else "---:" for i in range(len(header))) + " |")
        out += ["| " + " | ".join(row) + " |" for row in rows]
    out.append("\nSlower than Gloo in this run: " + ("; ".join(slower) if slower else "nowhere") + ".")
    return "\n".join(out)


def headline(records: list[dict[str, Any]], source: str) -> str:
    """The README's table: µs per all_reduce of each backend and Open MPI, one run."""
    meta = next((r for r in records if r.get("kind") == "meta"), {})
    by = {(r["backend"], r["world_size"], r["bytes"]): r for r in collectives(records) if r["op"] == HEADLINE_OP}
    cols = [(b, name) for b, name in HEADLINE_COLUMNS if any(k[0] == b for k in by)]
    out = [f"| {HEADLINE_OP} | ranks | " + " | ".join(f"{name} µs" for _, name in cols) + " |",
           "| ---: | ---: | " + " | ".join("---:" for _ in cols) + " |"]
    for ws in sorted({k[1] for k in by}):
        for size in HEADLINE_SIZES:
            cells = [by.get((b, ws, size)) for b, _ in cols]
            if any(cells):
                out.append(f"| {format_size(size)} | {ws} | " + " | ".join(
                    "-" if c is None else _us(c["time_us"]) + ("" if c.get("correct", True) else " (wrong!)")
                    for c in cells) + " |")
    out.append(f"\nFrom `{source}` ({meta.get('time', '?')}, {meta.get('cpus', '?')} CPUs, float32, "
               f"back to back, every result checked; lower is faster).")
    return "\n".join(out)


def write_into(readme: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    doc = readme.read_text()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{readme} has no {begin} ... {end} block")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", type=Path)
    ap.add_argument("--write", type=Path, metavar="DOC", help="replace the generated block in this file")
    ap.add_argument("--headline", type=Path, metavar="README", help="replace the headline table in this file")
    args = ap.parse_args(argv)
    records = read_json(args.json)
    text = markdown(records, args.json.as_posix())
    if args.write:
        write_into(args.write, text)
    if args.headline:
        write_into(args.headline, headline(records, args.json.as_posix()), HEADLINE_BEGIN, HEADLINE_END)
    if not args.write and not args.headline:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
