"""Groups that let go: a group object nobody holds any more shuts its engine down.

An engine is kept alive by its own threads (progress, receivers) and callbacks, so it never
dies with the last user reference the way a Gloo group does; a group dropped by reference
(torchft's wrapper sets ``self._pg = None`` after a failure) would otherwise keep its threads,
sockets and arena, and its peers would wait out their timeout. The native ``ProcessGroup`` and
the plugin's ``TorchProcessGroup`` register here when they are made.

A forked child inherits the parent's groups but none of its threads, and must never destroy
them: what a group holds may join a thread of the parent in its destructor. torch's master
``TCPStore`` (torchft's groups host one each) joins its server thread, and glibc, which counts
every stack of the parent's threads as free in the child, unmaps them once the first such join
releases a stack: the next join reads unmapped memory and the child dies of SIGSEGV, in its
first collection, before running a line of its own (a process whose in-process ranks left
their groups in reference cycles, then forked). So a child keeps one reference to each group
the parent had (``keep_in_forked_children``); the collector is off across the fork, since
``threading``'s own after-fork hook runs before this module's and may collect.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import threading
import weakref
from typing import Any

from .. import settings, threads

#: Every group object of this process (and what else a forked child must not destroy).
_GROUPS: weakref.WeakSet[object] = weakref.WeakSet()
#: The finalizers of this process's groups still alive, in the order the groups were made,
#: which the exit runs (``_at_exit``).
_finalizers: dict[weakref.finalize, None] = {}
_fork_lock = threading.Lock()
_forks_in_progress = 0
_gc_was_enabled = False


def release_on_drop(owner: object, engine: Any) -> None:
    """Shut ``engine`` down when ``owner``, the group object users hold, is garbage.

    An engine is kept alive by its own threads (progress, receivers) and callbacks, so it
    never dies with the last user reference the way a Gloo group does; a group dropped by
    reference (torchft's wrapper sets ``self._pg = None`` after a failure) would otherwise
    keep its threads, sockets and arena, and its peers would wait out their timeout. The
    finalizer does what ``destroy_process_group`` does: ``shutdown``, which closes what the
    engine owns, so the peers raise "Connection closed by peer" at once.

    At the interpreter's exit every group still alive shuts down the same way, as a Gloo
    group's destructor does (``_at_exit``, run by ``threads`` before it joins pyc10d's
    threads): its progress and receiver threads must not be inside torch when the interpreter
    finalizes (see ``pyc10d.threads``).
    """
    f = weakref.finalize(owner, _release, engine, os.getpid())
    f.atexit = False  # ``_at_exit`` runs it, before the threads are joined
    with _fork_lock:
        if not _finalizers:
            threads.at_exit(_at_exit)  # once per process (a forked child's set starts empty)
        for dead in [g for g in _finalizers if not g.alive]:
            del _finalizers[dead]
        _finalizers[f] = None
    _GROUPS.add(owner)


def _at_exit() -> None:
    """Shut down every group of this process still alive, the newest first (subgroups
    before the default group, as ``destroy_process_group`` orders them)."""
    with _fork_lock:
        alive = [f for f in _finalizers if f.alive]
        _finalizers.clear()
    for f in reversed(alive):
        f()


def keep_in_forked_children(obj: object) -> None:
    """Never let a forked child destroy ``obj`` (see the module's docstring): for an object
    that holds a group, or a resource of the parent's threads, without being one
    (``release_on_drop`` registers the groups themselves)."""
    _GROUPS.add(obj)


def _before_fork() -> None:
    # Off until the child has pinned the groups (``_in_child``): other hooks run between.
    global _forks_in_progress, _gc_was_enabled
    with _fork_lock:
        if _forks_in_progress == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _forks_in_progress += 1


def _in_parent() -> None:
    global _forks_in_progress
    with _fork_lock:
        _forks_in_progress -= 1
        if _forks_in_progress == 0 and _gc_was_enabled:
            gc.enable()


def _in_child() -> None:
    # One reference each that the child never gives back: neither its collector nor its
    # interpreter's teardown can destroy them (a list would be emptied at teardown). The
    # pages stay shared with the parent; collecting them would only have copied them.
    global _fork_lock, _forks_in_progress, _finalizers
    for obj in list(_GROUPS):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    _fork_lock, _forks_in_progress = threading.Lock(), 0  # (another thread may have held it)
    _finalizers = {}  # the parent's groups are not the child's to shut down at its exit
    if _gc_was_enabled:
        gc.enable()


os.register_at_fork(before=_before_fork, after_in_parent=_in_parent, after_in_child=_in_child)


def _release(engine: Any, pid: int) -> None:
    # Only in the process that made the group: a forked child inherits the parent's objects
    # but not its threads, and its copies of the sockets and mappings are the parent's
    # connections: shutting them down there would break the parent's group. (A child keeps
    # the parent's groups alive anyway, ``_in_child``; this holds should one slip through.)
    if os.getpid() != pid:
        return
    # A pyc10d thread (progress, receiver) may drop the last reference (a Work's callback,
    # or a cycle collected mid-operation): ``shutdown`` joins those threads, so it runs on
    # a thread of its own there. Anywhere else it runs at once, on the dropping thread (a
    # daemon thread of the user's too: what ``shutdown`` runs there is sockets and joins, never
    # torch, and the threads that do touch torch are the ones the exit waits for).
    if threading.current_thread().name.startswith("pyc10d-"):
        threads.start(_shutdown_quietly, "pyc10d-release", (engine,))
    else:
        _shutdown_quietly(engine)


def abort_aside(engine: Any) -> None:
    """Abort ``engine`` on a pyc10d thread of its own: a group re-formed (``reconfigure``) has
    a new engine already, and the old one's teardown (its threads joined, its arena unmapped)
    need not hold up the new one's first call. The exit waits for it like any such thread."""
    threads.start(_abort_quietly, "pyc10d-release", (engine,))


def _abort_quietly(engine: Any) -> None:
    try:
        engine.abort()
    except Exception as e:  # noqa: BLE001 - nobody waits for it to raise to
        logging.getLogger("pyc10d").debug("pyc10d: aborting the re-formed group's old engine %r: %s",
                                          getattr(engine, "group_name", "?"), e)


def _shutdown_quietly(engine: Any) -> None:
    try:
        engine.shutdown()
    except Exception as e:  # noqa: BLE001 - a finalizer has no caller to raise to
        logging.getLogger("pyc10d").debug("pyc10d: releasing dropped group %r: %s",
                                          getattr(engine, "group_name", "?"), e)


_frozen = False


def freeze_heap_once() -> None:
    """At a process's first group, move every object alive then out of the collector's sight
    (``gc.freeze``): they are the process's long-lived heap (torch's modules, the user's model),
    and the collector walking them was what a rank's first second of collectives waited on.

    Measured (tcp, 3,000 back-to-back 8 B all_reduces right after init, 4 ranks on 2 cores):
    three or four calls of 79-101 ms each, at 0.3-0.8 s, on every rank (full collections over
    torch's objects, prompted by the calls' own short-lived ones); with the heap frozen after
    init, none above 2.4 ms. Gloo's calls make no Python objects to prompt them.
    ``PYC10D_GC_FREEZE=0`` leaves the collector alone (objects frozen are never collected,
    even should they become garbage in a cycle later)."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    if not settings.GC_FREEZE.get():
        return
    gc.freeze()
