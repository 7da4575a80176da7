"""Every ``PYC10D_*`` environment variable, declared once: name, kind, default, what it does.

The code reads a variable through its declaration (``settings.SHM_SLOT_BYTES.get()``), never
``os.environ`` itself, so that each is parsed one way: a byte count takes binary units
(``256K``, ``1M``), a yes/no takes ``1/0``, ``true/false``, ``yes/no``, ``on/off``, and a value
of the wrong form raises a ``ValueError`` naming the variable and what it wants (``env.py``).
A variable is read when asked, not at import: a test or a user may set it between groups.

docs/backends.md's table of environment variables is ``markdown()`` (``python -m
pyc10d.settings`` prints it; ``tests/test_settings.py`` holds the two equal). Variables that
only tests, the torch-suite driver or the benchmarks read are declared here too: one table.

The bottom of the package beside ``env``: it imports nothing else of pyc10d.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from .env import env_bytes, env_float, env_int

Kind = Literal["bytes", "int", "float", "flag", "text"]
_UNSET: Any = object()
_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One variable. ``default`` is the value when unset (None where the code decides from the
    host: ``default_doc`` says how); ``aliases`` are read, in order, when ``name`` is unset;
    ``joins`` puts it on the docs row of the named setting."""

    name: str
    kind: Kind
    default: Any
    section: str
    default_doc: str
    doc: str
    unit: str = ""
    aliases: tuple[str, ...] = ()
    joins: str = ""

    def raw(self) -> str | None:
        """The text set for it (``name``, else the first alias set), or None."""
        for var in (self.name, *self.aliases):
            value = os.environ.get(var, "").strip()
            if value:
                return value
        return None

    def is_set(self) -> bool:
        return self.raw() is not None

    def get(self, default: Any = _UNSET) -> Any:
        """The value now; ``default`` replaces the declared one (a default the caller
        decides, e.g. from how many ranks share the host)."""
        default = self.default if default is _UNSET else default
        if self.kind == "bytes":
            return env_bytes(self.name, default)
        if self.kind == "int":
            return env_int(self.name, default)
        if self.kind == "float":
            return env_float(self.name, default, self.unit)
        raw = self.raw()
        if raw is None:
            return default
        if self.kind == "flag":
            if raw.lower() in _YES:
                return True
            if raw.lower() in _NO:
                return False
            raise ValueError(f"{self.name}={raw!r}: expected 1 or 0 (true/false, yes/no, on/off)")
        return raw


_ALL: list[Setting] = []


def _declare(*args: Any, **kwargs: Any) -> Setting:
    setting = Setting(*args, **kwargs)
    _ALL.append(setting)
    return setting


_SHM = "**shared memory**"
_TCP = "**tcp**"
_ANY = "**every backend**"
_STORE = "**store**"
_FAIL = "**failures** ([failures.md](failures.md))"
_FUNCOL = "**functional collectives** ([api.md](api.md#functional-collectives-and-devicemesh))"
_LAUNCH = "**launchers** ([launchers.md](launchers.md))"
_TEST = "**testing** ([testing.md](testing.md))"
_BENCH = "**benchmarks** ([performance.md](performance.md))"

SHM_SLOT_BYTES = _declare(
    "PYC10D_SHM_SLOT_BYTES", "bytes", 1 << 20, _SHM, "1 MiB",
    "one rank's arena slot, the chunk size of large shm collectives (rounded to 4 KiB, at least 64 KiB)")
SHM_ARENA_BUDGET = _declare(
    "PYC10D_SHM_ARENA_BUDGET", "bytes", 256 << 20, _SHM, "256 MiB",
    "caps a group's arena: a slot is at most budget / (2 x ranks + 2)")
BIND = _declare(
    "PYC10D_BIND", "text", "auto", _SHM, "`auto`",
    "`auto`: when a host's ranks connect through shared memory, each gets its own share of the CPUs "
    "(every thread of the process; the job's ranks on other hosts of the same kernel, namespace hosts "
    "or containers of one machine, counted with the host's; never with more ranks than CPUs or than a "
    "cgroup quota allows; a "
    "rank already confined, or a process running several ranks, is left alone), which removed a 2-3x "
    "slow mode of large collectives ([placement.md](placement.md#two-speeds-decided-at-start-up)); "
    "with other pyc10d jobs on the host, each job gets CPUs of its own and its ranks share them (none "
    "pinned with more jobs than CPUs); a placed rank gives its placement up once processes outside "
    "pyc10d's jobs use half a CPU's worth of the host's time for a second "
    "([placement.md](placement.md#a-shared-host)); "
    "`none`: the kernel places them")
