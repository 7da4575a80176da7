"""How many CPUs this process may run on: what the transports' spin and buffer policies, the
functional collectives' inline limit and the benchmarks' spaced mode compare rank counts with."""

from __future__ import annotations

import os

from .. import settings


def usable_cpus() -> int:
    """The CPUs of this process's affinity set (``os.cpu_count()`` where that is unknown):
    under ``taskset``, a cgroup cpuset or ``pyc10d.run --bind-to`` fewer than the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def oversubscribed(ranks_on_host: int, cpus: int | None = None) -> bool:
    """The one answer to "more ranks on this host than CPUs?" (``cpus``: ``usable_cpus()``
    unless given). It decides every policy that changes when ranks share CPUs: a waiting
    rank yields its CPU (tcp's ``spin_yields``, shm's ``default_spin``), tcp's spin time,
    socket buffers and how large a tensor the lane reads itself, and the functional
    collectives' inline limit (asked for twice the ranks: a CPU for each rank's progress too)."""
    return ranks_on_host > (usable_cpus() if cpus is None else cpus)


#: ``PYC10D_BIND``: ``auto`` (default) gives each rank of a host its own share of the CPUs when
#: its shared-memory transport starts (``place``); ``none`` leaves placement to the kernel.
BIND_ENV = settings.BIND.name
_placed: list[int] | None = None
_tried = False


def place(local_rank: int, local_size: int, pids: list[int] | None = None) -> list[int] | None:
    """Pin every thread of this process to its own share of the CPUs: ``local_rank``'s block of
    ``len(cpus) // local_size`` CPUs of the affinity set, the first time a host's ranks connect.

    Why (docs/performance.md, "Two speeds decided at start-up"): left to the kernel, two ranks
    that take turns waking each other through a futex were found on one CPU for whole jobs,
    each job then running a large collective at half speed; a rank on a CPU of its own never is.
    Only when every rank can have at least one CPU (never with more ranks than CPUs), only
    once a process (later groups keep it), and not when ``PYC10D_BIND=none``. A rank already
    confined to fewer CPUs than ranks (``mpirun`` binds two ranks to a core each,
    ``pyc10d.run --bind-to core``) is left as it is. New threads inherit the mask of the
    thread that starts them; the ones already running are pinned here one by one.

    ``pids``: the process of each of those ranks. A process that runs several of them (ranks
    as threads, as torchft's Manager tests run replicas) is never placed: pinning it to the
    first rank's share would put all its ranks on it (seen: two replicas on one of two CPUs).
    """
    global _placed, _tried
    if _tried:
        return _placed
    _tried = True
    if pids is not None and pids.count(os.getpid()) > 1:
        return None
    if settings.BIND.get().lower() in ("none", "0", "off", "false"):
        return None
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if local_size < 2 or local_size > len(cpus) or not 0 <= local_rank < local_size:
        return None
    share = len(cpus) // local_size
    mine = cpus[local_rank * share:(local_rank + 1) * share]
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, mine)
        except OSError:  # a thread that ended meanwhile
            pass
    _placed = mine
    return mine


def _forget_after_fork() -> None:
    """A forked child is a process of its own: it places itself when its transport starts."""
    global _placed, _tried
    _placed, _tried = None, False


os.register_at_fork(after_in_child=_forget_after_fork)
