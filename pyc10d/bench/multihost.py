"""``python -m pyc10d.bench.multihost``: all_reduce across namespace hosts, hierarchical vs flat tcp.

Builds ``--hosts`` hosts (``pyc10d.testing.hosts``; needs root) with ``--ranks-per-host``
ranks each, shapes the links between them (``--delay-ms`` one-way netem delay, or when the
kernel has no ``sch_netem`` a ``--rate`` limit with tbf, recorded in the JSON), and times
all_reduce (float32, SUM) on ``auto`` (which picks the hierarchical backend), on ``tcp`` (the
flat ring) and on torch.distributed's ``gloo`` (the peer, same hosts, same loop). Per size: a few warm-up calls, a barrier, then K calls back to back, each
on its own buffer so that every result is checked afterwards (a wrong one stops the run); a
rank's figure is its elapsed time / K, the reported one the maximum over ranks (the slowest
rank bounds a synchronous step). Writes ``<out>/multihost-<time>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyc10d.bench.metrics import MIB, format_size, parse_size
from pyc10d.bench.report import write_result
from pyc10d.bench.timing import back_to_back

PORT = 29400


def _iters(nbytes: int, scale: float) -> int:
    """K: many calls for small messages, a few for large ones (bounded run time)."""
    k = 200 if nbytes <= 64 << 10 else 40 if nbytes <= 2 * MIB else 6
    return max(2, int(k * scale))


# -- inside a host ------------------------------------------------------------------------
def _rank(rank: int, ws: int, master: str, backend: str, sizes: list[int], scale: float, out: str) -> None:
    import torch

    from pyc10d.bench.worker import Op

    if backend == "gloo":
        import torch.distributed as dist

        os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")  # (the host's name resolves to loopback)
    else:
        import pyc10d as dist  # type: ignore[no-redef]
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://{master}", rank=rank, world_size=ws,
                            timeout=datetime.timedelta(seconds=120))
    rows = []
    for nbytes in sizes:
        k = _iters(nbytes, scale)
        op = Op(dist, "all_reduce", max(nbytes // 4, 1), rank, ws, k)  # k buffers: each checked
        for i in range(min(k, 10)):  # (two were too few: hier's first 8 B row read 2.2 ms, its next 0.4)
            op.run(i)
        op.reset()
        seconds = back_to_back(dist, op.run, k)
        ok = torch.tensor([0 if op.check() else 1])
        dist.all_reduce(ok)  # how many ranks saw a wrong result
        if ok.item():
            raise SystemExit(f"multihost bench: {backend} all_reduce of {nbytes} bytes gave a wrong "
                             f"result on {int(ok.item())} rank(s)")
        rows.append({"bytes": nbytes, "iters": k, "seconds": seconds, "checked": True})
    if rank == 0:
        Path(out).write_text(json.dumps({"backend": dist.get_backend(), "rows": rows}))
    dist.destroy_process_group()
    os._exit(0)


def _host_main(args: argparse.Namespace) -> None:
    fork = multiprocessing.get_context("fork")
    sizes = [int(s) for s in args.sizes.split(",")]
    procs = [fork.Process(target=_rank, args=(int(r), args.world, args.master, args.backend, sizes, args.scale,
                                              args.result))
             for r in args.ranks.split(",")]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode or 0 for p in procs))


# -- the driver -------------------------------------------------------------------------------
def _shape(hosts: Any, delay_ms: float | None, rate: str | None) -> dict[str, Any]:
    from pyc10d.testing.hosts import ShapingUnsupported

    shaping: dict[str, Any] = {"delay_ms": None, "rate": None, "note": ""}
    if delay_ms:
        try:
            hosts.shape(delay_ms=delay_ms)
            shaping["delay_ms"] = delay_ms
            return shaping
        except ShapingUnsupported as e:
            shaping["note"] = f"no delay: {e}"
            print(f"multihost: {e}; limiting the rate instead", file=sys.stderr)
    if rate:
        hosts.shape(rate=rate)
        shaping["rate"] = rate
    return shaping


def run_hosts(hosts: Any, backend: str, world: int, per_host: int, sizes: list[int], scale: float, port: int,
         tmp: Path) -> dict[str, Any]:
    """One run of ``backend``: a host worker per host, forked from this process into the host
    (torch is imported here already: a fresh interpreter per host and run cost ~2.5 s of CPU
    each), which forks the host's ranks."""
    result = tmp / f"{backend}.json"
    procs, logs = [], []
    for h in hosts.hosts:
        ranks = ",".join(str(h.index * per_host + i) for i in range(per_host))
        args = ["--host-worker", "--backend", backend, "--ranks", ranks, "--world", str(world),
                "--master", f"{hosts[0].addr}:{port}", "--sizes", ",".join(map(str, sizes)),
                "--scale", str(scale), "--result", str(result)]
        logs.append(tmp / f"{backend}-{port}-{h.name}.log")
        procs.append(h.spawn_script("pyc10d.bench.multihost", args,
                                    str(logs[-1]), module=True))
    for p in procs:
        p.wait(timeout=600)
    if any(p.returncode for p in procs) or not result.exists():
        tails = "".join(f"\n--- {log.name}\n{log.read_text(errors='replace')[-2000:]}" for log in logs if log.exists())
        raise RuntimeError(f"multihost bench: {backend} run failed (exit codes {[p.returncode for p in procs]})"
                           + tails)
    return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m pyc10d.bench.multihost", description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--sizes", default="8,1M,16M", help="comma-separated message sizes (8, 64K, 1M ...)")
    ap.add_argument("--delay-ms", type=float, default=1.0, help="one-way delay on each host's uplink (netem)")
    ap.add_argument("--rate", default="1gbit", help="tbf rate per uplink when netem is missing ('' for none)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the number of timed calls")
    ap.add_argument("--rounds", type=int, default=2, help="runs per backend, interleaved; the faster is kept")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--host-worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("backend", "ranks", "master", "result"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.host_worker:
        return _host_main(args)

    from pyc10d.testing.hosts import Hosts

    sizes = [parse_size(s) if not s.isdigit() else int(s) for s in args.sizes.split(",")]
    world = args.hosts * args.ranks_per_host
    runs: dict[str, list[dict[str, Any]]] = {"auto": [], "tcp": [], "gloo": []}
    with Hosts(args.hosts) as hosts, tempfile.TemporaryDirectory() as tmp:
        shaping = _shape(hosts, args.delay_ms, args.rate or None)
        port = PORT
        for _ in range(args.rounds):
            for backend in runs:
                port += 1
                runs[backend].append(run_hosts(hosts, backend, world, args.ranks_per_host, sizes, args.scale, port,
                                          Path(tmp)))
    best = {b: [min((r["rows"][i] for r in rs), key=lambda row: row["seconds"]) for i in range(len(sizes))]
            for b, rs in runs.items()}
    record = {
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "hosts": args.hosts, "ranks_per_host": args.ranks_per_host, "shaping": shaping,
        "chosen": {b: rs[0]["backend"] for b, rs in runs.items()},
        "runs": runs, "best": best,
    }
    path = write_result(args.out, "multihost", record)
    link = shaping["delay_ms"] and f"{shaping['delay_ms']} ms delay" or shaping["rate"] or "unshaped"
    print(f"all_reduce, {args.hosts} hosts x {args.ranks_per_host} ranks, links: {link}; "
          f"auto chose {record['chosen']['auto']}")
    print(f"{'size':>8}  {'hier us':>10}  {'tcp us':>10}  {'gloo us':>10}  {'tcp / hier':>10}  {'gloo / hier':>11}")
    for h, t, g in zip(best["auto"], best["tcp"], best["gloo"]):
        print(f"{format_size(h['bytes']):>8}  {h['seconds'] * 1e6:>10.0f}  {t['seconds'] * 1e6:>10.0f}  "
              f"{g['seconds'] * 1e6:>10.0f}  {t['seconds'] / h['seconds']:>9.2f}x  {g['seconds'] / h['seconds']:>10.2f}x")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
