"""A small ``torchrun``-style launcher.

Usage::

    python -m pyc10d.run [--nproc-per-node N] [--nnodes 1] [--node-rank 0]
                         [--master-addr 127.0.0.1] [--master-port 29500]
                         [--rdzv-endpoint host:port] [--start-method exec|fork]
                         [--bind-to none|core] (script.py | -m module) [args ...]

It starts ``N`` copies of the script (or module) as child processes of this one, each with
the environment that ``init_method="env://"`` reads: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``NODE_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``. The global rank is ``node_rank * nproc_per_node + local_rank``.
``--rdzv-endpoint host:port`` (torchrun's spelling of the same thing, for its static
rendezvous) is another way to give the master address and port; every node passes the
same one, the address of node 0, where rank 0 serves the store.

Failure handling: as soon as one rank exits non-zero the launcher prints
``pyc10d.run: rank R exited with code C`` (with the signal's name when a signal ended it),
sends ``SIGTERM`` to the ranks still running, ``SIGKILL`` to those still alive a few
seconds later, and exits with that rank's code (``128 + signal`` for a signal). ``SIGINT``
and ``SIGTERM`` sent to the launcher are forwarded to the ranks the same way. On Linux each
child also asks the kernel to ``SIGKILL`` it should the launcher itself die, so nothing is
left orphaned even when the launcher is killed with ``SIGKILL``. On ``SIGINT`` (Ctrl-C) the
launcher first prints where every rank of the default group was, as ``python -m pyc10d.status``
does (best effort: 2 s at most, nothing if the store is already gone).

``--bind-to core`` pins local rank ``i`` to the ``i``-th CPU this launcher may run on, as
Open MPI's ``mpirun`` does by default for two ranks (torchrun does not: ``none`` is the
default here too). With more ranks than CPUs nothing is pinned (a note says so), as mpirun
leaves oversubscribed ranks unbound. (On this project's 2-CPU VM, 16 MiB shm all_reduces at
n=2 ran ~5 ms each and then ~13 ms for dozens of calls in a row, unpinned, in a diagnostic;
pinned, the medians of three runs agreed more closely, but three benchmark runs with the
ranks pinned spread as widely as without: docs/performance.md.)

Like ``torchrun``, ``OMP_NUM_THREADS`` is set to 1 in the ranks when more than one rank
runs on this node and the variable is not already set.

Unless set, ``MALLOC_MMAP_THRESHOLD_`` (32 MiB) and ``MALLOC_TRIM_THRESHOLD_`` (256 MiB) are
set too: with glibc's defaults a freed tensor of a few MiB goes back to the kernel, and
the next one of that size page-faults every page afresh (a new 1 MiB tensor: 0.8-1.9 ms
here instead of 12 us). Functional collectives allocate a fresh output per call, so they
pay that on every call; with these settings freed blocks are reused.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from .run_fork import ForkedRank

#: A running rank: a fresh interpreter, or one forked from the launcher.
Rank = Union["subprocess.Popen[bytes]", "ForkedRank"]

PREFIX = "pyc10d.run"
POLL_S = 0.05


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the launcher's command line; the script's own arguments are left untouched."""
    p = argparse.ArgumentParser(
        prog="python -m pyc10d.run",
        description="Launch one process per rank with the env:// rendezvous variables set.",
        allow_abbrev=False,
    )
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
                   default="1", help="ranks on this node: an integer, or 'auto'/'cpu' "
                   "for one per CPU core (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0,
                   help="this node's index in [0, nnodes) (default 0)")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr",
                   help="address of rank 0's store (default 127.0.0.1)")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int,
                   help="port of rank 0's store (default 29500)")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint",
                   help="host[:port] of rank 0's store, as torchrun takes it; instead of "
                   "--master-addr/--master-port")
    p.add_argument("--term-timeout", "--term_timeout", dest="term_timeout", type=float,
                   default=5.0, help="seconds between SIGTERM and SIGKILL when stopping "
                   "ranks (default 5)")
    p.add_argument("--start-method", "--start_method", dest="start_method", choices=("exec", "fork"),
                   default="exec", help="exec: each rank is a fresh interpreter (default); fork: "
                   "ranks are forked from this launcher, which has imported torch and pyc10d "
                   "already (starts in milliseconds; see pyc10d.run_fork for what differs)")
    p.add_argument("--bind-to", "--bind_to", dest="bind_to", choices=("none", "core"), default="none",
                   help="core: pin local rank i to the i-th CPU of this launcher's affinity set, as "
                   "mpirun does (not with more ranks than CPUs); none (default): the kernel places them")
    p.add_argument("-m", "--module", action="store_true",
                   help="run the target as a module, like 'python -m'")
    p.add_argument("script", help="the script (or, with -m, the module) to run")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    args = p.parse_args(argv)
    if args.nproc_per_node in ("auto", "cpu"):
        args.nproc_per_node = os.cpu_count() or 1
    else:
        try:
            args.nproc_per_node = int(args.nproc_per_node)
        except ValueError:
            p.error(f"--nproc-per-node must be an integer, 'auto' or 'cpu', "
                    f"not {args.nproc_per_node!r}")
    if args.nproc_per_node < 1:
        p.error("--nproc-per-node must be at least 1")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        p.error("need nnodes >= 1 and 0 <= node-rank < nnodes")
    if args.rdzv_endpoint is not None:
        if args.master_addr is not None or args.master_port is not None:
            p.error("give either --rdzv-endpoint or --master-addr/--master-port, not both")
        try:
            args.master_addr, args.master_port = split_endpoint(args.rdzv_endpoint)
        except ValueError as e:
            p.error(str(e))
    if args.master_addr is None:
        args.master_addr = "127.0.0.1"
    if args.master_port is None:
        args.master_port = 29500
    return args


