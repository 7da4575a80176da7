"""Flight-recorder dumps as a picture: a Chrome/Perfetto trace and a PNG timeline.

``python -m pyc10d.flight_recorder DIR --trace out.json`` writes every rank's last operations
as a trace (open it in https://ui.perfetto.dev or chrome://tracing): one process per rank,
one track per group, one slice per operation, named after it, with its sequence number,
size and state (``completed``, ``running``, ``issued``, ``failed``) as arguments, and an
instant event where the rank dumped (the reason in its arguments).
``--plot out.png`` draws the same as one picture: ranks as rows, operations as bars coloured
by state, the first operation where ranks disagree and the slowest rank marked.

Times: each dump holds monotonic times and the wall-clock and monotonic time of the dump,
so every entry is put on the wall clock (ranks on different hosts line up as well as their
clocks do). An operation without an end (running, issued) is drawn up to its rank's dump.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

#: Chrome's reserved colour names per state (Perfetto picks its own colours by name).
_CNAME = {"completed": "good", "running": "bad", "issued": "grey", "failed": "terrible"}
#: The plot's colours per state.
COLOURS = {"completed": "#4c9f70", "running": "#e8a33d", "issued": "#9aa5b1", "failed": "#d64545"}

Groups = dict[str, dict[int, dict[str, Any]]]


def _wall(dump: dict[str, Any], t: float) -> float:
    """Monotonic time ``t`` of ``dump``'s process on the wall clock (seconds)."""
    return dump["dumped"] - (dump["dumped_monotonic"] - t)


def spans(dump: dict[str, Any]) -> list[dict[str, Any]]:
    """``dump``'s entries with ``start``/``end`` on the wall clock (an open one ends at the dump)."""
    out = []
    for e in dump["entries"]:
        start = e["started"] or e["issued"]
        if not start:
            continue
        end = e["ended"] if e["ended"] else dump["dumped_monotonic"]
        out.append({**e, "start": _wall(dump, start), "end": _wall(dump, max(end, start))})
    return out


def first_mismatch(dumps: dict[int, dict[str, Any]]) -> tuple[int, dict[int, str]] | None:
    """The first sequence number at which the ranks' dumps name different operations."""
    by_seq: dict[int, dict[int, str]] = defaultdict(dict)
    for r, d in dumps.items():
        for e in d["entries"]:
            by_seq[e["seq"]][r] = e["op"]
    for seq in sorted(by_seq):
        if len(set(by_seq[seq].values())) > 1:
            return seq, by_seq[seq]
    return None


def slowest(dumps: dict[int, dict[str, Any]], size: int) -> tuple[int, str] | None:
    """The rank the others waited for, and why it is picked: a rank without a dump (dead,
    or it never reached the failure), else the rank furthest behind in sequence numbers,
    else (all level) the one that entered the last operation last. None: nothing to tell."""
    missing = sorted(set(range(size)) - set(dumps))
    if missing:
        return missing[0], "no dump: dead, or it never failed"
    reached = {r: max((e["seq"] for e in d["entries"]), default=0) for r, d in dumps.items()}
    if not reached:
        return None
    low, high = min(reached.values()), max(reached.values())
    if low < high:
        return min(r for r, s in reached.items() if s == low), f"behind: at #{low}, others reached #{high}"
    last = {r: max((s["start"] for s in spans(d) if s["seq"] == low), default=0.0) for r, d in dumps.items()}
    if len(set(last.values())) < 2:
        return None
    r = max(last, key=lambda k: last[k])
    return r, f"last to enter #{low} (+{1e3 * (last[r] - min(last.values())):.1f} ms)"


def out_of_step(mismatch: tuple[int, dict[int, str]] | None) -> list[int]:
    """The ranks of a mismatch that ran what fewer ranks ran (the ones that skipped or added)."""
    if mismatch is None:
        return []
    by_op: dict[str, list[int]] = defaultdict(list)
    for r, op in mismatch[1].items():
        by_op[op].append(r)
    majority = max(by_op.values(), key=len)
    odd = sorted(r for r in mismatch[1] if r not in majority)
    return odd if len(odd) < len(majority) else []


