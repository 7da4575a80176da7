"""Stuck ranks: which ranks have not entered the collective everyone else is waiting in.

A collective can only wait on ranks that never join it; without help, every other rank
waits out the group timeout (torch's default is 30 minutes) and then knows nothing. Here one
daemon thread per process:

* publishes, for every group of this process, how far this rank got — the sequence number
  and name of the last collective it entered and of the last it completed — to the store
  (``pyc10d/progress/<group>/<rank>``), every ``period`` seconds when it changed. It runs
  beside the rank's own threads, so a rank stuck in its own code (or in a long sleep) still
  says where it is;
* watches the collectives in flight: one that has waited longer than ``PYC10D_STUCK_WARN_S``
  (default 10 s) is reported once, on every waiting rank, as a warning on the ``pyc10d``
  logger naming the ranks that have not entered it and the last collective each completed.
  The same words end the error a collective raises when its timeout expires;
* hands an asynchronous call started on the lean lane (``lane.LaneOps._start_step``) that
  nobody came back to within a period to the group's progress thread, which waits it out
  as a queued call (it times out, names a dead peer and aborts the group in the background).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any

from .. import settings, threads

log = logging.getLogger("pyc10d")

KEY = "pyc10d/progress"


def warn_after() -> float:
    return settings.STUCK_WARN_S.get()


def period() -> float:
    """Seconds between the watchdog's looks: 2, or less when ``PYC10D_STUCK_WARN_S`` is below 8."""
    return max(0.2, min(2.0, warn_after() / 4))


class _Seen:
    """What the watchdog last did about one engine: the progress it published and when
    (monotonic, completed count), the operation it warned about, whether it warned that the
    group's store failed."""

    __slots__ = ("published", "published_at", "warned_seq", "store_warned")

    def __init__(self) -> None:
        self.published: tuple[int, str, int, str] | None = None
        self.published_at: tuple[float, int] | None = None
        self.warned_seq: int | None = None
        self.store_warned = False


#: The watchdog's record of each engine it has looked at (kept across a fork, as the engines are).
_seen: weakref.WeakKeyDictionary[Any, _Seen] = weakref.WeakKeyDictionary()


def _seen_of(engine: Any) -> _Seen:
    seen = _seen.get(engine)
    if seen is None:
        seen = _seen.setdefault(engine, _Seen())
    return seen


class Watchdog:
    """The process's watcher of every registered engine (see the module docstring)."""

    def __init__(self) -> None:
        self._engines: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def register(self, engine: Any) -> None:
        with self._lock:
            self._engines.add(engine)
            if self._thread is None or not self._thread.is_alive():
                # The store and the engines' counters, never torch: the exit need not wait for it.
                self._thread = threads.start(self._run, "pyc10d-watchdog", join_at_exit=False)

    def unregister(self, engine: Any) -> None:
        with self._lock:
            self._engines.discard(engine)
            if not self._engines:  # the last group is gone: let the thread end now
                self._wake.set()

    def _run(self) -> None:
        """Look every period while some group is registered; end when none is (the next
        ``register`` starts the thread again), so no pyc10d thread outlives the last group."""
        while True:
            self._wake.wait(period())
            with self._lock:
                self._wake.clear()
                engines = list(self._engines)
                if not engines:
                    self._thread = None
                    return
            # every rank of this process publishes before any of them looks at the others
            # (ranks as threads share this loop)
            for step in (publish, check, unattended):
                for engine in engines:
                    try:
                        step(engine)
                    except Exception as e:  # noqa: BLE001 - keep watching the other groups
                        self._store_failed(engine, e)

    def _store_failed(self, engine: Any, e: Exception) -> None:
        """A group's store failed under the watchdog: say so at WARNING, once per group, since
        from then on its stuck ranks may go unreported. A group destroyed meanwhile (its store
        closed at shutdown, the usual case) only gets a DEBUG line."""
        with self._lock:
            live = engine in self._engines
        seen = _seen_of(engine)
        if not live or seen.store_warned:
            log.debug("pyc10d watchdog: %s: %s", engine.group_name, e)
            return
        seen.store_warned = True
        log.warning("pyc10d watchdog: the store of group %r failed (%s: %s); stuck ranks of this "
                    "group may go unreported until it answers again", engine.group_name,
                    type(e).__name__, e)


