"""Python calls per collective on the calling thread: a path guard that sees multi-rank calls.

Instruction counts (``bench.instructions``) need valgrind and a world of one rank, where every
collective is a copy; what a user's n=2 all_reduce of 64 KiB costs depends on which path it
takes (the lean lane or the general path, the arena or symmetric memory). The number of
Python calls that pyc10d's own code makes on the calling thread for one call tells the paths
apart, costs a fraction of a second to count, and does not move with the load: the one thing
that does — how often a wait loop turns before a peer's bytes arrive — is left out (a call
into a function whose name says it waits or spins counts once, and nothing under it counts).

``count_calls(fn)`` counts one call of ``fn``. ``grid(dist)``, run on every rank of an n=2
group, counts each case of ``CASES`` (all_reduce of 8 B, 64 KiB and 1 MiB, send/recv of 8 B)
after ``WARM`` calls of it, each of ``REPEAT`` counts checked (the result equal to what the
peers sent), and keeps the least. ``benchmarks/calls-reference.json`` holds the counts of
the code as committed, per backend (``shm``, ``tcp`` through pyc10d's API, ``pyc10d_shm``
through torch.distributed) and rank; ``tests/bench/test_bench_calls.py`` holds every case
within ``TOLERANCE`` calls of it. A change that moves a path rewrites the reference in a
commit that says why (``python -m pyc10d.bench.calls --write-reference``).
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import pyc10d

REFERENCE = Path("benchmarks") / "calls-reference.json"
#: Calls a case may move either way before the guard fails: a call more or less in a helper is
#: noise for this purpose; a path switched (lane or general path) moves dozens.
TOLERANCE = 3
WARM, REPEAT = 6, 4
#: (name, collective, bytes): what the guard counts
CASES = [("all_reduce.8B", "all_reduce", 8), ("all_reduce.64KiB", "all_reduce", 64 << 10),
         ("all_reduce.1MiB", "all_reduce", 1 << 20), ("send_recv.8B", "send_recv", 8)]
BACKENDS = {"shm": "pyc10d", "tcp": "pyc10d", "pyc10d_shm": "torch.distributed"}

_ROOT = str(Path(pyc10d.__file__).resolve().parent)
#: A function whose name says it waits: its loop's turns depend on when the peer comes.
_WAITS = re.compile(r"wait|spin|sleep|poll")


def count_calls(fn: Callable[[], Any]) -> tuple[int, Any]:
    """(calls into pyc10d's code made on this thread while ``fn()`` runs, waits counted once
    each, what ``fn`` returned). The garbage collector is paused meanwhile."""
    n = 0
    inside: Any = None  # the frame of the wait being skipped

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal n, inside
        if event == "call":
            if inside is not None:
                return
            code = frame.f_code
            if code.co_filename.startswith(_ROOT):
                n += 1
                if _WAITS.search(code.co_name):
                    inside = frame
        elif event == "return" and frame is inside:
            inside = None

    previous, collecting = sys.getprofile(), gc.isenabled()
    gc.disable()  # a collection's finalizers (pyc10d's among them) are not the call's cost
    sys.setprofile(profile)
    try:
        out = fn()
    finally:
        sys.setprofile(previous)
        if collecting:
            gc.enable()
    return n, out


def make_case(dist: Any, rank: int, size: int, op: str, nbytes: int) -> Callable[[int], Callable[[], bool]]:
    """``make(i)``: a call of case ``i`` from poisoned outputs, returning whether it was right."""
    numel = nbytes // 4
    if op == "all_reduce":
        def make(i: int) -> Callable[[], bool]:
            t = torch.full((numel,), float(rank + 1 + i))
            want = float(sum(r + 1 + i for r in range(size)))
            return lambda: (dist.all_reduce(t), bool(torch.all(t == want)))[1]
        return make

    def make_p2p(i: int) -> Callable[[], bool]:
        if rank == 0:
            t = torch.full((numel,), float(i + 7))
            return lambda: (dist.send(t, 1), True)[1]
        t = torch.full((numel,), -1.0)  # poisoned: a recv that moved nothing fails the check
        return lambda: (dist.recv(t, 0), bool(torch.all(t == float(i + 7))))[1]
    return make_p2p


def grid(dist: Any) -> dict[str, int]:
    """On every rank of the default group (n=2): each case's least count over ``REPEAT``
    checked calls, after ``WARM`` calls. Raises naming the case when a call was wrong."""
    rank, size = dist.get_rank(), dist.get_world_size()
    counts = {}
    for name, op, nbytes in CASES:
        make = make_case(dist, rank, size, op, nbytes)
        for i in range(WARM):
            if not make(i)():
                raise AssertionError(f"{name}: warm-up call {i} on rank {rank} gave a wrong result")
        counts[name] = least(dist, make, name, WARM)
    return counts


def least(dist: Any, make: Callable[[int], Callable[[], bool]], name: str, first: int) -> int:
    """The least count of ``REPEAT`` checked calls ``make(first)``, ``make(first + 1)``, ...:
    a rare extra call (a peer's late byte met outside a wait) is not the path's cost."""
    best = None
    for i in range(first, first + REPEAT):
        call = make(i)
        dist.barrier()  # every rank starts the counted call from the same point
        n, ok = count_calls(call)
        if not ok:
            raise AssertionError(f"{name}: counted call {i} on rank {dist.get_rank()} gave a wrong result")
        best = n if best is None else min(best, n)
    assert best is not None
    return best


def compare(reference: dict[str, Any], got: dict[str, dict[str, Any]], tolerance: int = TOLERANCE) -> list[str]:
    """Every case of ``got`` (backend -> rank -> case -> count) off the reference by more than
    ``tolerance`` calls, named."""
    problems = []
    for backend, ranks in got.items():
        for rank, cases in ranks.items():
            for case, n in cases.items():
                ref = reference.get(backend, {}).get(str(rank), {}).get(case)
                if ref is None:
                    problems.append(f"{backend} rank {rank} {case}: no reference (now {n} calls)")
                elif abs(n - ref) > tolerance:
                    problems.append(f"{backend} rank {rank} {case}: {n} Python calls, reference {ref} "
                                    f"(more than {tolerance} apart: the call takes another path)")
    return problems


def _rank_main(backend: str, port: int, rank: int, out: str) -> None:
    import importlib

    dist = importlib.import_module(BACKENDS[backend])
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    counts = grid(dist)
    dist.destroy_process_group()
    Path(out).write_text(json.dumps(counts))


def measure(backends: list[str], timeout: float = 60.0) -> dict[str, dict[str, dict[str, int]]]:
    """Each backend's grid, two fresh rank processes each."""
    import os
    import subprocess
    import tempfile

    from pyc10d.bench.launch import free_port

    got: dict[str, dict[str, dict[str, int]]] = {}
    with tempfile.TemporaryDirectory(prefix="pyc10d-calls-") as tmp:
        for backend in backends:
            port = free_port()
            outs = [os.path.join(tmp, f"{backend}-{r}.json") for r in range(2)]
            procs = [subprocess.Popen([sys.executable, "-c",
                                       f"from pyc10d.bench.calls import _rank_main; "
                                       f"_rank_main({backend!r}, {port}, {r}, {outs[r]!r})"])
                     for r in range(2)]
            for p in procs:
                if p.wait(timeout) != 0:
                    raise RuntimeError(f"calls grid on {backend}: a rank exited {p.returncode}")
            got[backend] = {str(r): json.loads(Path(outs[r]).read_text()) for r in range(2)}
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--write-reference", action="store_true", help=f"rewrite {REFERENCE}")
    args = ap.parse_args(argv)
    got = measure(args.backends.split(","))
    for backend, ranks in got.items():
        for rank, cases in ranks.items():
            print(f"{backend:<11} rank {rank}: " + "  ".join(f"{c} {n}" for c, n in cases.items()))
    if args.write_reference:
        REFERENCE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {REFERENCE}")
        return 0
    problems = compare(json.loads(REFERENCE.read_text()), got) if REFERENCE.exists() else ["no reference"]
    for p in problems:
        print("problem:", p)
    return 1 if problems else 0


__all__ = ["CASES", "TOLERANCE", "compare", "count_calls", "grid", "least", "make_case", "measure"]

if __name__ == "__main__":
    sys.exit(main())
