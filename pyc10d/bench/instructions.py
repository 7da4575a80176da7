"""Instructions per call under valgrind's callgrind: a speed guard that load cannot fool.

Wall-clock figures on a shared 2-core VM move 2-3x from one day to the next, so a 20%
slowdown of the per-call path hides in the noise of ``bench.percall``. The number of
instructions a call executes does not depend on the load, the clock or the neighbours (SQLite
guards its speed the same way), so it can be compared with a committed reference, and a
growth of a few percent is a real change of the code (or of torch, Python or valgrind).

``python -m pyc10d.bench.instructions [--calls N] [--paths a,b] [--check REF.json]`` runs one
process tree under ``valgrind --tool=callgrind`` that counts, for every path of ``PATHS``, the
instructions of its calls, one at a time, as a program makes them:

* ``shm/tcp/threaded.<op>``: ``pyc10d.all_reduce`` of 8 B, ``broadcast(src=0)`` and
  ``barrier`` at world size 1 (native API, ``HashStore``);
* ``pyc10d_shm/pyc10d_tcp.<op>``: the same three through torch's API on the plugin;
* ``fake.all_reduce``: rank 0 of 8 on the fake backend (``FakeStore``);
* ``functional.all_reduce``: ``pyc10d.functional.all_reduce`` + ``wait_tensor`` at world
  size 1 on ``shm``;
* ``tcpstore.set_get``: a ``set`` then a ``get`` of one key by a ``pyc10d.store.TCPStore``
  client, over loopback, to a server in this (uninstrumented) driver process: the client's
  instructions, not the server's.

How the start-up is left out: the counted process starts with instrumentation off (importing
torch under callgrind costs minutes of CPU; uninstrumented, about 35 s) and drives callgrind
with its client requests (the ``CALLGRIND_*`` macros of ``callgrind.h``, issued here by 29
bytes of x86-64 code in an executable page, so nothing is compiled). Each path is set up and
warmed (``WARM`` calls: more than the flight recorder's 2,048 slots, so every counted call
overwrites one, as in a long job) with instrumentation off; then, with the garbage collector
paused, a segment of N calls and one of 2N calls are counted, each dumped on its own, and
instructions per call = (count(2N) - count(N)) / N, so what a segment costs once (the toggles,
the loop's set-up) cancels. Only the calling thread is counted (``--separate-threads=yes``,
collection toggled in that thread), and the watchdog's thread is kept asleep during the run
(``_counted_process``): other threads' work is not a call's cost, and their wake-ups, timed by
the wall clock, would be noise. ``PYTHONHASHSEED=0``. torch is imported once, then every path
is counted in ``--layouts`` (3) forked children, each with its heap laid out differently under
pyc10d (``_BOOT`` says why), and within each, every backend's paths in a grandchild forked
from it after pyc10d's import (``_counted_process`` says why); a path's figure is its least
count, the same whether the run counts it alone (``--paths``) or with all the others. A figure includes the loop's
own turn and the call of the path's lambda (a few hundred instructions).

Every call is checked, warm-up and counted alike: a collective path's group sequence number
must have moved by exactly the calls made (at world size 1 the result is the input, so no
value can tell a call that did its work from one that did nothing); a store pair's ``get`` must
return what its ``set`` wrote, each set writing a value no other call wrote. A failed check
fails the run.

Writes ``<out>/instructions-<time>.json`` (per path instructions per call, N, the valgrind,
torch and Python versions). ``--check REF`` prints path, reference, now, ratio and exits 1
naming every path that grew more than ``--tolerance`` (5%) over the reference;
``--write-reference REF`` rewrites the reference (a reviewed commit that says why).
``--plant-slowdown F`` (for the guard's own test) also counts every path with extra Python
work after each call worth F of that path's reference count, and checks those counts instead.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import json
import mmap
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyc10d.bench.percall import OPS
from pyc10d.bench.report import write_result

DEFAULT_CALLS = 500
#: Heap layouts counted per run (see ``_BOOT``); each path's figure is the least of them.
LAYOUTS = 3
#: Uncounted calls before a path's segments: more than the flight recorder's ring (2,048 slots
#: by default), so that every counted call replaces an entry as in a long-running job.
WARM = 2100
TOLERANCE = 0.05
REFERENCE = Path("benchmarks/instructions-reference.json")
NATIVE = ("shm", "tcp", "threaded")
PLUGIN = ("pyc10d_shm", "pyc10d_tcp")
FUNCTIONAL_BACKEND = "shm"
FAKE_WORLD = 8
PATHS: tuple[str, ...] = (
    *(f"{b}.{op}" for b in NATIVE + PLUGIN for op in OPS),
    "fake.all_reduce", "functional.all_reduce", "tcpstore.set_get",
)

# -- callgrind's client requests --------------------------------------------------------------
#: ``uint64 request(uint64 *args, uint64 default)``: valgrind's "special instruction" (four
#: rotations of rdi that add up to 128 bits, then ``xchg rbx, rbx``) with rax -> args and the
#: answer in rdx; natively it does nothing and returns ``default``.
_REQUEST_CODE = bytes.fromhex(
    "4889f8"  # mov rax, rdi
    "4889f2"  # mov rdx, rsi
    "48c1c703" "48c1c70d" "48c1c73d" "48c1c733"  # rol rdi, 3 / 13 / 61 / 51
    "4887db"  # xchg rbx, rbx
    "4889d0"  # mov rax, rdx
    "c3"  # ret
)
_RUNNING_ON_VALGRIND = 0x1001
_CT = 0x43540000  # VG_USERREQ_TOOL_BASE('C', 'T'), then callgrind's requests in order
_DUMP_STATS_AT, _START_INSTRUMENTATION, _STOP_INSTRUMENTATION = _CT + 3, _CT + 4, _CT + 5
_TOGGLE_COLLECT = _CT + 2


class Callgrind:
    """Callgrind's client requests from Python (x86-64 only); no-ops outside valgrind."""

    def __init__(self) -> None:
        if platform.machine() not in ("x86_64", "AMD64"):
            raise RuntimeError(f"callgrind client requests are written for x86-64, not {platform.machine()}")
        self._page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        self._page.write(_REQUEST_CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        proto = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64)
        self._fn = proto(address)
        self.on_valgrind = self._request(_RUNNING_ON_VALGRIND) > 0

    def _request(self, code: int, arg: int = 0) -> int:
        args = (ctypes.c_uint64 * 6)(code, arg, 0, 0, 0, 0)
        return int(self._fn(args, 0))

    def instrument(self, on: bool) -> None:
        self._request(_START_INSTRUMENTATION if on else _STOP_INSTRUMENTATION)

    def toggle_collect(self) -> None:
        self._request(_TOGGLE_COLLECT)

    def dump(self, label: str) -> None:
        text = ctypes.create_string_buffer(label.encode())
        self._request(_DUMP_STATS_AT, ctypes.addressof(text))


