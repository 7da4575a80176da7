"""TCPStore throughput and tail latency under many clients: pyc10d's vs torch's, same run.

``python -m pyc10d.bench.store`` starts a store server in this process (pyc10d's
``TCPStore(is_master=True)``, then torch's ``torch.distributed.TCPStore`` with its default
libuv server) and drives it from client *processes*, each running a share of the clients as
*threads*, every thread with its own store object (its own connection), issuing one request
after another: ``set``, ``get`` (of a key that is there), ``add`` and ``wait`` (for a key that
is there, so this is the round trip of a wait, not a parked one). torch's client does not
wait for an answer to ``set`` (its server sends none), so torch's set figures count requests
sent, not requests served; pyc10d's protocol answers every set. Each set writes a key of its
own, read back after the window (see ``_run_op``). 1 client is one process
with one thread; more are spread over ``--procs`` processes (4 by default: 512 clients are 4 x
128 threads). Both stores get the same processes, threads and keys.

Every op runs for ``--seconds`` in a window that starts at the same instant in every client
process (``CLOCK_MONOTONIC`` is system wide); throughput is the ops completed in the window
over its length, p50/p99 over every op's latency. The server shares the machine's cores with
the clients, so this measures the whole stack, the client library included. Writes
``<out>/store-<time>.json`` and a plot beside it. Every answer is checked (see ``_run_op``);
a wrong one is counted in the record and makes the run exit 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

OPS = ("set", "get", "add", "wait")
IMPLS = ("pyc10d", "torch")


def _client(impl: str, host: str, port: int) -> Any:
    from datetime import timedelta

    if impl == "torch":
        from torch.distributed import TCPStore
    else:
        from pyc10d.store import TCPStore
    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=120),
                    wait_for_workers=False)


def _value(j: int) -> bytes:
    """The 16 bytes the ``j``-th set of a client writes: its own number, so a read-back tells
    every write apart."""
    return b"%016d" % j


def _read_back(store: Any, tid: str, count: int, batch: int = 1000) -> int:
    """How many of the ``count`` keys a client's sets wrote are missing or hold another value
    than their write's (``check`` first: ``multi_get`` of a missing key would wait for it)."""
    wrong = 0
    for start in range(0, count, batch):
        keys = [f"bench/s/{tid}/{j}" for j in range(start, min(start + batch, count))]
        present = keys if store.check(keys) else [k for k in keys if store.check([k])]
        wrong += len(keys) - len(present)
        got = store.multi_get(present) if present else []
        wrong += sum(bytes(v) != _value(int(k.rsplit("/", 1)[1])) for k, v in zip(present, got))
    return wrong


def _run_op(store: Any, op: str, tid: str, t0: float, t1: float, lat: list[float]) -> tuple[int, int]:
    """Issue ``op`` back to back until ``t1``: (ops inside [t0, t1], wrong answers among all
    issued); latencies (us) of the ops inside the window go to ``lat``. Every answer is
    checked: a get returns the value, an add the counter's previous value + 1 (each client
    counts on a key of its own). A set writes a key of its own (``bench/s/<client>/<j>``, its
    number as the value), and after the window every one of them is read back. A wait (for a
    key that is there) answers "ready" and nothing else, so no answer can show that a wait did
    nothing: after the window a wait for a missing key must time out instead."""
    key, value, counter = f"bench/{tid}", b"x" * 16, f"bench/n/{tid}"
    last = [store.add(counter, 0)]
    sets = [0]

    def add() -> bool:
        n = store.add(counter, 1)
        if not isinstance(n, int):
            return False  # a broken answer: the counter's count stays where it was
        ok, last[0] = n == last[0] + 1, n
        return ok

    def set_() -> bool:
        j = sets[0]
        sets[0] = j + 1
        store.set(f"bench/s/{tid}/{j}", _value(j))
        return True  # checked by reading back, after the window

    call = {"set": set_, "get": lambda: store.get(key) == value,
            "add": add, "wait": lambda: store.wait([key]) is None}[op]
    now = time.monotonic
    wrong = 0
    while now() < t0:
        wrong += not call()  # warm up until the window opens
    done = 0
    while True:
        a = now()
        if a >= t1:
            break
        wrong += not call()
        b = now()
        if b <= t1:
            done += 1
            lat.append((b - a) * 1e6)
    if op == "set":
        wrong += _read_back(store, tid, sets[0])
    elif op == "wait":
        from datetime import timedelta

        try:
            store.wait([f"bench/absent/{tid}"], timedelta(milliseconds=50))
            wrong += 1  # returned for a key nobody set
        except Exception:  # noqa: BLE001 - a timeout, under either store's name for it
            pass
    return done, wrong


def _worker(impl: str, host: str, port: int, threads: int, first: int) -> None:
    """One client process: ``threads`` clients; per op, a 'go' line in, a JSON line out."""
    stores = [_client(impl, host, port) for _ in range(threads)]
    for i, s in enumerate(stores):
        s.set(f"bench/{first + i}", b"x" * 16)
    print("ready", flush=True)
    for line in sys.stdin:
        op, t0, t1 = line.split()
        lats: list[list[float]] = [[] for _ in stores]
        counts = [(0, 0)] * threads

        def run(i: int, op: str = op, t0: float = float(t0), t1: float = float(t1),
                lats: list[list[float]] = lats, counts: list[tuple[int, int]] = counts) -> None:
            counts[i] = _run_op(stores[i], op, str(first + i), t0, t1, lats[i])

        ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        flat = [round(x, 1) for lat in lats for x in lat]
        print(json.dumps({"ops": sum(c[0] for c in counts), "wrong": sum(c[1] for c in counts),
                          "lat_us": flat}), flush=True)


