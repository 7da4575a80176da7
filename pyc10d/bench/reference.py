"""The tables of ``docs/performance.md``, each generated from its reference file.

Every table of the page sits between ``<!-- table: NAME -->`` and ``<!-- /table -->`` and is
made only from ``benchmarks/reference/NAME.json``, so a new reference run changes the file and
``python -m pyc10d.bench.reference --write docs/performance.md`` rewrites the page's tables
(``tests/test_docs.py`` regenerates each and compares). A reference file is one of two kinds:

* ``"kind": "run"``: a slice of a benchmark's own records (``python -m pyc10d.bench`` JSON,
  named by ``"run"``): the ``ops``, ``sizes`` and ``world_sizes`` given, one column per
  backend of ``columns`` (``[backend in the records, heading]``);
* ``"kind": "table"``: ``columns`` and ``rows`` written out (figures transcribed from a run
  whose command, machine and commit ``source`` names).

Both may list ``ratios``: ``[heading, numerator column, denominator column]``, each a column
of numerator / denominator computed here (pyc10d's time over a peer's: below 1, pyc10d is
faster). Each table is followed by one line naming its file, its source and its machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from pyc10d.bench.metrics import format_size
from pyc10d.bench.report import collectives, read_json

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_DIR = "benchmarks/reference"
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)

Cell = str | int | float | None


def _number(x: float) -> str:
    return f"{x:,.0f}".replace(",", " ") if x >= 100 else f"{x:.3g}"


def _cell(x: Cell) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, float)):
        return _number(float(x))
    return str(x)


def _ratio(num: Cell, den: Cell) -> str:
    if not isinstance(num, (int, float)) or not isinstance(den, (int, float)) or den <= 0:
        return "-"
    return f"{num / den:.2f}"


def _run_rows(spec: dict[str, Any], root: Path) -> tuple[list[str], list[list[Cell]]]:
    records = collectives(read_json(root / spec["run"]))
    by = {(r["backend"], r["op"], r["world_size"], r["bytes"]): r for r in records}
    heads = [h for _, h in spec["columns"]]
    columns = (["op"] if len(spec["ops"]) > 1 else []) + ["size", "n", *heads]
    rows: list[list[Cell]] = []
    for op in spec["ops"]:
        for ws in spec["world_sizes"]:
            for size in spec["sizes"]:
                cells: list[Cell] = []
                for backend, _ in spec["columns"]:
                    r = by.get((backend, op, ws, size))
                    if r is not None and not r.get("correct", True):
                        raise ValueError(f"{spec['run']}: {backend} {op} {size} n={ws} is marked wrong")
                    cells.append(None if r is None else float(r["time_us"]))
                if all(c is None for c in cells):
                    continue
                rows.append(([op] if len(spec["ops"]) > 1 else []) + [format_size(size), ws, *cells])
    return columns, rows


def table(spec: dict[str, Any], source: str, root: Path = ROOT) -> str:
    """The markdown of one reference file: its table, then the line that says where it is from."""
    if spec["kind"] == "run":
        columns, rows = _run_rows(spec, root)
    elif spec["kind"] == "table":
        columns, rows = list(spec["columns"]), [list(r) for r in spec["rows"]]
    else:
        raise ValueError(f"{source}: unknown kind {spec['kind']!r}")
    ratios = spec.get("ratios", [])
    index = {name: i for i, name in enumerate(columns)}
    for _, num, den in ratios:
        if num not in index or den not in index:
            raise ValueError(f"{source}: a ratio names a column it does not have ({num}, {den})")
    head = columns + [name for name, _, _ in ratios]
    text_cols = {i for i, _ in enumerate(columns) if all(isinstance(r[i], str) or r[i] is None for r in rows)}
    out = ["| " + " | ".join(head) + " |",
           "| " + " | ".join("---" if i in text_cols else "---:" for i in range(len(head))) + " |"]
    for r in rows:
        if len(r) != len(columns):
            raise ValueError(f"{source}: row {r} has {len(r)} cells for {len(columns)} columns")
        cells = [_cell(c) for c in r] + [_ratio(r[index[num]], r[index[den]]) for _, num, den in ratios]
        out.append("| " + " | ".join(cells) + " |")
    out.append(f"\nFrom `{source}`: {spec['source']} Machine: {spec['machine']}.")
    return "\n".join(out)


def reference_path(name: str) -> str:
    return f"{REFERENCE_DIR}/{name}.json"


def render(doc: str, root: Path = ROOT) -> str:
    """``doc`` with every ``<!-- table: NAME -->`` block regenerated from its reference file."""
    def one(m: re.Match[str]) -> str:
        rel = reference_path(m.group(2))
        spec = json.loads((root / rel).read_text())
        return m.group(1) + table(spec, rel, root) + "\n" + m.group(4)
    return BLOCK.sub(one, doc)


def blocks(doc: str) -> dict[str, str]:
    """Each table block of ``doc`` by name, as the page has it."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(doc)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", type=Path, metavar="DOC", help="rewrite the table blocks of this file in place")
    ap.add_argument("--check", type=Path, metavar="DOC", help="exit 1 when a table block differs from its file")
    ap.add_argument("name", nargs="*", help="print the table of these reference files (benchmarks/reference/NAME.json)")
    args = ap.parse_args(argv)
    for name in args.name:
        rel = reference_path(name)
        print(table(json.loads((ROOT / rel).read_text()), rel))
    if args.write:
        args.write.write_text(render(args.write.read_text()))
    if args.check:
        doc = args.check.read_text()
        if render(doc) != doc:
            print(f"{args.check}: a table differs from its reference file", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