# -- the paths (run in the counted process) ---------------------------------------------------
@dataclass
class _Setup:
    """One group's (or store's) calls, by op, and its own tally of the calls it served."""

    calls: dict[str, Callable[[], Any]]
    served: Callable[[], int]
    close: Callable[[], None]


def _collectives(api: str, backend: str) -> _Setup:
    """``all_reduce`` (8 B), ``broadcast(src=0)`` and ``barrier`` at world size 1: pyc10d's API
    (``api == "pyc10d"``) or torch's on the plugin (``"torch"``). The tally is the group's
    sequence number (on the plugin, its engine's: torch's pybind method of that name answers
    for a Python group that it has none). ``bench.percall._measure`` builds the same calls but
    times them in its own loop and reads that method, so only its ``OPS`` are shared."""
    import torch

    if api == "torch":
        import torch.distributed as dist
    else:
        import pyc10d as dist  # type: ignore[no-redef]
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD
    seq = group.engine._get_sequence_number_for_group if api == "torch" else group._get_sequence_number_for_group
    x = torch.tensor([1.0, 2.0])
    calls = {"all_reduce": lambda: dist.all_reduce(x), "broadcast": lambda: dist.broadcast(x, 0),
             "barrier": lambda: dist.barrier()}
    return _Setup(calls, seq, dist.destroy_process_group)