def _server(impl: str) -> Any:
    from datetime import timedelta

    if impl == "torch":
        from torch.distributed import TCPStore
    else:
        from pyc10d.store import TCPStore
    return TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=120),
                    wait_for_workers=False)


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def measure(impl: str, clients: int, procs: int, ops: list[str], seconds: float) -> list[dict[str, Any]]:
    """Start the server and ``clients`` clients over ``procs`` processes; one record per op."""
    server = _server(impl)
    procs = max(1, min(procs, clients))
    shares = [clients // procs + (i < clients % procs) for i in range(procs)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    workers, first = [], 0
    for n in shares:
        cmd = [sys.executable, "-m", "pyc10d.bench.store", "--worker", impl, "127.0.0.1",
               str(server.port), str(n), str(first)]
        workers.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env))
        first += n
    records = []
    try:
        for w in workers:
            assert w.stdout is not None and w.stdout.readline().strip() == "ready"
        for op in ops:
            t0 = time.monotonic() + 0.5  # warm-up, the same instant for every process
            t1 = t0 + seconds
            for w in workers:
                assert w.stdin is not None
                w.stdin.write(f"{op} {t0} {t1}\n")
                w.stdin.flush()
            total, wrong, lat = 0, 0, []
            for w in workers:
                assert w.stdout is not None
                got = json.loads(w.stdout.readline())
                total += got["ops"]
                wrong += got["wrong"]
                lat += got["lat_us"]
            records.append({"impl": impl, "op": op, "clients": clients, "procs": procs,
                            "threads_per_proc": max(shares), "seconds": seconds, "ops": total,
                            "ops_per_s": total / seconds, "p50_us": _percentile(lat, 0.5),
                            "p99_us": _percentile(lat, 0.99), "wrong": wrong})
    finally:
        for w in workers:
            if w.stdin is not None:
                w.stdin.close()
        for w in workers:
            try:
                w.wait(timeout=60)
            except subprocess.TimeoutExpired:
                w.kill()
        del server
    return records


def table(records: list[dict[str, Any]]) -> str:
    """Markdown: one row per (op, clients), both stores side by side, and their ratio."""
    by = {(r["impl"], r["op"], r["clients"]): r for r in records}
    rows = ["| op | clients | pyc10d ops/s | torch ops/s | pyc10d / torch | pyc10d p99 us | torch p99 us |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for op in OPS:
        for n in sorted({r["clients"] for r in records}):
            p, t = by.get(("pyc10d", op, n)), by.get(("torch", op, n))
            if p is None and t is None:
                continue
            ratio = f"{p['ops_per_s'] / t['ops_per_s']:.2f}x" if p and t and t["ops_per_s"] else "-"
            rows.append(f"| {op} | {n} | {p['ops_per_s'] if p else 0:,.0f} | "
                        f"{t['ops_per_s'] if t else 0:,.0f} | {ratio} | "
                        f"{p['p99_us'] if p else 0:,.0f} | {t['p99_us'] if t else 0:,.0f} |")
    return "\n".join(rows)


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for impl, style in zip(IMPLS, ("-", "--")):
        for op in OPS:
            rs = sorted((r for r in records if r["impl"] == impl and r["op"] == op),
                        key=lambda r: r["clients"])
            if not rs:
                continue
            xs = [r["clients"] for r in rs]
            ax1.plot(xs, [r["ops_per_s"] for r in rs], style, marker="o", label=f"{impl} {op}")
            ax2.plot(xs, [r["p99_us"] for r in rs], style, marker="o", label=f"{impl} {op}")
    for ax, ylabel in ((ax1, "ops/s (all clients)"), (ax2, "p99 latency (us)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    ax1.set_yscale("log")
    ax2.set_yscale("log")
    ax1.legend(fontsize=7, ncol=2)
    fig.suptitle("TCPStore: pyc10d vs torch (server in one process, clients as threads of 4 processes)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        impl, host, port, threads, first = sys.argv[2:7]
        _worker(impl, host, int(port), int(threads), int(first))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="1,64,512", help="comma-separated client counts")
    ap.add_argument("--procs", type=int, default=4, help="client processes (threads share the rest)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--seconds", type=float, default=2.0, help="measured window per op")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every job, interleaved; keep the best")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    ops = args.ops.split(",")
    records: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for n in (int(c) for c in args.clients.split(",")):
            for impl in args.impls.split(","):
                got = measure(impl, n, args.procs, ops, args.seconds)
                for r in got:
                    print(f"{impl:7} {r['op']:5} {n:4} clients: {r['ops_per_s']:>10,.0f} ops/s  "
                          f"p50 {r['p50_us']:>8,.0f} us  p99 {r['p99_us']:>8,.0f} us", flush=True)
                records += got
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in records:
        k = (r["impl"], r["op"], r["clients"])
        if k not in best or r["ops_per_s"] > best[k]["ops_per_s"]:
            best[k] = r
    print(table(list(best.values())))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"store-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    meta = {"cpus": os.cpu_count(), "procs": args.procs, "seconds": args.seconds,
            "rounds": args.rounds, "client_layout": "processes x threads, one connection each"}
    Path(f"{stem}.json").write_text(json.dumps({"meta": meta, "best": list(best.values()),
                                                "all": records}, indent=1))
    plot(list(best.values()), Path(f"{stem}.png"))
    print(f"wrote {stem}.json and {stem}.png")
    bad = [f"{r['impl']} {r['op']} at {r['clients']} clients: {r['wrong']} wrong answer(s)"
           for r in records if r["wrong"]]
    for line in bad:
        print("WRONG", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
