"""``python -m pyc10d.bench.instructions``: per-call instruction counts under callgrind.

The checks (every call served) run without valgrind, in this process. The guard itself runs one
process under valgrind (skipped where valgrind is not installed): the current code must stay
within 5% of ``benchmarks/instructions-reference.json`` on every path, and the same run, with
extra work after each call worth 10% of the path's reference, must fail on every path.
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from pyc10d.bench import instructions

REFERENCE = Path(__file__).resolve().parents[2] / instructions.REFERENCE
#: Calls per segment in the guard (the reference is counted with 500). At 40 calls two counts
#: of functional.all_reduce in one process differed by 5.3% (its plant read 1.153x the clean
#: count and failed the size check below in a make test run), and one count at 40 read 112.3k
#: against 114.0k at 200 (the same layout, deterministic); at 200 every path's plant read
#: 1.094-1.101. Why short segments drift is not found: dumped after every single call, 250
#: calls of it cost 129.6-130.1k each (the first 133k), no outlier. The cost is mostly torch's
#: import under valgrind (27 s): the guard took 65 s CPU at 40 calls, 74 s at 200.
GUARD_CALLS = 200


@pytest.fixture
def store_port() -> Any:
    from pyc10d.bench.store import _server

    server = _server("pyc10d")
    yield server.port
    del server


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["threaded.all_reduce", "tcp.barrier", "pyc10d_tcp.broadcast",
                                  "fake.all_reduce", "functional.all_reduce", "tcpstore.set_get"])
def test_a_call_that_does_nothing_fails_the_check(path: str, store_port: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Call 30 of the path (of 20 warm-up and 3 x 10 counted) does nothing: its check fails,
    one call short; the same path unpatched passes."""
    import torch.distributed as tdist

    import pyc10d
    import pyc10d.functional._eager as eager
    from pyc10d.bench.sabotage import saboteur
    from pyc10d.store import TCPStore

    def run() -> dict[str, Any]:
        return instructions.run_paths([path], 10, store_port=store_port, warm=20)[path]

    clean = run()
    assert clean["ok"] and (clean["calls"], clean["served"]) == (50, 50), clean
    prefix, op = path.split(".")
    if prefix == "functional":  # the eager kernel hands back a copy of the input, no collective
        real, n = eager.all_reduce, [0]

        def idle(t: Any, *args: Any) -> Any:
            n[0] += 1
            return t.clone() if n[0] == 30 else real(t, *args)

        monkeypatch.setattr(eager, "all_reduce", idle)
    elif prefix == "tcpstore":
        monkeypatch.setattr(TCPStore, "set", saboteur(TCPStore.set, 30, "drop", only_timed=False))
    else:
        owner = tdist if prefix.startswith("pyc10d_") else pyc10d
        monkeypatch.setattr(owner, op, saboteur(getattr(owner, op), 30, "drop", only_timed=False))
    check = run()
    assert not check["ok"] and (check["calls"], check["served"]) == (50, 49), check


def test_failed_checks_and_growth_are_named() -> None:
    result = {"checks": [{"a.x": {"calls": 5, "served": 5, "ok": True}},
                         {"a.x": {"calls": 5, "served": 4, "ok": False}}]}
    assert instructions.failed_checks(result) == ["a.x (layout 1): 4 of 5 calls served"]
    table, grew = instructions.compare({"a.x": 104.0, "b.y": 106.0, "c.z": 50.0},
                                       {"a.x": 100.0, "b.y": 100.0}, 0.05)
    assert grew == ["b.y"]
    assert "GREW" in table and "new" in table.splitlines()[-1]


def test_paths_select_by_name_or_prefix() -> None:
    assert instructions._select("tcp,fake.all_reduce") == ["tcp.all_reduce", "tcp.broadcast", "tcp.barrier",
                                                           "fake.all_reduce"]
    with pytest.raises(SystemExit):
        instructions._select("nope")


def test_the_reference_covers_every_path() -> None:
    ref = json.loads(REFERENCE.read_text())
    assert set(ref["paths"]) == set(instructions.PATHS)
    assert all(v > 1000 for v in ref["paths"].values())


#: The guard in make test: each layer once, all over the shm engine -- the engine's three ops
#: (pyc10d's API), the plugin's all_reduce, the functional all_reduce and the store. Under
#: valgrind a guard's cost is mostly what each backend runs for the first time (its setup and
#: first calls translated): 18 paths of 8 setups took 79-84 CPU-s, these 6 of 3 ~45, one path
#: alone 39 (torch's import). Every path: ``make test-instructions`` (run by .ci/run after make
#: test) and make bench-instructions.
SHORT_PATHS = ("shm.all_reduce", "shm.broadcast", "shm.barrier", "pyc10d_shm.all_reduce",
               "functional.all_reduce", "tcpstore.set_get")


def test_the_short_guard_names_real_paths() -> None:
    assert set(SHORT_PATHS) < set(instructions.PATHS)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="callgrind's client requests are written for x86-64")
@pytest.mark.timeout(400)
@pytest.mark.parametrize("paths", [pytest.param(SHORT_PATHS, id="short"),
                                   pytest.param(instructions.PATHS, id="every", marks=pytest.mark.full)])
def test_the_guard_passes_now_and_fails_a_planted_10_percent_slowdown(paths: tuple[str, ...]) -> None:
    """One valgrind process counts each path twice: as it is (within 5% of the reference) and
    with extra Python work after each call worth 10% of its reference count (over 5% above the
    path as it is, on every path: the guard's comparison names them all)."""
    ref = json.loads(REFERENCE.read_text())["paths"]
    t0 = time.monotonic()
    result = instructions.count(paths, GUARD_CALLS, layouts=1, plant_fraction=0.10, reference=ref)
    assert instructions.failed_checks(result) == []
    table, grew = instructions.compare(result["paths"], ref, instructions.TOLERANCE)
    assert grew == [], f"grew more than 5% over {REFERENCE}:\n{table}"
    # The plant is judged against this run's own counts, as a reference counted from this code
    # would judge it: one heap layout (the guard counts one) once put functional.all_reduce 5%
    # under the reference (least of 3 layouts at 500 calls), and its plant, 10% of the
    # reference, then read only 4.8% over the reference (a fresh-clone run at ecd52e9).
    table, grew = instructions.compare(result["planted"], result["paths"], instructions.TOLERANCE)
    assert grew == list(paths), f"a planted 10% slowdown passed:\n{table}"
    for name in paths:  # the plant is what it says: +10% of the reference
        assert 1.07 < result["planted"][name] / result["paths"][name] < 1.13, (name, result)
    print(f"guard: {time.monotonic() - t0:.0f} s wall, {result['cpu_s']} s CPU under valgrind\n{table}")
