"""Run one function on ``world_size`` ranks and bring every rank's result or error home.

``run_ranks(backend, world_size, fn, *args)`` is the single entry point the multi-rank test
suites use. By default each rank is a forked process (fast: torch is already imported) that

* sets ``torch.set_num_threads(1)`` (the machine is oversubscribed as it is),
* applies ``patches`` (``{"module.ATTR": value}``, e.g. a tiny ``SEGMENT_BYTES``),
* calls ``dist.init_process_group(backend, store=dist.FileStore(tmp, world_size), ...)``
  (unless ``init=False``), where ``dist`` is ``pyc10d`` or, for reference runs,
  ``torch.distributed`` (``dist_module=``),
* runs ``fn(rank, world_size, *args)``, destroys the process group and pickles the return
  value (or the exception and its traceback) back to the parent.

The parent returns the list of per-rank return values, or fails with an ``AssertionError``
that names each failed rank with its traceback. A run has a hard ``timeout`` (default 30 s):
ranks still running then have their Python stacks dumped (``faulthandler`` on SIGUSR1), are
killed, and the failure names them. After the first rank fails the others get ``grace``
seconds to finish (or fail) before they are killed too.

Backends listed in ``THREAD_BACKENDS`` run their ranks as threads of the test process, each
with its own ``pyc10d`` World (``set_thread_world``); everything else above holds for them too,
except that a stuck thread cannot be killed (it is reported and left behind as a daemon).
A new backend joins the suites by being added to ``BACKENDS`` (and to ``THREAD_BACKENDS`` if
its ranks must share a process).
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch

#: Backends every conformance/failure suite runs against. "shm" and "threaded" join here.
BACKENDS: list[str] = ["tcp", "shm", "threaded"]
#: Backends whose ranks are threads of one process rather than forked processes.
THREAD_BACKENDS: set[str] = {"threaded"}

DEFAULT_TIMEOUT = 30.0
FORK = multiprocessing.get_context("fork")
_MAX_STACK = 4000


class _Exited:
    """Marker result for a rank in ``may_exit`` that exited without reporting."""

    def __init__(self, code: int | None) -> None:
        self.code = code

    def __repr__(self) -> str:
        return f"<exited code={self.code}>"


def failure_after(t0: float, e: BaseException) -> str:
    """``"<seconds since t0> <torch|pyc10d> <type>: <message>"``: how a rank body reports the
    error a call raised, and whether it was torch's type (through the plugin) or pyc10d's."""
    kind = "torch" if isinstance(e, torch.distributed.DistBackendError) else "pyc10d"
    return f"{time.monotonic() - t0:.2f} {kind} {type(e).__name__}: {e}"


def exited(result: Any) -> bool:
    """True if ``result`` (an item of ``run_ranks``'s list) is a rank that exited early."""
    return isinstance(result, _Exited)


@contextmanager
def patched(patches: dict[str, Any] | None) -> Iterator[None]:
    """Set ``{"pkg.module.ATTR": value}`` for the duration of the block."""
    saved = []
    try:
        for target, value in (patches or {}).items():
            mod_name, attr = target.rsplit(".", 1)
            mod = importlib.import_module(mod_name)
            saved.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, value)
        yield
    finally:
        for mod, attr, old in reversed(saved):
            setattr(mod, attr, old)


def _init(dist: Any, backend: str, rank: int, world_size: int, store_path: str,
          pg_timeout: float | None) -> None:
    store = dist.FileStore(store_path, world_size)
    kwargs: dict[str, Any] = {}
    if pg_timeout is not None:
        kwargs["timeout"] = timedelta(seconds=pg_timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, **kwargs)


def _body(rank: int, world_size: int, backend: str, fn: Callable[..., Any], args: tuple,
          store_path: str, init: bool, pg_timeout: float | None, dist_module: str) -> tuple:
    """Run one rank; return ``("ok", value)`` or ``("error", summary, traceback)``."""
    dist = importlib.import_module(dist_module)
    try:
        if init:
            _init(dist, backend, rank, world_size, store_path, pg_timeout)
        value = fn(rank, world_size, *args)
        if init and dist.is_initialized():
            dist.destroy_process_group()
        return ("ok", value)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        return ("error", f"{type(e).__name__}: {e}", traceback.format_exc())


def _child(rank: int, conn: Any, stack_path: str, patches: dict[str, Any] | None, *rest: Any) -> None:
    gc.freeze()  # no full GC pass over the parent's heap: see MultiProcessTestCase._run_rank
    gc.enable()  # (run_ranks forks with the collector off: see there)
    stack_file = open(stack_path, "w")  # lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
    torch.set_num_threads(1)
    try:
        with patched(patches):
            payload = _body(rank, *rest)
        try:
            data = pickle.dumps(payload)
        except Exception as e:  # noqa: BLE001
            data = pickle.dumps(("error", f"rank {rank}: result is not picklable: {e!r}", ""))
        conn.send_bytes(data)
        conn.close()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _report(results: dict[int, tuple], stuck: dict[int, str], world_size: int, backend: str) -> str:
    lines = [f"run_ranks({backend!r}, world_size={world_size}) failed:"]
    for rank in sorted(results):
        res = results[rank]
        if res[0] == "error":
            lines.append(f"--- rank {rank} raised {res[1]}\n{res[2]}")
        elif res[0] == "died":
            lines.append(f"--- rank {rank} exited with code {res[1]} without reporting a result")
    if stuck:
        lines.append(f"--- rank(s) {sorted(stuck)} did not finish in time and were killed")
        for rank, stack in sorted(stuck.items()):
            if stack:
                lines.append(f"--- stack of rank {rank}:\n{stack[-_MAX_STACK:]}")
    return "\n".join(lines)


