"""Re-forming a group after a rank is SIGKILLed: ``dist._reconfigure`` vs destroy + init.

``python -m pyc10d.bench.reconfigure`` (torch 2.14: its API has ``_reconfigure``; ``make venv
TORCH=2.14.1``) runs, per implementation and trial, the scenario of
``tests/test_reconfigure.py``: three ranks, rank 2 SIGKILLs itself, the two survivors and a
replacement process (a group of one of its own) swap reconfigure handles through a coordinator
``TCPStore`` and re-form three ranks. Timed on each process from the moment it holds every
handle to the end of the re-formed group's first all_reduce (each rank's input is
``rank + 1``: a call that did nothing fails the check), the figure is the slowest process's:

* ``reconfigure_s``: ``_reconfigure(uuid, handles).wait()`` + that all_reduce;
* ``reinit_s``: the same three processes then ``destroy_process_group()`` and
  ``init_process_group`` a fresh three-rank group through the coordinator (what a job without
  reconfigure does), + its first all_reduce.

Implementations: torch's Gloo (2.14's reconfigure; a Gloo group made with
``enable_reconfigure=True`` must be reconfigured before its first collective, so its ranks
form the first group that way too), and pyc10d through the plugin (``pyc10d_shm``,
``pyc10d_tcp``). The median over trials is reported, alternating implementations per trial.
Writes ``<out>/reconfigure-<time>.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

from pyc10d.bench.report import finish

IMPLS = ("gloo", "pyc10d_shm", "pyc10d_tcp")
FORK = multiprocessing.get_context("fork")
TIMEOUT = timedelta(seconds=30)


def _handles(coord: Any, key: str, who: str, mine: str, wanted: list[str]) -> list[str]:
    coord.set(f"{key}/{who}", mine)
    coord.wait([f"{key}/{w}" for w in wanted])
    return [coord.get(f"{key}/{w}").decode() for w in wanted]


def _checked_all_reduce(dist: Any, torch: Any) -> bool:
    n, r = dist.get_world_size(), dist.get_rank()
    t = torch.tensor([r + 1.0])
    dist.all_reduce(t)
    return t.item() == n * (n + 1) / 2


def _process(impl: str, port: int, who: str, out: Any) -> None:
    try:
        import torch
        import torch.distributed as dist

        import pyc10d.torch_backend  # noqa: F401 - the plugin's names

        coord = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
        everyone = ["0", "1", "new"]
        ok = True
        if who == "new":
            coord.wait(["victim-gone"])
            # Gloo's ranks meet under their own group store's prefix, not one a handle names:
            # its replacement must start under the survivors' prefix (pyc10d's meets anywhere).
            prefix = "job/" if impl == "gloo" else "new/"
            dist.init_process_group(impl, store=dist.PrefixStore(prefix, coord), rank=0, world_size=1,
                                    timeout=TIMEOUT, enable_reconfigure=True)
        else:
            dist.init_process_group(impl, store=dist.PrefixStore("job/", coord), rank=int(who), world_size=3,
                                    timeout=TIMEOUT, enable_reconfigure=True)
            if impl == "gloo":  # an enable_reconfigure Gloo group forms at its first reconfigure
                first = _handles(coord, "first", who, dist._get_reconfigure_handle(), ["0", "1", "2"])
                dist._reconfigure(uuid=1, handles=first).wait()
            ok = _checked_all_reduce(dist, torch)
            if who == "2":
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                dist.all_reduce(torch.ones(1))
            except Exception:  # noqa: BLE001 - the peer is dead: expected
                pass
        handles = _handles(coord, "again", who, dist._get_reconfigure_handle(), everyone)
        t0 = time.perf_counter()
        dist._reconfigure(uuid=2, handles=handles).wait()
        ok = _checked_all_reduce(dist, torch) and ok
        reconfigure_s = time.perf_counter() - t0
        coord.set(f"measured/{who}", "1")
        coord.wait([f"measured/{w}" for w in everyone])
        t0 = time.perf_counter()
        dist.destroy_process_group()
        dist.init_process_group(impl, store=dist.PrefixStore("reinit/", coord), rank=everyone.index(who),
                                world_size=3, timeout=TIMEOUT)
        ok = _checked_all_reduce(dist, torch) and ok
        reinit_s = time.perf_counter() - t0
        dist.destroy_process_group()
        out.put((who, {"reconfigure_s": reconfigure_s, "reinit_s": reinit_s, "ok": ok}))
    except BaseException:  # noqa: BLE001 - reported to the driver
        out.put((who, traceback.format_exc()))


def trial(impl: str) -> dict[str, Any] | str:
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    out = FORK.Queue()
    procs = {w: FORK.Process(target=_process, args=(impl, master.port, w, out)) for w in ("0", "1", "2")}
    for p in procs.values():
        p.start()
    procs["2"].join(60)
    master.set("victim-gone", "1")
    procs["new"] = FORK.Process(target=_process, args=(impl, master.port, "new", out))
    procs["new"].start()
    try:
        got = dict(out.get(timeout=90) for _ in range(3))
    finally:
        for p in procs.values():
            p.join(10)
            if p.is_alive():
                p.kill()
    bad = {w: r for w, r in got.items() if not isinstance(r, dict) or not r["ok"]}
    if bad:
        return f"{impl}: {bad}"
    return {k: max(r[k] for r in got.values()) for k in ("reconfigure_s", "reinit_s")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    import torch.distributed as dist

    if not hasattr(dist, "_reconfigure"):
        print("this torch has no dist._reconfigure (torch 2.14 has): make venv TORCH=2.14.1")
        return 2
    impls = args.impls.split(",")
    runs: dict[str, list[dict[str, float]]] = {i: [] for i in impls}
    problems: list[str] = []
    for _ in range(args.trials):
        for impl in impls:
            r = trial(impl)
            if isinstance(r, str):
                problems.append(r)
            else:
                runs[impl].append(r)
    print("| implementation | reconfigure + all_reduce (ms) | destroy + init + all_reduce (ms) | trials |")
    print("|---|---|---|---|")
    medians = {}
    for impl, rs in runs.items():
        if rs:
            medians[impl] = {k: statistics.median(r[k] for r in rs) for k in ("reconfigure_s", "reinit_s")}
            m = medians[impl]
            print(f"| {impl} | {1e3 * m['reconfigure_s']:.1f} | {1e3 * m['reinit_s']:.1f} | {len(rs)} |")
    payload = {"runs": runs, "medians": medians, "problems": problems}
    return finish(args.out, "reconfigure", payload, problems)


if __name__ == "__main__":
    sys.exit(main())
