"""The threads pyc10d starts, and the exit that waits for them.

Every thread pyc10d starts is a daemon (a rank that ends without ``destroy_process_group``
must still end), and a daemon thread that is inside a torch operation when the interpreter
finalizes kills the process: CPython (before 3.14) ends a daemon thread that wants the GIL
back after finalization began with ``pthread_exit``, whose forced unwinding meets the
``noexcept`` destructor of torch's GIL release and calls ``std::terminate`` ("terminate called
without an active exception", exit code 134). Measured: a daemon thread adding into a 3M-element
tensor in a loop, the main thread returning after 0.2 s: 5 aborts in 5 runs. A group dropped on
a pyc10d thread shuts down on a thread of its own (``backends.lifetime``), so a program that
ends right after its last collective could end while that shutdown was still running.

So a thread is started here (``start``), which keeps it in a registry, and the first thread
registers one ``atexit`` hook. ``atexit`` runs after the interpreter joined the non-daemon
threads and before it finalizes; the hook first runs what asked to run at exit
(``at_exit``: ``backends.lifetime`` shuts down every group this process still has, which
cancels what they had pending and ends their progress and receiver threads), then joins every
registered thread still running, within ``PYC10D_EXIT_TIMEOUT`` seconds (default 10) in all:
a stuck peer may not hang the exit either. A thread still running then is named in a warning.
Threads that never enter torch (a store server's, the tcp listener's and dialers', the
heartbeat's, the watchdog's: sockets, the store and counters) are started with
``join_at_exit=False``: stopped anywhere by the finalization they are harmless, and those that
serve the process's lifetime would only make the exit wait out the bound. The ones joined are
those that run a collective's work: progress, receivers, a dropped group's release and a
receive's future.

The registry is per process: a forked child inherits the parent's ``Thread`` objects but none
of its threads, and registers a hook of its own at its first thread (``run_fork`` clears the
parent's hooks in a child).

The bottom of the package, beside ``env``: it imports nothing of pyc10d but ``env``.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from . import settings

log = logging.getLogger("pyc10d")


def renew_after_fork(namespace: dict[str, Any], **factories: Callable[[], Any]) -> None:
    """In a forked child, replace each module-level lock ``name`` of ``namespace`` (the
    module's ``globals()``) by ``factories[name]()``: a thread of the parent may have held it
    at the fork, and no thread of the child would ever release it. The first ``start`` in a
    child takes ``_lock``: a member forked from a pytest worker whose pyc10d threads were
    starting threads waited there for good, before its transport published its address."""
    def renew() -> None:
        for name, make in factories.items():
            namespace[name] = make()

    os.register_at_fork(after_in_child=renew)


_lock = threading.Lock()
renew_after_fork(globals(), _lock=threading.Lock)
#: Threads started here in this process that the exit waits for (an ended one is dropped).
_joinable: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
#: What runs at exit before the join, in order of registration.
_exit_hooks: list[Callable[[], None]] = []
#: The process whose ``atexit`` hook is registered (a forked child registers its own).
_hooked_pid = 0
#: The process in which torch's intra-op pool was last settled (``settle_torch_pool``).
_settled_pid = 0


def exit_timeout() -> float:
    """Seconds the exit waits, in all, for pyc10d's threads (``PYC10D_EXIT_TIMEOUT``)."""
    return settings.EXIT_TIMEOUT.get()


def start(target: Callable[..., Any], name: str, args: tuple = (), join_at_exit: bool = True) -> threading.Thread:
    """Start ``target(*args)`` on a daemon thread called ``name`` (which must start with
    ``pyc10d-``: ``backends.lifetime`` and the tests tell pyc10d's threads by it). Unless
    ``join_at_exit`` is False, the interpreter's exit waits for it (see the module docstring)."""
    if not name.startswith("pyc10d-"):
        raise ValueError(f"pyc10d thread names start with 'pyc10d-': {name!r}")
    _hook()
    settle_torch_pool()
    t = threading.Thread(target=target, args=args, name=name, daemon=True)
    if join_at_exit:
        with _lock:
            _joinable.add(t)
    t.start()
    return t


def settle_torch_pool() -> None:
    """In a forked child, have torch make its new intra-op thread pool now, from this thread,
    before threads start (once per process; a no-op before torch is imported).

    After a fork torch marks the pool it inherited as corrupt and replaces it on the next call
    that asks for it; two threads asking at once (each thread's first parallel op asks) can be
    handed no pool: "pool INTERNAL ASSERT FAILED ... Invalid thread pool!". Seen once in a fresh
    run: four rank threads of ``pyc10d.testing.threaded`` in a rank forked by ``run_fork``,
    each calling ``torch.arange`` first. A progress thread beside a forked rank's main thread
    can meet the same race.
    """
    global _settled_pid
    torch = sys.modules.get("torch")
    if torch is None or _settled_pid == os.getpid():
        return
    _settled_pid = os.getpid()
    torch.set_num_threads(torch.get_num_threads())


def at_exit(hook: Callable[[], None]) -> None:
    """Run ``hook()`` at the interpreter's exit, before pyc10d's threads are joined (once per
    registration; a hook that raises is logged and the others still run)."""
    _hook()
    with _lock:
        _exit_hooks.append(hook)


def running() -> list[threading.Thread]:
    """The threads started here that the exit would wait for and that are still running."""
    with _lock:
        return [t for t in _joinable if t.is_alive()]


def _hook() -> None:
    global _hooked_pid
    pid = os.getpid()
    if _hooked_pid == pid:
        return
    with _lock:
        if _hooked_pid == pid:
            return
        if _hooked_pid:  # a forked child: the parent's threads and hooks are not ours
            _joinable.clear()
            _exit_hooks.clear()
        _hooked_pid = pid
    atexit.register(_on_exit)


def _on_exit() -> None:
    if os.getpid() != _hooked_pid:
        return
    deadline = time.monotonic() + exit_timeout()
    with _lock:
        hooks = list(_exit_hooks)
    for hook in hooks:
        try:
            hook()
        except Exception as e:  # noqa: BLE001 - the exit goes on; say what failed
            log.warning("pyc10d: at exit, %s failed: %s: %s", getattr(hook, "__name__", hook),
                        type(e).__name__, e)
    join(deadline)


def join(deadline: float) -> list[threading.Thread]:
    """Join every registered thread until ``deadline`` (``time.monotonic()``), and those
    started meanwhile (a group's release, started by a shutdown); the ones still running then,
    each named in a warning."""
    me = threading.current_thread()
    late: list[threading.Thread] = []
    while pending := [t for t in running() if t is not me and t not in late]:
        for t in pending:
            t.join(max(deadline - time.monotonic(), 0.0))
            if t.is_alive():
                late.append(t)
    for t in late:
        log.warning("pyc10d: thread %s still running at exit after %.1f s (PYC10D_EXIT_TIMEOUT)",
                    t.name, exit_timeout())
    return late