def run_ranks(
    backend: str,
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT,
    init: bool = True,
    pg_timeout: float | None = None,
    dist_module: str = "pyc10d",
    patches: dict[str, Any] | None = None,
    may_exit: tuple[int, ...] = (),
    grace: float = 5.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on every rank; return the per-rank results.

    ``may_exit``: ranks allowed to end without reporting (e.g. ``os._exit`` on purpose); their
    result is an object for which ``exited(result)`` is true.
    """
    if backend in THREAD_BACKENDS:
        return _run_threads(backend, world_size, fn, args, timeout, init, pg_timeout, dist_module,
                            patches, may_exit, grace)
    tmp = tempfile.mkdtemp(prefix="pyc10d-ranks-")
    store_path = os.path.join(tmp, "store")
    procs, conns = [], {}
    # The parent's garbage is collected here, and the collector is off across the forks: a
    # child that collected the parent's leftover groups (an earlier in-process test's shm
    # arenas) while forking died of SIGSEGV before running a line of its own.
    gc.collect()
    gc.disable()
    try:
        for rank in range(world_size):
            recv_end, send_end = FORK.Pipe(duplex=False)
            stack_path = os.path.join(tmp, f"stack{rank}")
            p = FORK.Process(
                target=_child,
                args=(rank, send_end, stack_path, patches, world_size, backend, fn, args, store_path,
                      init, pg_timeout, dist_module),
                daemon=True,
            )
            p.start()
            send_end.close()
            procs.append(p)
            conns[recv_end] = rank
        gc.enable()
        results: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        while conns:
            now = time.monotonic()
            if now >= deadline:
                break
            for conn in multiprocessing.connection.wait(list(conns), timeout=deadline - now):
                rank = conns.pop(conn)
                try:
                    results[rank] = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    procs[rank].join(timeout=5)
                    code = procs[rank].exitcode
                    results[rank] = ("exited", code) if rank in may_exit else ("died", code)
                conn.close()
                if results[rank][0] in ("error", "died"):
                    deadline = min(deadline, time.monotonic() + grace)
        stuck: dict[int, str] = {}
        for rank in sorted(conns.values()):
            stuck[rank] = _dump_stack(procs[rank], os.path.join(tmp, f"stack{rank}"))
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        failed = stuck or any(r[0] in ("error", "died") for r in results.values())
        if failed:
            raise AssertionError(_report(results, stuck, world_size, backend))
        return [_Exited(results[r][1]) if results[r][0] == "exited" else results[r][1]
                for r in range(world_size)]
    finally:
        gc.enable()
        for conn in conns:
            conn.close()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        shutil.rmtree(tmp, ignore_errors=True)


def _dump_stack(proc: Any, stack_path: str) -> str:
    if not proc.is_alive():
        return ""
    try:
        os.kill(proc.pid, signal.SIGUSR1)
    except OSError:
        return ""
    time.sleep(0.5)
    try:
        with open(stack_path) as f:
            return f.read()
    except OSError:
        return ""


def _run_threads(backend: str, world_size: int, fn: Callable[..., Any], args: tuple, timeout: float,
                 init: bool, pg_timeout: float | None, dist_module: str,
                 patches: dict[str, Any] | None, may_exit: tuple[int, ...], grace: float) -> list[Any]:
    """Ranks as threads of this process, each with its own pyc10d World."""
    from pyc10d.world import World, set_thread_world

    tmp = tempfile.mkdtemp(prefix="pyc10d-ranks-")
    store_path = os.path.join(tmp, "store")
    results: dict[int, tuple] = {}
    done = threading.Condition()

    def run(rank: int) -> None:
        set_thread_world(World())
        try:
            res = _body(rank, world_size, backend, fn, args, store_path, init, pg_timeout, dist_module)
        finally:
            set_thread_world(None)
        with done:
            results[rank] = res
            done.notify_all()

    threads = [threading.Thread(target=run, args=(r,), daemon=True, name=f"rank{r}")
               for r in range(world_size)]
    try:
        with patched(patches):
            for t in threads:
                t.start()
            deadline = time.monotonic() + timeout
            with done:
                while len(results) < world_size:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    done.wait(left)
                    if any(r[0] == "error" for r in results.values()):
                        deadline = min(deadline, time.monotonic() + grace)
        frames = sys._current_frames()
        stuck = {r: "".join(traceback.format_stack(frames[t.ident])) if t.ident in frames else ""
                 for r, t in enumerate(threads) if r not in results}
        if stuck or any(r[0] == "error" for r in results.values()):
            raise AssertionError(_report(results, stuck, world_size, backend))
        return [results[r][1] for r in range(world_size)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
