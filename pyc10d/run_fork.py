"""Ranks forked from the launcher, for ``python -m pyc10d.run --start-method fork``.

Why: a fresh interpreter that imports torch costs about 2.5 s of CPU on this project's 2-core
machines, and ``python -m pyc10d.run`` has imported torch already (it is part of the pyc10d
package). A rank forked from the launcher starts in milliseconds and shares the imported
modules' pages with its siblings. Benchmarks and tests start dozens of short jobs and use it;
the default stays ``exec`` (one fresh interpreter per rank, like ``torchrun``), because a
forked rank differs from a fresh one in ways a user's script may notice:

* modules the launcher imported (torch, pyc10d and what they import) are imported already,
  so what they read from the environment at import time was read with the launcher's
  environment (the per-rank variables such as ``RANK`` are read later, by
  ``init_process_group``);
* ``sys.path[0]`` is set as Python sets it (the script's directory, or the working directory
  for ``-m``), but the rest of ``sys.path`` and ``sys.flags`` are the launcher's;
* ``atexit`` handlers registered before the fork do not run at the rank's exit (they belong
  to the parent: a test process forking ranks may hold handlers that tear down its fixtures).

The rank runs as ``python -u`` would run it: ``__main__`` is the script, ``sys.argv`` its
arguments, SIGINT raises ``KeyboardInterrupt`` and SIGTERM kills; at its end non-daemon
threads are joined, ``atexit`` handlers run and the exit code is that of ``sys.exit`` (1
after an uncaught exception, whose traceback goes to stderr).
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence

from .threads import settle_torch_pool


class ForkedRank:
    """The part of ``subprocess.Popen``'s interface the launcher uses, for a forked rank."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (the launcher's waitpid(-1))
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)  # as Popen.wait
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def preload() -> None:
    """Import what the ranks will: torch and pyc10d's API (``python -m pyc10d.run`` leaves the
    API out of its own process until asked: ``pyc10d._launching_light_main``)."""
    from pyc10d._lazy_api import load_api

    load_api()


def start(target: Sequence[str], module: bool, env: dict[str, str],
          preexec: Callable[[], None] | None) -> ForkedRank:
    """Fork a rank that runs ``target`` (``[script, *args]`` or ``[module, *args]``)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid:
        return ForkedRank(pid)
    code = 1
    try:
        code = _rank_main(list(target), module, env, preexec)
    except BaseException:  # noqa: BLE001 - nothing may unwind into the launcher's frames
        traceback.print_exc()
    finally:
        os._exit(code)


def _unbuffered() -> None:
    """stdout and stderr as ``python -u`` makes them: every write goes straight to the fd."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors,  # type: ignore[arg-type]
                                            write_through=True))


def _rank_main(target: list[str], module: bool, env: dict[str, str],
               preexec: Callable[[], None] | None) -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    atexit._clear()  # the parent's handlers are the parent's: only the rank's own run at its exit
    gc.freeze()  # the launcher's objects are never collected here: no full pass copying their pages
    settle_torch_pool()  # the rank's own threads may each ask for torch's pool first, at once
    if preexec is not None:
        preexec()
    os.environ.clear()
    os.environ.update(env)
    _unbuffered()
    sys.argv = list(target)
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(target[0]))
    code = 0
    try:
        if module:
            # as in a fresh interpreter: a module the launcher had imported (a benchmark's
            # driver forks its ranks from itself) runs as __main__ without runpy's warning
            sys.modules.pop(target[0], None)
            runpy.run_module(target[0], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target[0], run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        _finish()
        # as the interpreter does: die of SIGINT, so the launcher sees the signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would
        traceback.print_exc()
        code = 1
    _finish()
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _finish() -> None:
    """What interpreter shutdown does before it exits: join threads, run atexit, flush."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
