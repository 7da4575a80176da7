"""One namespace host's share of a multi-host test: forks its ranks, each writes a report.

Run (inside a ``pyc10d.testing.hosts`` host) as
``python tests/_multihost_worker.py CASE OUT_DIR MASTER WORLD_SIZE RANKS BACKEND [FAMILIES]``
with ``RANKS`` the comma-separated ranks on this host. Every rank initialises over
``tcp://MASTER`` (rank 0 serves the store; ``[v6addr]:port`` for IPv6), or, for a MASTER of
``env://HOST:PORT``, over ``env://`` with ``MASTER_ADDR=HOST`` (an IPv6 literal without its
brackets, as launchers set it), runs ``CASE`` and writes ``OUT_DIR/rank<r>.json``:
``{"backend": ..., "ok": bool, "error": str, "count": int}``. This process exits when its
ranks have.

Cases: ``families`` runs the named conformance families (each with its patches), counting the
checks; ``loop`` all-reduces until it fails, touching ``OUT_DIR/ready<r>`` after a few
rounds so the test knows when to kill a host; ``freeze`` is ``loop`` in which the last rank
stops itself with SIGSTOP a few rounds after ready (touching ``OUT_DIR/frozen`` first), as a
hung host or a debugger would; ``stream`` (two ranks) has rank 0 send ``STREAM_MESSAGES`` messages
of ``STREAM_BYTES`` to rank 1, which checks each, and both report the seconds it took
(``"seconds"``, after one warm-up message). A ``BACKEND`` of ``torch:<name>`` runs the case through
``torch.distributed`` on that backend (e.g. the plugin's ``pyc10d_tcp``) instead of pyc10d
(the families too: their checks call torch's API then).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _multirank import patched
from test_conformance import FAMILIES

import pyc10d as dist


class _TorchAPI:
    """``torch.distributed`` as the families call it: pyc10d's ``_make_premul_sum`` is
    torch's ``_make_nccl_premul_sum``."""

    def __getattr__(self, name: str) -> Any:
        import torch.distributed as td

        return td._make_nccl_premul_sum if name == "_make_premul_sum" else getattr(td, name)


def _families(rank: int, ws: int, names: list[str]) -> int:
    count = 0
    for name in names:
        fn, patches = FAMILIES[name]
        start = time.monotonic()
        with patched(patches):
            count += fn(rank, ws)
        print(f"rank {rank}: {name} took {time.monotonic() - start:.1f}s", flush=True)
    return count


def _loop(rank: int, ws: int, out: str, api: Any = dist, freeze: bool = False) -> int:
    t = torch.ones(1024)
    for i in range(100000):
        t.fill_(1.0)
        api.all_reduce(t)
        if t[0].item() != ws:
            raise AssertionError(f"round {i}: all_reduce gave {t[0].item()}, wanted {ws}")
        if i == 3:
            open(os.path.join(out, f"ready{rank}"), "w").close()
        if freeze and i == 20 and rank == ws - 1:
            open(os.path.join(out, "frozen"), "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(0.005)  # pace the loop: the machine is shared
    return 0


STREAM_BYTES, STREAM_MESSAGES = 16 << 20, 4


def _stream(rank: int) -> float:
    n = STREAM_BYTES // 4
    buf = torch.empty(n)
    for i in range(STREAM_MESSAGES + 1):  # message 0 warms up (connections, links)
        if i == 1:
            dist.barrier()
            start = time.monotonic()
        if rank == 0:
            dist.send(torch.arange(n, dtype=torch.float32) + i, 1)
        else:
            dist.recv(buf, 0)
            if not torch.equal(buf, torch.arange(n, dtype=torch.float32) + i):
                raise AssertionError(f"stream message {i} arrived damaged")
    dist.barrier()
    return time.monotonic() - start


def _rank(case: str, out: str, master: str, ws: int, rank: int, backend: str, families: list[str]) -> None:
    gc.freeze()  # no full GC pass over the parent's heap: see MultiProcessTestCase._run_rank
    torch.set_num_threads(1)
    report: dict = {"rank": rank, "ok": False, "error": "", "count": 0, "backend": ""}
    api: Any = dist
    if backend.startswith("torch:"):
        import torch.distributed as api

        backend = backend[len("torch:"):]
    try:
        init = f"tcp://{master}"
        if master.startswith("env://"):
            from pyc10d.hostport import split_hostport

            host, port = split_hostport(master[len("env://"):])
            os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ws))
            init = "env://"
        api.init_process_group(backend, init_method=init, rank=rank, world_size=ws,
                               timeout=timedelta(seconds=30))
        if api is not dist and case == "families":
            import test_conformance

            test_conformance.dist = _TorchAPI()
        report["backend"] = api.get_backend()
        report["affinity"] = sorted(os.sched_getaffinity(0))  # placement, before the watch may undo it
        if case == "families":
            report["count"] = _families(rank, ws, families)
        elif case == "stream":
            report["seconds"] = _stream(rank)
            report["count"] = STREAM_MESSAGES
        else:
            _loop(rank, ws, out, api, freeze=case == "freeze")
        api.destroy_process_group()
        report["ok"] = True
    except BaseException as e:  # noqa: BLE001 - reported to the test
        report["error"] = f"{type(e).__name__}: {e}"
        report["traceback"] = traceback.format_exc()
    with open(os.path.join(out, f"rank{rank}.json.tmp"), "w") as f:
        json.dump(report, f)
    os.replace(os.path.join(out, f"rank{rank}.json.tmp"), os.path.join(out, f"rank{rank}.json"))
    sys.stdout.flush()
    os._exit(0)  # a failed group may leave threads behind; the report is written


def main(argv: list[str]) -> None:
    case, out, master, ws, ranks, backend = argv[:6]
    families = argv[6].split(",") if len(argv) > 6 else []
    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=_rank, args=(case, out, master, int(ws), int(r), backend, families))
             for r in ranks.split(",")]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


if __name__ == "__main__":
    main(sys.argv[1:])