SHM_SPIN_US = _declare(
    "PYC10D_SHM_SPIN_US", "float", None, _SHM, "50 (200 when yielding)",
    "how long a waiting rank spins before it sleeps on a futex", unit="microseconds")
SHM_YIELD = _declare(
    "PYC10D_SHM_YIELD", "flag", None, _SHM,
    "yield when the host has fewer usable CPUs than the group has ranks",
    "`1` / `0`: yield the CPU between looks while spinning, or not")
SHM_CALLER_SPIN_US = _declare(
    "PYC10D_SHM_CALLER_SPIN_US", "float", 1000.0, _SHM, "1000",
    "how long a caller blocked in a synchronous lean-lane call spins (yielding after the first 50 µs) "
    "before it sleeps", unit="microseconds")
SYMM_CHUNK_BYTES = _declare(
    "PYC10D_SYMM_CHUNK_BYTES", "bytes", 4 << 20, _SHM, "4 MiB",
    "chunk of the all_reduce of symmetric-memory tensors ([api.md](api.md#symmetric-memory))")

SEGMENT_BYTES = _declare(
    "PYC10D_SEGMENT_BYTES", "bytes", 1 << 20, _TCP, "1 MiB",
    "segment size of the ring algorithms (must be equal on every rank)")
TCP_SPIN_US = _declare(
    "PYC10D_TCP_SPIN_US", "float", None, _TCP,
    "1000 with a CPU per rank on the host, else 200 (yielding the CPU between looks)",
    "how long a caller blocked in a synchronous tcp call looks at its sockets before it sleeps in `poll`",
    unit="microseconds")
TCP_SOCKBUF = _declare(
    "PYC10D_TCP_SOCKBUF", "bytes", None, _TCP,
    "kernel autotuning; 256 KiB between ranks of a host running more ranks than CPUs",
    "socket buffer bytes for every connection, or `0` for autotuning everywhere")
SOCKET_ADDR = _declare(
    "PYC10D_SOCKET_ADDR", "text", None, _TCP, "unset",
    "the address a rank advertises to its peers ([launchers.md](launchers.md#which-network-interface))")
SOCKET_IFNAME = _declare(
    "PYC10D_SOCKET_IFNAME", "text", None, _TCP, "unset",
    "the interface whose address a rank advertises, NCCL's syntax (`eth0`, `^docker0,lo`, `=eth0`); a "
    "list of several (`eth0,eth1`) stripes messages of 1 MiB and more over one connection per interface "
    "([launchers.md](launchers.md#several-network-interfaces-striping))", aliases=("GLOO_SOCKET_IFNAME",))
MAX_MESSAGE_BYTES = _declare(
    "PYC10D_MAX_MESSAGE_BYTES", "bytes", 64 << 30, _TCP, "64 GiB",
    "largest message a peer may announce; a larger one drops that peer")

GC_FREEZE = _declare(
    "PYC10D_GC_FREEZE", "flag", True, _ANY, "1",
    "at a process's first group, `gc.freeze()` the objects alive then (torch's modules, the model): full "
    "collections over them stalled 3-4 calls of a rank's first second of collectives 80-100 ms each "
    "([where-the-time-goes.md](where-the-time-goes.md#a-ranks-first-second-the-collector)); `0` leaves the collector alone")
EXIT_TIMEOUT = _declare(
    "PYC10D_EXIT_TIMEOUT", "float", 10.0, _ANY, "10",
    "seconds the interpreter's exit waits, in all, for the groups still alive to shut down and for "
    "pyc10d's threads that run collectives' work to end (a daemon thread inside torch at finalization "
    "aborts the process: [failures.md](failures.md#at-exit)); a thread still running then is named in a "
    "warning", unit="seconds")

STORE_MAX_BYTES = _declare(
    "PYC10D_STORE_MAX_BYTES", "bytes", 1 << 30, _STORE, "1 GiB",
    "largest part of a store frame; the server closes a connection that sends more")
AUTH_TOKEN = _declare(
    "PYC10D_AUTH_TOKEN", "text", None, _STORE, "unset (no authentication)",
    "shared secret: every store and peer connection starts with a mutual HMAC-SHA256 challenge "
    "([launchers.md](launchers.md#security-authentication-and-hardening))")
