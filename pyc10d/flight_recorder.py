"""``python -m pyc10d.flight_recorder DIR``: merge the ranks' flight-recorder dumps.

Every rank of a failed group writes ``pyc10d-trace-<group>-rank<r>.json`` (see
``pyc10d.backends.flight_recorder``). Read together, they say what no single log can: per
group, how far each rank got, which ranks are behind the others, and the first operation
where ranks ran different collectives. ``--trace out.json`` and ``--plot out.png`` draw them
(``pyc10d.timeline``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def load(folder: str | Path) -> dict[str, dict[int, dict[str, Any]]]:
    """group name -> rank -> dump."""
    groups: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for path in sorted(Path(folder).glob("pyc10d-trace-*.json")):
        dump = json.loads(path.read_text())
        groups[dump["group"]][int(dump["rank"])] = dump
    return dict(groups)


def _last(entries: list[dict[str, Any]], states: tuple[str, ...]) -> dict[str, Any] | None:
    done = [e for e in entries if e["state"] in states]
    return max(done, key=lambda e: e["seq"]) if done else None


def analyse(group: str, dumps: dict[int, dict[str, Any]]) -> list[str]:
    """Report lines for one group."""
    size = max(d["size"] for d in dumps.values())
    lines = [f"group {group!r}: {size} ranks, dumps from ranks {sorted(dumps)}"]
    missing = sorted(set(range(size)) - set(dumps))
    if missing:
        lines.append(f"  no dump from ranks {missing} (dead, or never failed)")
    entered: dict[int, int] = {}
    for r, d in sorted(dumps.items()):
        entries = d["entries"]
        done = _last(entries, ("completed",))
        last = _last(entries, ("issued", "running", "completed", "failed"))
        entered[r] = last["seq"] if last else 0
        text = f"  rank {r}: last completed " + (f"#{done['seq']} {done['op']}" if done else "nothing")
        if last and (done is None or last["seq"] != done["seq"]):
            text += f"; #{last['seq']} {last['op']} {last['state']}"
        lines.append(text)
    if entered:
        front = max(entered.values())
        behind = sorted(r for r, s in entered.items() if s < front)
        if behind:
            lines.append("  behind: " + ", ".join(f"rank {r} (at #{entered[r]}, others reached #{front})"
                                                for r in behind))
    by_seq: dict[int, dict[int, str]] = defaultdict(dict)
    for r, d in dumps.items():
        for e in d["entries"]:
            by_seq[e["seq"]][r] = e["op"]
    for seq in sorted(by_seq):
        ops = by_seq[seq]
        if len(set(ops.values())) > 1:
            lines.append(f"  ranks disagree at #{seq}: " + ", ".join(f"rank {r} ran {op}" for r, op in sorted(ops.items())))
            counts = defaultdict(list)
            for r, op in ops.items():
                counts[op].append(r)
            majority = max(counts.values(), key=len)
            odd = sorted(r for r in ops if r not in majority)
            if len(majority) > len(odd):
                lines.append(f"  out of step: ranks {odd} (the others ran {ops[majority[0]]} #{seq}: "
                             f"a collective skipped or added before it)")
            break
    return lines


def report(folder: str | Path) -> str:
    groups = load(folder)
    if not groups:
        return f"no pyc10d-trace-*.json in {folder}"
    return "\n".join(line for g in sorted(groups) for line in analyse(g, groups[g]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyc10d.flight_recorder",
                                 description="Merge the ranks' flight-recorder dumps of DIR into one report.")
    ap.add_argument("dir", help="the folder of pyc10d-trace-*.json (PYC10D_TRACE_DIR)")
    ap.add_argument("--trace", metavar="OUT.json", help="also write a Chrome/Perfetto trace (pyc10d.timeline)")
    ap.add_argument("--plot", metavar="OUT.png", help="also draw the ranks' timeline (needs matplotlib)")
    ap.add_argument("--last", type=float, metavar="SECONDS", help="plot only the last SECONDS before the dumps")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    print(report(args.dir))
    groups = load(args.dir)
    if groups and args.trace:
        from . import timeline

        Path(args.trace).write_text(json.dumps(timeline.to_trace(groups)))
        print(f"wrote {args.trace} (open it in https://ui.perfetto.dev)")
    if groups and args.plot:
        from . import timeline

        timeline.plot(groups, args.plot, last_s=args.last)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