def _key(engine: Any, rank: int) -> str:
    return f"{KEY}/{engine.group_name}/{rank}"


def publish(engine: Any) -> None:
    """Put this rank's progress in the group's store, if it changed since the last time.

    The value is ``entered|op|completed|op`` (what ``peers_behind`` reads), then for
    ``python -m pyc10d.status``: the operation running now (``seq|op|since``, wall-clock
    seconds; ``0||0`` when none), operations completed per second since the previous
    publication, and when this was written (wall clock). One write per period at most (the
    loop's period is 2 s unless ``PYC10D_STUCK_WARN_S`` is below 8 s), none while nothing moves.
    """
    state = engine.progress()
    seen = _seen_of(engine)
    if state == seen.published or engine.progress_store is None:
        return
    now, mono = time.time(), time.monotonic()
    running = engine.running()
    run = (running[0], running[1], f"{now - (mono - running[2]):.3f}") if running else (0, "", 0)
    prev = seen.published_at
    rate = (state[2] - prev[1]) / max(mono - prev[0], 1e-3) if prev else 0.0
    engine.progress_store.set(_key(engine, engine.rank()),
                              "|".join(map(str, (*state, *run, f"{rate:.2f}", f"{now:.3f}"))))
    seen.published = state
    seen.published_at = (mono, state[2])


def peers_behind(engine: Any, seq: int) -> list[str]:
    """For each rank of the group that has not entered operation ``seq``: what it last did."""
    store = engine.progress_store
    if store is None:
        return []
    keys = [_key(engine, r) for r in range(engine.size()) if r != engine.rank()]
    present = [k for k in keys if store.check([k])]
    values = dict(zip(present, store.multi_get(present))) if present else {}
    behind = []
    for r in range(engine.size()):
        if r == engine.rank():
            continue
        raw = values.get(_key(engine, r))
        if raw is None:
            behind.append(f"rank {r} (no progress reported)")
            continue
        entered, entered_op, completed, completed_op = raw.decode().split("|")[:4]
        if int(entered) < seq:
            last = f"{completed_op} #{completed}" if int(completed) else "no collective yet"
            behind.append(f"rank {r} (last completed: {last})")
    return behind


def describe_stuck(engine: Any, seq: int, opname: str) -> str:
    behind = peers_behind(engine, seq)
    if not behind:
        return ""
    return f"ranks not in {opname} #{seq} of group {engine.group_name!r}: " + ", ".join(behind)


def check(engine: Any) -> None:
    """Warn (once per operation) about an operation waiting longer than the threshold."""
    running = engine.running()
    if running is None:
        return
    seq, opname, started = running
    waited = time.monotonic() - started
    seen = _seen_of(engine)
    if waited < warn_after() or seen.warned_seq == seq:
        return
    seen.warned_seq = seq
    text = describe_stuck(engine, seq, opname)
    log.warning("pyc10d: rank %d has waited %.0f s in %s #%d of group %r; %s", engine.rank(), waited, opname,
                seq, engine.group_name, text or "every rank has entered it")


def unattended(engine: Any) -> None:
    """A started call older than a period (``period()``) that its caller has not waited for,
    polled or followed with another call: its finish goes to the progress thread."""
    hand_off = getattr(engine, "hand_off_unattended", None)  # an engine with the lean lane
    if hand_off is not None:
        hand_off(period())


WATCHDOG = Watchdog()


def _reset_after_fork() -> None:
    """A forked child has none of the parent's threads, and a lock the parent's watchdog
    held at the fork would stay held forever in the child (its first ``register`` would then
    hang in ``init_process_group``): start the child with a fresh watchdog."""
    global WATCHDOG
    WATCHDOG = Watchdog()


os.register_at_fork(after_in_child=_reset_after_fork)
