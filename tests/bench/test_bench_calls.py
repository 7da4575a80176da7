"""``pyc10d.bench.calls``: the Python calls an n=2 call makes on the calling thread, held to
``benchmarks/calls-reference.json``.

Each backend's grid (all_reduce 8 B, 64 KiB, 1 MiB; send/recv 8 B) runs on two forked ranks
and must stay within ``calls.TOLERANCE`` of the reference. Importing every module of pyc10d
must not change a 64 KiB or 1 MiB all_reduce's count; and with the switch that once sent every
shm all_reduce of 64 KiB and up to the general path put back, the guard fails.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _multirank import run_ranks

from pyc10d.bench import calls

pytestmark = pytest.mark.timeout(50)

REFERENCE = Path(__file__).resolve().parents[2] / calls.REFERENCE


def _grid(rank: int, ws: int, module: str, switched: bool) -> dict[str, int]:
    dist = importlib.import_module(module)
    if switched:  # the module global of old: every all_reduce of 64 KiB and up declined by the lane
        from pyc10d.backends.shm import SYMMETRIC_MIN_BYTES, ShmBackend

        ShmBackend._lane_check_bytes = SYMMETRIC_MIN_BYTES
        ShmBackend._lane_declines = lambda self, t: True
    return calls.grid(dist)


def _reference() -> dict:
    return json.loads(REFERENCE.read_text())


@pytest.mark.parametrize("backend", list(calls.BACKENDS))
def test_calls_per_call_match_the_reference(backend: str) -> None:
    module = calls.BACKENDS[backend]
    got = run_ranks(backend, 2, _grid, module, False, dist_module=module, timeout=40)
    problems = calls.compare(_reference(), {backend: {str(r): c for r, c in enumerate(got)}})
    assert problems == [], problems


def test_the_old_switch_put_back_fails_the_guard() -> None:
    got = run_ranks("shm", 2, _grid, "pyc10d", True, timeout=40)
    problems = calls.compare(_reference(), {"shm": {str(r): c for r, c in enumerate(got)}})
    moved = sorted({p.split(":")[0].split(" ", 3)[3] for p in problems})
    assert moved == ["all_reduce.1MiB", "all_reduce.64KiB"], problems


_IMPORTS_RANK = """
import importlib, json, pkgutil, sys
import pyc10d as dist
from pyc10d.bench import calls
rank = int(sys.argv[1])
dist.init_process_group("shm", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank, world_size=2)

def counts():
    out = {}
    for name, op, nbytes in calls.CASES[1:3]:  # 64 KiB and 1 MiB
        make = calls.make_case(dist, rank, 2, op, nbytes)
        assert make(0)() and make(1)()  # (warm)
        out[name] = calls.least(dist, make, name, 2)
    return out

before = counts()
imported = []
for m in pkgutil.walk_packages(dist.__path__, "pyc10d."):
    if m.name.split(".")[1] in ("bench", "testing", "sim") or m.name.endswith("__main__"):
        continue  # the product's modules, not its harnesses (a suite's reads its variables)
    if m.name not in sys.modules:
        try:
            importlib.import_module(m.name)
        except ModuleNotFoundError as e:  # an optional dependency (ray, mpi4py) not installed
            if (e.name or "").startswith("pyc10d"):
                raise
            continue
        imported.append(m.name)
print(json.dumps({"before": before, "after": counts(), "imported": imported}))
dist.destroy_process_group()
"""


@pytest.mark.timeout(55)
def test_importing_every_module_changes_no_call() -> None:
    """Two fresh processes (``import pyc10d`` alone, as a program starts): a 64 KiB and a
    1 MiB all_reduce count the same calls (within ``calls.TOLERANCE``) before and after
    importing every module of pyc10d
    (outside its benchmarks, test harnesses and simulator)."""
    import subprocess

    from pyc10d.bench.launch import free_port

    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", _IMPORTS_RANK, str(r), port], stdout=subprocess.PIPE,
                              text=True) for r in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=45)
        assert p.returncode == 0, out
        got = json.loads(out.strip().splitlines()[-1])
        assert len(got["imported"]) > 5, got
        # The same path: within the guard's tolerance (a path switched moves dozens of calls;
        # under load a call now and then meets its peer's bytes one look later)
        assert all(abs(got["after"][k] - got["before"][k]) <= calls.TOLERANCE for k in got["before"]), got