TLS_CERT = _declare(
    "PYC10D_TLS_CERT", "text", None, _STORE, "unset (clear text)",
    "all three set (the same files on every rank): every store and peer connection is mutual TLS 1.3, "
    "a peer not signed by the CA refused; only some set is an error "
    "([launchers.md](launchers.md#encryption-tls))")
TLS_KEY = _declare("PYC10D_TLS_KEY", "text", None, _STORE, "", "", joins="PYC10D_TLS_CERT")
TLS_CA = _declare("PYC10D_TLS_CA", "text", None, _STORE, "", "", joins="PYC10D_TLS_CERT")
PEER_TIMEOUT_S = _declare(
    "PYC10D_PEER_TIMEOUT_S", "float", 15.0, _STORE, "15",
    "a peer silent this long (link down, packets dropped, process frozen) is named within T + T/4: "
    "keepalive and `TCP_USER_TIMEOUT` on every store and tcp socket, and a heartbeat on idle "
    "connections; `0` turns it off ([failures.md](failures.md#silent-peers-partitions-and-frozen-ranks))",
    unit="seconds (0 turns detection off)")

DESYNC_CHECK = _declare(
    "PYC10D_DESYNC_CHECK", "flag", True, _FAIL, "1", "`0` turns the desync fingerprints off")
P2P_MISMATCH_S = _declare(
    "PYC10D_P2P_MISMATCH_S", "float", 2.0, _FAIL, "2",
    "seconds a receive waits while its sender's messages sit on other tags before reporting the tag "
    "mismatch; `0` turns it off", unit="seconds")
STUCK_WARN_S = _declare(
    "PYC10D_STUCK_WARN_S", "float", 10.0, _FAIL, "10",
    "seconds a collective waits before every waiting rank logs which ranks have not entered it",
    unit="seconds")
FLIGHT_RECORDER_ENTRIES = _declare(
    "PYC10D_FLIGHT_RECORDER_ENTRIES", "int", 2000, _FAIL, "2000",
    "operations each group remembers; `0` turns the flight recorder off")
TRACE_DIR = _declare(
    "PYC10D_TRACE_DIR", "text", None, _FAIL, "`<tmp>/pyc10d-traces`",
    "where ranks write their flight-recorder dumps when an operation fails")

FUNCOL_INLINE_BYTES = _declare(
    "PYC10D_FUNCOL_INLINE_BYTES", "bytes", None, _FUNCOL,
    "16 KiB; every size inline when `LOCAL_WORLD_SIZE` exceeds half the usable CPUs",
    "larger collectives start on the group's progress thread and return an `AsyncCollectiveTensor`")
FUNCOL_CACHE_BYTES = _declare(
    "PYC10D_FUNCOL_CACHE_BYTES", "bytes", 256 << 20, _FUNCOL, "256 MiB",
    "bytes of recycled output storages kept for functional collectives")

SERVE_GLOO = _declare(
    "PYC10D_SERVE_GLOO", "text", None, _LAUNCH, "unset (torch's Gloo is Gloo)",
    "`1` (or `shm`, `tcp`): every group torch builds for the name `gloo` is a pyc10d group (`1`: its "
    "`auto` engine), for frameworks that hard-code the name (accelerate); applied by torch's backend "
    "autoload at `import torch`, so with `TORCH_DEVICE_BACKEND_AUTOLOAD=0` it cannot act and "
    "`import pyc10d.torch_backend` warns (call `pyc10d.torch_backend.serve_gloo()` there) "
    "([coming-from-torch.md](coming-from-torch.md#frameworks-that-hard-code-gloo))")

TEST_TIMEOUT = _declare(
    "PYC10D_TEST_TIMEOUT", "float", None, _TEST, "30 s (threaded), 60 s (processes)",
    "limit of a `pyc10d.testing` multi-rank test", unit="seconds")
TESTING_DIST = _declare(
    "PYC10D_TESTING_DIST", "text", "pyc10d", _TEST, "`pyc10d`",
    "the module `pyc10d.testing`'s helpers drive (e.g. `torch.distributed`)")
FUZZ_FRAMES = _declare(
    "PYC10D_FUZZ_FRAMES", "int", 3000, _TEST, "3,000; a tenth of the frames (at least 200)",
    "frames thrown at the store server and the tcp transport by the fuzz tests (`make fuzz`: 100,000)")
