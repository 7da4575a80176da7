"""``python -m pyc10d.sim``: predicted time, bytes, messages and peers per rank of each
collective at world sizes up to 4,096, for today's selection and the new one, beside the
textbook lower bound. Simulated, not measured: see ``engine`` and ``network``; ``--fit``
measures the parameters on this host first (``fit``) and checks the prediction at n = 2,
4, 8 against tcp ranks run here.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..algorithms import cost
from .network import Net
from .table import model_of, new, outcome, today

OPS = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "barrier"]


def _size(text: str) -> int:
    text = text.strip().upper()
    for suffix, mult in (("KIB", 1 << 10), ("MIB", 1 << 20), ("GIB", 1 << 30), ("K", 1 << 10), ("M", 1 << 20)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * mult)
    return int(text.rstrip("B"))


def _fmt_t(s: float) -> str:
    return f"{s * 1e6:.0f} us" if s < 1e-2 else f"{s * 1e3:.1f} ms"


def _fmt_b(b: float) -> str:
    if b != b:
        return "-"
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b / k:.1f} {unit}"
    return f"{b:.0f} B"


def table(ops: list[str], worlds: list[int], sizes: list[int], net: Net, out: object = sys.stdout) -> list[dict]:
    m = model_of(net)
    rows = []
    print("| op | n | size | today: algorithm | time | sent/rank | msgs | peers | new: algorithm | time "
          "| sent/rank | msgs | peers | lower bound | new / bound |", file=out)
    print("|" + " --- |" * 15, file=out)
    for op in ops:
        for n in worlds:
            for s in ([0] if op == "barrier" else sizes):
                a = outcome(op, today(op, n, s), n, s, net)
                b = outcome(op, new(op, n, s), n, s, net)
                lb = cost.lower_bound(op, n, s, m)
                mark = lambda o: "" if o.how == "sim" else " (model)"  # noqa: E731
                print(f"| {op} | {n} | {_fmt_b(s)} | {a.algorithm}{mark(a)} | {_fmt_t(a.seconds)} | "
                      f"{_fmt_b(a.bytes_per_rank)} | {a.msgs_per_rank if a.msgs_per_rank >= 0 else '-'} | "
                      f"{a.peers_per_rank} | {b.algorithm}{mark(b)} | {_fmt_t(b.seconds)} | "
                      f"{_fmt_b(b.bytes_per_rank)} | {b.msgs_per_rank} | {b.peers_per_rank} | "
                      f"{_fmt_t(lb)} | {b.seconds / lb if lb else 1:.2f} |", file=out, flush=True)
                rows.append({"op": op, "n": n, "bytes": s, "today": a, "new": b, "bound": lb})
    return rows


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pyc10d.sim", description=__doc__)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--worlds", default="64,256,1024,4096")
    p.add_argument("--sizes", default="8,64KiB,1MiB,16MiB", help="bytes per rank (all_gather, "
                   "reduce_scatter: one rank's block)")
    p.add_argument("--ranks-per-host", type=int, default=1)
    p.add_argument("--cores-per-host", type=int, default=1)
    p.add_argument("--latency-us", type=float, default=Net.latency * 1e6)
    p.add_argument("--o-us", type=float, default=Net.o * 1e6, help="CPU per message and side")
    p.add_argument("--gbps", type=float, default=8 / Net.nic_beta / 1e9, help="NIC bandwidth, Gb/s")
    p.add_argument("--reduce-gbs", type=float, default=1 / Net.gamma / 1e9, help="reduction, GB/s")
    p.add_argument("--fit", action="store_true", help="fit the parameters on this host (tcp "
                   "ping-pong, one reduction) and check the prediction against tcp at n=2,4,8")
    p.add_argument("--fit-save", metavar="JSON", help="with --fit: write the measurements here")
    p.add_argument("--fit-load", metavar="JSON", help="with --fit: use these measurements "
                   "(a --fit-save) instead of measuring again")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.fit:
        from .fit import validate
        validate(saved=args.fit_load, save=args.fit_save)
        return 0
    net = Net(ranks_per_host=args.ranks_per_host, cores_per_host=args.cores_per_host,
              latency=args.latency_us * 1e-6, o=args.o_us * 1e-6, nic_beta=8 / (args.gbps * 1e9),
              gamma=1 / (args.reduce_gbs * 1e9))
    print(f"Simulated (pyc10d.sim), not measured: {net}\n")
    t0 = time.time()
    table(args.ops.split(","), [int(w) for w in args.worlds.split(",")],
          [_size(s) for s in args.sizes.split(",")], net)
    print(f"\n({time.time() - t0:.0f} s of simulation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