def split_endpoint(endpoint: str, default_port: int = 29500) -> tuple[str, int]:
    """``"host:port"`` (``"[v6]:port"``, or a bare host for ``default_port``) -> (host, port)."""
    text = endpoint.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad --rdzv-endpoint {endpoint!r}: use host:port or [v6addr]:port")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"bad --rdzv-endpoint {endpoint!r}: no host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad --rdzv-endpoint {endpoint!r}: port {port_text!r} is not 1-65535")
    return host, int(port_text)


def rank_env(args: argparse.Namespace, local_rank: int) -> dict[str, str]:
    """The environment of one child: ours plus the rendezvous variables."""
    nproc = args.nproc_per_node
    env = dict(os.environ)
    env.update(
        RANK=str(args.node_rank * nproc + local_rank),
        WORLD_SIZE=str(args.nnodes * nproc),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK=str(args.node_rank),
        NODE_RANK=str(args.node_rank),
        MASTER_ADDR=args.master_addr,
        MASTER_PORT=str(args.master_port),
    )
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(256 << 20))
    return env


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when we die (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    return hook


def describe(code: int) -> str:
    """``'code 3'`` or ``'code -9 (SIGKILL)'`` for a ``Popen.returncode``."""
    if code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"code {code} (signal {-code})"
    return f"code {code}"


def stop_all(procs: Sequence[Rank], sig: int, grace: float) -> None:
    """Send ``sig`` to every live child, then SIGKILL those alive after ``grace`` s; reap all."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def start_rank(args: argparse.Namespace, local_rank: int, preexec: Callable[[], None] | None) -> Rank:
    """One rank, as a fresh interpreter or (``--start-method fork``) forked from this process."""
    if args.start_method == "fork":
        from .run_fork import start

        return start([args.script, *args.script_args], args.module, rank_env(args, local_rank), preexec)
    target = ["-m", args.script] if args.module else [args.script]
    cmd = [sys.executable, "-u", *target, *args.script_args]
    return subprocess.Popen(cmd, env=rank_env(args, local_rank), preexec_fn=preexec)


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    raise _Interrupted(signum)


def _pinned(preexec: Callable[[], None] | None, cpu: int) -> Callable[[], None]:
    """``preexec`` (if any), then pin the calling process to ``cpu``."""

    def hook() -> None:
        if preexec is not None:
            preexec()
        os.sched_setaffinity(0, {cpu})

    return hook


def rank_cpus(args: argparse.Namespace) -> list[int] | None:
    """The CPU of each local rank under ``--bind-to core``; None: unpinned."""
    if args.bind_to != "core":
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if args.nproc_per_node > len(cpus):
        print(f"{PREFIX}: --bind-to core: {args.nproc_per_node} ranks, {len(cpus)} CPUs: ranks left unpinned",
              file=sys.stderr, flush=True)
        return None
    return cpus[:args.nproc_per_node]


def launch(args: argparse.Namespace) -> int:
    """Start the ranks, watch them, and return the launcher's exit code."""
    preexec = _die_with_parent()
    cpus = rank_cpus(args)
    if args.start_method == "fork":
        from .run_fork import preload

        preload()
    procs: list[Rank] = []
    old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for local_rank in range(args.nproc_per_node):
            procs.append(start_rank(args, local_rank, preexec if cpus is None else _pinned(preexec, cpus[local_rank])))
        base = args.node_rank * args.nproc_per_node
        by_pid = {p.pid: (base + i, p) for i, p in enumerate(procs)}
        while any(p.returncode is None for p in procs):
            # Blocking wait for any child: children are seen in the order they exit, so the
            # rank reported is the first to fail, not one that died of its peer's failure.
            pid, status = os.waitpid(-1, 0)
            if pid not in by_pid:
                continue
            rank, p = by_pid[pid]
            p.returncode = code = os.waitstatus_to_exitcode(status)
            if code != 0:
                print(f"{PREFIX}: rank {rank} exited with {describe(code)}", file=sys.stderr,
                      flush=True)
                stop_all(procs, signal.SIGTERM, args.term_timeout)
                return code if code > 0 else 128 - code
        return 0
    except _Interrupted as e:
        name = signal.Signals(e.signum).name
        if e.signum == signal.SIGINT:  # Ctrl-C: where every rank was (``pyc10d.status``)
            from .hostport import format_hostport
            from .status import snapshot

            print(snapshot(format_hostport(args.master_addr, args.master_port)), file=sys.stderr, flush=True)
        print(f"{PREFIX}: got {name}, stopping {len(procs)} rank(s)", file=sys.stderr,
              flush=True)
        # Ignore repeats while we clean up; the children get the same signal from us.
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        stop_all(procs, e.signum, args.term_timeout)
        return 128 + e.signum
    except BaseException:
        stop_all(procs, signal.SIGTERM, args.term_timeout)
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pyc10d.run``."""
    return launch(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