def _fake() -> _Setup:
    import torch

    import pyc10d as dist
    from pyc10d.testing import FakeStore

    dist.init_process_group(backend="fake", store=FakeStore(), rank=0, world_size=FAKE_WORLD)
    x = torch.tensor([1.0, 2.0])
    return _Setup({"all_reduce": lambda: dist.all_reduce(x)},
                  dist.group.WORLD._get_sequence_number_for_group, dist.destroy_process_group)


def _functional() -> _Setup:
    import torch

    import pyc10d as dist
    import pyc10d.functional as ft_c

    dist.init_process_group(backend=FUNCTIONAL_BACKEND, store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD
    x = torch.tensor([1.0, 2.0])
    return _Setup({"all_reduce": lambda: ft_c.wait_tensor(ft_c.all_reduce(x, "sum", group))},
                  group._get_sequence_number_for_group, dist.destroy_process_group)


def _tcpstore(port: int) -> _Setup:
    """Call j sets the key to ``bench.store._value(j)`` (no other call's value) and reads it
    back; the tally is the reads that returned what their call wrote."""
    from pyc10d.bench.store import _client, _value

    client = _client("pyc10d", "127.0.0.1", port)
    state = {"j": 0, "good": 0}

    def set_get() -> None:
        j = state["j"] = state["j"] + 1
        value = _value(j)
        client.set("instructions/key", value)
        if client.get("instructions/key") == value:
            state["good"] += 1

    return _Setup({"set_get": set_get}, lambda: state["good"], lambda: None)


def _setups(store_port: int) -> dict[str, Callable[[], _Setup]]:
    """Prefix of the path names -> how to set its calls up."""
    setups: dict[str, Callable[[], _Setup]] = {}
    for b in NATIVE:
        setups[b] = lambda b=b: _collectives("pyc10d", b)
    for b in PLUGIN:
        setups[b] = lambda b=b: _collectives("torch", b)
    setups.update(fake=_fake, functional=_functional, tcpstore=lambda: _tcpstore(store_port))
    return setups


def _loop(call: Callable[[], Any], n: int) -> None:
    for _ in range(n):
        call()


def _burn(n: int) -> None:
    """The planted slowdown: ``n`` turns of an empty Python loop (over ``repeat``: no int is
    made, so every turn costs the same)."""
    for _ in itertools.repeat(None, n):
        pass


def _nothing() -> None:
    pass


def _slowed(call: Callable[[], Any], turns: int) -> Callable[[], None]:
    def slowed() -> None:
        call()
        _burn(turns)

    return slowed


@contextmanager
def _no_gc() -> Iterator[None]:
    """The collector paused while counting: when a collection falls depends on everything
    allocated before, so it would land in one segment and not the other."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _count(cg: Callgrind, label: str, call: Callable[[], Any], n: int) -> None:
    """A segment of ``n`` calls, counted and dumped as ``label``."""
    cg.toggle_collect()
    _loop(call, n)
    cg.toggle_collect()
    cg.dump(label)


def _segments(cg: Callgrind, name: str, call: Callable[[], Any], n: int) -> None:
    with _no_gc():
        cg.instrument(True)
        _count(cg, f"{name} {n}", call, n)
        _count(cg, f"{name} {2 * n}", call, 2 * n)
        cg.instrument(False)


def run_paths(names: Sequence[str], calls: int, *, store_port: int = 0,
              plant: dict[str, int] | None = None, warm: int = WARM,
              cg: Callgrind | None = None, tag: str = "") -> dict[str, dict[str, Any]]:
    """Set up, warm and count every path of ``names`` (in ``PATHS`` order); each path's check:
    ``{"calls": made, "served": the path's own tally, "ok": served == made}``. With ``plant``
    (path -> turns of ``_burn`` after each call) every path is also counted slowed, as
    ``<name> planted``. Dump labels start with ``tag``. Outside valgrind the counting does
    nothing and the checks still run."""
    cg = cg or Callgrind()
    setups = _setups(store_port)
    checks: dict[str, dict[str, Any]] = {}
    for prefix, make in setups.items():
        mine = [n for n in names if n.split(".", 1)[0] == prefix]
        if not mine:
            continue
        setup = make()
        try:
            for name in mine:
                call = setup.calls[name.split(".", 1)[1]]
                served0, made, t0 = setup.served(), warm + 3 * calls, time.monotonic()
                _loop(call, warm)
                _segments(cg, f"{tag}{name}", call, calls)
                if plant is not None:
                    slowed = _slowed(call, plant[name])
                    _loop(slowed, warm // 10)
                    _segments(cg, f"{tag}{name} planted", slowed, calls)
                    made += warm // 10 + 3 * calls
                served = setup.served() - served0
                checks[name] = {"calls": made, "served": served, "ok": served == made,
                                "wall_s": round(time.monotonic() - t0, 2)}
        finally:
            setup.close()
    return checks


# -- the driver (outside valgrind) --------------------------------------------------------------
def valgrind_version() -> str | None:
    exe = shutil.which("valgrind")
    if exe is None:
        return None
    return subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip() or None


def _dumps(folder: Path) -> dict[str, int]:
    """Label -> instructions of the main thread's dumps (``cg.out.<pid>.<part>-01``)."""
    counts = {}
    for path in folder.glob("cg.out.*-01"):
        text = path.read_text(errors="replace")
        label = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
        total = re.search(r"^totals: (\d+)", text, re.M)  # (a summary line can wrap below 0)
        if label and total:
            counts[label.group(1)] = int(total.group(1))
    return counts


def _per_call(counts: dict[str, int], label: str, n: int) -> float:
    return round((counts[f"{label} {2 * n}"] - counts[f"{label} {n}"]) / n, 1)


#: The process valgrind runs: torch imported once, then one forked child per heap layout.
#: Each child first allocates ballast (layout 0: none), so pyc10d's modules, names and objects,
#: imported and made after it, sit at other addresses: CPython's method cache is indexed by a
#: type's version tag and the *address* of the attribute's name, so which lookups of a call
#: collide (and miss) depends on where things landed. torch's own import does not allocate
#: the same from run to run, so a single process lands on one layout or another (measured up
#: to 2.2% apart on a path); the least count over a few layouts is repeatable.
_BOOT = """\
import ctypes, os, sys, traceback
import torch
folder, layouts = sys.argv[1], int(sys.argv[2])
for layout in range(layouts):
    pid = os.fork()
    if pid == 0:
        code = 1
        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: no orphan if the parent is killed
        try:
            ballast = [str(i) * (i % 97) for i in range(layout * 3001)]
            from pyc10d.bench.instructions import _counted_process
            code = _counted_process(folder, layout)
        except BaseException:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        sys.exit(1)
"""


def count(names: Sequence[str], calls: int, *, layouts: int = 1, plant_fraction: float = 0.0,
          reference: dict[str, float] | None = None) -> dict[str, Any]:
    """Run the counted process under callgrind: per path the least count over ``layouts``,
    every layout's count, and every layout's checks."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind)")
    if plant_fraction and not reference:
        raise ValueError("--plant-slowdown sizes the extra work from a reference: give --check")
    server = None
    if "tcpstore.set_get" in names:
        from pyc10d.bench.store import _server

        server = _server("pyc10d")
    t0, c0 = time.monotonic(), os.times()
    with tempfile.TemporaryDirectory(prefix="pyc10d-callgrind-") as tmp:
        folder = Path(tmp)
        # (the reference only when planting: whatever the children read shifts their heap)
        spec = {"names": list(names), "calls": calls, "store_port": server.port if server else 0,
                "plant_fraction": plant_fraction, "reference": reference if plant_fraction else {}}
        (folder / "spec.json").write_text(json.dumps(spec))
        cmd = [valgrind, "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
               "--separate-threads=yes", "--dump-line=no", f"--callgrind-out-file={folder}/cg.out.%p",
               f"--log-file={folder}/valgrind.%p.log", sys.executable, "-c", _BOOT, str(folder), str(layouts)]
        env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        done = [folder / f"checks-{i}.json" for i in range(layouts)]
        if proc.returncode != 0 or not all(f.exists() for f in done):
            logs = "".join(f.read_text(errors="replace")[-2000:] for f in folder.glob("valgrind.*.log"))
            raise RuntimeError(f"the counted process failed (exit {proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}\n{logs}")
        runs = [json.loads(f.read_text()) for f in done]
        counts = _dumps(folder)
    del server
    c1 = os.times()
    each = {n: [_per_call(counts, f"L{i} {n}", calls) for i in range(layouts)] for n in names}
    result: dict[str, Any] = {
        "calls": calls, "layouts": layouts, "paths": {n: min(v) for n, v in each.items()},
        "each_layout": each, "checks": [r["checks"] for r in runs], "valgrind": valgrind_version(),
        "torch": runs[0]["torch"], "python": platform.python_version(),
        "wall_s": round(time.monotonic() - t0, 1),
        "cpu_s": round(c1.children_user + c1.children_system - c0.children_user - c0.children_system, 1),
    }
    if plant_fraction:
        result["plant_slowdown"] = plant_fraction
        result["plant_price"] = runs[0]["plant_price"]
        result["planted"] = {n: min(_per_call(counts, f"L{i} {n} planted", calls) for i in range(layouts))
                             for n in names}
    return result


def _counted_process(folder: str | Path, layout: int) -> int:
    """One layout's child under valgrind: every path's calls and checks, each backend's paths
    in a child forked for it from this process, which imported everything and ran nothing.
    Python 3.11 specializes a bytecode for the types it met first and re-specializes after
    misses, so code shared by several paths (the plugin's and the native ones, say) costs a
    path counted after others up to 2% more than alone; forked, a path's count does not
    depend on what else the run counts. The checks go to ``checks-<layout>.json``."""
    import torch

    from pyc10d.backends import watchdog

    folder = Path(folder)
    torch.set_num_threads(1)
    # The watchdog's thread looks every 2 s of wall clock; under valgrind that is a few calls
    # or a few thousand, and its first look after calls were made adds attributes to the
    # engine, so the calling thread's attribute caches are rebuilt in whichever segment it
    # lands in. In this process it looks once an hour: none during a count.
    watchdog.period = lambda: 3600.0
    spec = json.loads((folder / "spec.json").read_text())
    cg = Callgrind()
    if not cg.on_valgrind:
        print("not under valgrind: run python -m pyc10d.bench.instructions", file=sys.stderr)
        return 2
    tag = f"L{layout} "
    plant, price = None, None
    if spec["plant_fraction"]:  # each path's plant: F of its reference, in turns of _burn
        price = _plant_price(cg, folder, tag)
        fixed, turn = price
        plant = {n: max(0, round((spec["plant_fraction"] * spec["reference"][n] - fixed) / turn))
                 for n in spec["names"]}
    checks: dict[str, dict[str, Any]] = {}
    for prefix in dict.fromkeys(n.split(".", 1)[0] for n in spec["names"]):
        mine = [n for n in spec["names"] if n.split(".", 1)[0] == prefix]
        part = folder / f"checks-{layout}-{prefix}.json"
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                part.write_text(json.dumps(run_paths(mine, spec["calls"], store_port=spec["store_port"],
                                                     plant=plant, cg=cg, tag=tag)))
                code = 0
            except BaseException:  # noqa: BLE001 - printed; the exit code says it failed
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
            return 1
        checks.update(json.loads(part.read_text()))
    (folder / f"checks-{layout}.json").write_text(json.dumps({"checks": checks, "torch": torch.__version__,
                                                              "plant_price": price}))
    return 0


def _plant_price(cg: Callgrind, folder: Path, tag: str) -> tuple[float, float]:
    """What ``_slowed`` adds to a call: instructions of the wrapper with no turn, and per turn
    of ``_burn``, read back from this process's own dumps."""
    for label, call in (("bare", _nothing), ("wrapped", _slowed(_nothing, 0)),
                        ("burnt", _slowed(_nothing, 1000))):
        _loop(call, 100)
        _segments(cg, f"{tag}_plant_{label}", call, 50)
    counts = _dumps(folder)
    bare, wrapped, burnt = (_per_call(counts, f"{tag}_plant_{label}", 50) for label in ("bare", "wrapped", "burnt"))
    return wrapped - bare, (burnt - wrapped) / 1000


# -- reference and check ----------------------------------------------------------------------
def compare(now: dict[str, float], reference: dict[str, float], tolerance: float) -> tuple[str, list[str]]:
    """The table (path, reference, now, ratio) and the paths that grew more than ``tolerance``."""
    lines = [f"{'path':<24} {'reference':>12} {'now':>12} {'ratio':>7}"]
    grew = []
    for name, value in now.items():
        ref = reference.get(name)
        if ref is None:
            lines.append(f"{name:<24} {'-':>12} {value:>12,.0f} {'new':>7}")
            continue
        ratio = value / ref
        flag = ""
        if ratio > 1 + tolerance:
            grew.append(name)
            flag = "  GREW"
        lines.append(f"{name:<24} {ref:>12,.0f} {value:>12,.0f} {ratio:>7.3f}{flag}")
    return "\n".join(lines), grew


def _select(spec: str | None) -> list[str]:
    """``--paths``: names of ``PATHS`` or prefixes (``tcp`` = its three ops), in PATHS order."""
    if not spec:
        return list(PATHS)
    wanted = [w.strip() for w in spec.split(",") if w.strip()]
    unknown = [w for w in wanted if not any(p == w or p.split(".", 1)[0] == w for p in PATHS)]
    if unknown:
        raise SystemExit(f"unknown path(s): {', '.join(unknown)}; known: {', '.join(PATHS)}")
    return [p for p in PATHS if p in wanted or p.split(".", 1)[0] in wanted]


def failed_checks(result: dict[str, Any]) -> list[str]:
    """``path: served of made`` for every path of every layout whose calls were not all served."""
    return [f"{n} (layout {i}): {c['served']} of {c['calls']} calls served"
            for i, checks in enumerate(result["checks"]) for n, c in checks.items() if not c["ok"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyc10d.bench.instructions",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=DEFAULT_CALLS, help="N: segments of N and 2N calls per path")
    ap.add_argument("--layouts", type=int, default=LAYOUTS, help="heap layouts (forked children); least count kept")
    ap.add_argument("--paths", help=f"comma-separated names or prefixes (default: all of {', '.join(PATHS)})")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--check", type=Path, metavar="REF.json", help="exit 1 if a path grew over the reference")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    ap.add_argument("--write-reference", type=Path, metavar="REF.json",
                    help="write this run as the reference (commit it with a message that says why)")
    ap.add_argument("--plant-slowdown", type=float, default=0.0, metavar="FRACTION",
                    help="check counts slowed by FRACTION of each path's reference (the guard's own test)")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.layouts < 1:
        ap.error("--calls and --layouts must be at least 1")
    names = _select(args.paths)
    reference = json.loads(args.check.read_text()) if args.check else None
    result = count(names, args.calls, layouts=args.layouts, plant_fraction=args.plant_slowdown,
                   reference=reference["paths"] if reference else None)
    path = write_result(args.out, "instructions", result)
    bad = failed_checks(result)
    print(f"instructions per call under callgrind, N={args.calls}, least of {args.layouts} layout(s) "
          f"({result['valgrind']}, torch {result['torch']}, Python {result['python']}; "
          f"{result['wall_s']} s wall, {result['cpu_s']} s CPU)")
    grew: list[str] = []
    if reference:
        for key in ("valgrind", "torch", "python"):
            if reference.get(key) != result[key]:
                print(f"note: the reference was counted with {key} {reference.get(key)}, this run with "
                      f"{result[key]}; a count may move for that alone")
        now = result["planted"] if args.plant_slowdown else result["paths"]
        if args.plant_slowdown:
            print(f"with a planted slowdown of {args.plant_slowdown:.0%} of each path's reference count")
        table, grew = compare(now, reference["paths"], args.tolerance)
        print(table)
    else:
        for name, value in result["paths"].items():
            spread = max(result["each_layout"][name]) / value - 1
            print(f"{name:<24} {value:>12,.0f}   (layouts up to +{spread:.2%})")
    print(f"wrote {path}")
    if args.write_reference:
        if bad or args.plant_slowdown:
            print("not writing the reference: " + ("a check failed" if bad else "a slowdown was planted"))
        else:
            ref = {k: result[k] for k in ("calls", "layouts", "paths", "valgrind", "torch", "python")}
            args.write_reference.write_text(json.dumps(ref, indent=1) + "\n")
            print(f"wrote the reference {args.write_reference}: commit it with a message that says why")
    for line in bad:
        print("WRONG", line)
    if grew:
        print(f"GREW more than {args.tolerance:.0%} over {args.check}: {', '.join(grew)}")
    return 1 if bad or grew else 0


if __name__ == "__main__":
    sys.exit(main())