FUZZ_HANDSHAKES = _declare("PYC10D_FUZZ_HANDSHAKES", "int", None, _TEST, "", "", joins="PYC10D_FUZZ_FRAMES")
PROPERTY_EXAMPLES = _declare(
    "PYC10D_PROPERTY_EXAMPLES", "int", 60, _TEST, "60",
    "random collective calls per property test (`make fuzz`: 3,000)")
ALL_WORLDS = _declare(
    "PYC10D_ALL_WORLDS", "flag", False, _TEST, "unset",
    "`1`: the logarithmic algorithms' tests run every world size 1-33 (default: a spread of 14 of them)")
WORLDS_TIMEOUT = _declare(
    "PYC10D_WORLDS_TIMEOUT", "float", 60.0, _TEST, "60 (`make test-worlds`: 1,800)",
    "per-test limit, in seconds, of the conformance runs above 4 ranks (a launch of 33 processes on 2 "
    "cores takes minutes)", unit="seconds")
REQUIRE_SLURM = _declare(
    "PYC10D_REQUIRE_SLURM", "flag", False, _TEST, "unset (`make test-slurm`: 1)",
    "`1`: the Slurm tests (`tests/testing/test_slurm.py`) fail where Slurm or namespace hosts cannot be had, "
    "instead of skipping")
EXIT_TRIALS = _declare(
    "PYC10D_EXIT_TRIALS", "int", 1, _TEST, "1, `fork` (`make exit-trials`: 50, and `exec` too)",
    "runs of each program that ends right after its last collective (`tests/test_threads.py`), and how "
    "its launched ranks start")
EXIT_START = _declare("PYC10D_EXIT_START", "text", "fork", _TEST, "", "", joins="PYC10D_EXIT_TRIALS")
SUITE_START = _declare(
    "PYC10D_SUITE_START", "text", "spawn", _TEST, "`spawn` (`make torch-suite`: `fork`)",
    "how torch's suite starts its ranks (`fork` / `spawn`); its gloo-name pass sets `PYC10D_SERVE_GLOO`")

SABOTAGE = _declare(
    "PYC10D_SABOTAGE", "text", None, _BENCH, "unset",
    "the benchmarks' self-test: make the nth call of a function do nothing, then run a benchmark "
    "module, to show its result check fails (`pyc10d/bench/sabotage.py`)")
SABOTAGE_RUN = _declare("PYC10D_SABOTAGE_RUN", "text", None, _BENCH, "", "", joins="PYC10D_SABOTAGE")
OVERHEAD_AA = _declare(
    "PYC10D_OVERHEAD_AA", "flag", False, _BENCH, "unset",
    "`bench.overhead`'s calibration: both groups without the failure features (an A/A run)")

ALL: tuple[Setting, ...] = tuple(_ALL)
BY_NAME: dict[str, Setting] = {s.name: s for s in ALL}

#: Rows of variables pyc10d reads but does not own (launchers', torch's): (section, names,
#: default, what it does), placed in the table after the named section's own rows.
FOREIGN_ROWS: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    (_LAUNCH, ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
     "set by the launcher",
     "`env://` rendezvous (and Slurm's, Open MPI's and MPICH's own variables); `LOCAL_WORLD_SIZE` also "
     "feeds the socket-buffer and functional-collective policies above"),
    (_LAUNCH, ("OMP_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"),
     "set by `pyc10d.run` when unset: 1, 32 MiB, 256 MiB",
     "torch threads per rank; glibc keeps freed tensors of a few MiB instead of returning them to the kernel"),
    (_LAUNCH, ("TORCH_DEVICE_BACKEND_AUTOLOAD",), "1 (torch's)",
     "`0`: `import torch` does not register pyc10d's names; `import pyc10d.torch_backend` does"),
)
_SECTIONS = (_SHM, _TCP, _ANY, _STORE, _FAIL, _FUNCOL, _LAUNCH, _TEST, _BENCH)


def markdown() -> str:
    """docs/backends.md's table: a header row per section, one row per setting (those that
    join another share its row)."""
    lines = ["| variable | default | what it does |", "| --- | --- | --- |"]
    for section in _SECTIONS:
        lines.append(f"| {section} | | |")
        for s in ALL:
            if s.section != section or s.joins:
                continue
            names = [s.name, *s.aliases, *(j.name for j in ALL if j.joins == s.name)]
            lines.append(f"| {', '.join(f'`{n}`' for n in names)} | {s.default_doc} | {s.doc} |")
        for sec, names, default, doc in FOREIGN_ROWS:
            if sec == section:
                lines.append(f"| {', '.join(f'`{n}`' for n in names)} | {default} | {doc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