def to_trace(groups: Groups) -> dict[str, Any]:
    """Chrome trace JSON (the ``traceEvents`` form) of every group's dumps."""
    events: list[dict[str, Any]] = []
    ranks = sorted({r for dumps in groups.values() for r in dumps})
    t0 = min((s["start"] for dumps in groups.values() for d in dumps.values() for s in spans(d)), default=0.0)
    for r in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
    for tid, group in enumerate(sorted(groups), start=1):
        for r, d in sorted(groups[group].items()):
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                           "args": {"name": f"group {group}"}})
            for s in spans(d):
                events.append({
                    "ph": "X", "name": s["op"], "cat": s["state"], "pid": r, "tid": tid,
                    "ts": (s["start"] - t0) * 1e6, "dur": max(0.0, (s["end"] - s["start"]) * 1e6),
                    "cname": _CNAME.get(s["state"], "grey"),
                    "args": {"seq": s["seq"], "numel": s["numel"], "dtype": s["dtype"], "state": s["state"],
                             "group": group},
                })
            events.append({"ph": "i", "s": "t", "name": "dump", "pid": r, "tid": tid,
                           "ts": (d["dumped"] - t0) * 1e6, "args": {"reason": d.get("reason", "")}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "pyc10d flight recorder", "groups": sorted(groups)}}


def plot(groups: Groups, path: str | None = None, last_s: float | None = None) -> Any:
    """Draw the dumps (rows: group/rank; bars: operations, coloured by state); save to
    ``path`` when given. Returns the matplotlib Axes (its y tick labels name the rows).

    ``last_s``: show only the last that many seconds before the latest dump. matplotlib is
    imported here, not at module import: it is an optional dependency (``bench``, ``dev``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows: list[tuple[str, int]] = []
    for group in sorted(groups):
        size = max(d["size"] for d in groups[group].values())
        rows += [(group, r) for r in range(size)]
    t_end = max(d["dumped"] for dumps in groups.values() for d in dumps.values())
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.55 * len(rows)))
    labels = []
    x_min = 0.0
    for y, (group, r) in enumerate(rows):
        d = groups[group].get(r)
        label = f"rank {r}" if len(groups) == 1 else f"{group} / rank {r}"
        if d is None:
            labels.append(f"{label} (no dump)")
            continue
        labels.append(label)
        for state in COLOURS:
            bars = [(s["start"] - t_end, max(s["end"] - s["start"], 1e-6)) for s in spans(d) if s["state"] == state]
            if last_s is not None:
                bars = [b for b in bars if b[0] + b[1] >= -last_s]
            if bars:
                x_min = min(x_min, min(b[0] for b in bars))
                ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=COLOURS[state], edgecolors="white",
                               linewidth=0.3)
        if d["entries"]:
            last = d["entries"][-1]
            ax.annotate(f"#{last['seq']} {last['op']} ({last['state']})", (d["dumped"] - t_end, y),
                        xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
    if last_s is not None:
        x_min = max(x_min, -last_s)
    for group in sorted(groups):
        dumps = groups[group]
        base = rows.index((group, 0))
        mismatch = first_mismatch(dumps)
        if mismatch is not None:
            seq, ops = mismatch
            for r in ops:
                hit = [s for s in spans(dumps[r]) if s["seq"] == seq]
                if hit:
                    ax.plot(hit[0]["start"] - t_end, base + r, marker="v", color="black", markersize=9, zorder=5)
            text = ", ".join(f"rank {r}: {op}" for r, op in sorted(ops.items()))
            ax.set_title(f"first mismatch at #{seq} ({text})", fontsize=9, loc="left")
        for r in out_of_step(mismatch):
            labels[base + r] += "  << out of step"
        slow = slowest(dumps, max(d["size"] for d in dumps.values()))
        if slow is not None:
            r, why = slow
            ax.axhspan(base + r - 0.45, base + r + 0.45, color="#d64545", alpha=0.12, zorder=0)
            labels[base + r] += "  << slowest"
            ax.text(0.005, base + r + 0.4, why, transform=ax.get_yaxis_transform(), ha="left",
                    va="bottom", fontsize=7, color="#a02020")
    ax.set_yticks(range(len(rows)), labels)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(x_min - 0.02 * max(1e-3, -x_min), 0.3 * max(1e-3, -x_min))
    ax.set_xlabel("seconds before the last dump")
    ax.legend(handles=[Patch(color=c, label=s) for s, c in COLOURS.items()]
              + [plt.Line2D([], [], marker="v", color="black", linestyle="", label="first mismatch")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    first = min((d for dumps in groups.values() for d in dumps.values()), key=lambda d: d["dumped"])
    reason = first.get("reason", "").split(" [flight recorder:")[0]
    fig.suptitle(f"pyc10d flight recorder; first failure (rank {first['rank']}): "
                 + (reason if len(reason) <= 150 else reason[:147] + "..."), fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return ax
