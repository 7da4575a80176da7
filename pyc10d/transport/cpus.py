"""How many CPUs this host gives the job: what the transports' spin and buffer policies, the
functional collectives' inline limit and the benchmarks' spaced mode compare rank counts with.

Two things limit it, and ``usable_cpus`` takes the smaller:

* the affinity set (``taskset``, a cgroup cpuset, ``pyc10d.run --bind-to``), as it was before
  pyc10d placed this process on a share of it (``place``): a placed rank's own mask is its
  share, not what the job's ranks on the host have between them;
* the CPU quota of the process's cgroup (a container's CPU limit: v2 ``cpu.max``, v1
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, the smallest along the cgroup's path),
  rounded down, at least 1: a quota is time, not CPUs, so two ranks spinning under a quota
  of one CPU take turns being throttled.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from .. import settings, threads

CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity() -> int:
    """CPUs in this process's affinity set as it is now (``os.cpu_count()`` where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _limit_v2(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _limit_v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def _smallest_up(leaf: Path, top: Path, read: Callable[[Path], float | None]) -> float | None:
    """The smallest limit ``read`` finds from ``leaf`` up to ``top`` (a parent's quota binds
    its children too)."""
    found: list[float] = []
    d = leaf
    while True:
        got = read(d)
        if got is not None:
            found.append(got)
        if d == top or top not in d.parents:
            break
        d = d.parent
    return min(found) if found else None


def cpu_quota(proc_cgroup: str = "/proc/self/cgroup", root: Path = CGROUP_ROOT) -> float | None:
    """CPUs the cgroup quota of this process allows (e.g. 1.5), or None when it has none."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2 (alone at the root, or beside v1 under unified/)
            for top in (root, root / "unified"):
                if (top / "cgroup.controllers").exists():
                    got = _smallest_up(top / rel, top, _limit_v2)
                    if got is not None:
                        limits.append(got)
        elif "cpu" in controllers.split(","):
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                top = root / name
                if top.is_dir():
                    got = _smallest_up(top / rel, top, _limit_v1)
                    if got is not None:
                        limits.append(got)
                    break
    return min(limits) if limits else None


@lru_cache(maxsize=1)
def _quota() -> float | None:
    return cpu_quota()


def usable_cpus() -> int:
    """The CPUs the job's ranks on this host share: the affinity set (before placement) and
    the cgroup quota, the smaller (see the module docstring)."""
    n = len(_original) if _placed is not None else affinity()
    quota = _quota()
    if quota is not None:
        n = min(n, max(1, math.floor(quota + 1e-9)))
    return n


def oversubscribed(ranks_on_host: int, cpus: int | None = None) -> bool:
    """The one answer to "more ranks on this host than CPUs?" (``cpus``: ``usable_cpus()``
    unless given). It decides every policy that changes when ranks share CPUs: a waiting
    rank yields its CPU (tcp's ``spin_yields``, shm's ``default_spin``), tcp's spin time,
    socket buffers and how large a tensor the lane reads itself, and the functional
    collectives' inline limit (asked for twice the ranks: a CPU for each rank's progress too)."""
    return host_shared or ranks_on_host > (usable_cpus() if cpus is None else cpus)


#: ``PYC10D_BIND``: ``auto`` (default) gives each rank of a host its own share of the CPUs when
#: its shared-memory transport starts (``place``); ``none`` leaves placement to the kernel.
BIND_ENV = settings.BIND.name
_placed: list[int] | None = None  # this process's mask while pinned
_slot: tuple[int, int] | None = None  # (local rank, local size) of a process that may be placed
_job = 0  # this process's job on the host: the least pid of its ranks there
_tried = False


def share(cpus: list[int], jobs: list[int], job: int, local_rank: int, local_size: int) -> list[int] | None:
    """The CPUs of ``local_rank`` of job ``job``, with ``jobs`` (their keys, sorted) placed on
    ``cpus`` together: each job a block of ``len(cpus) // len(jobs)`` CPUs, and inside it each
    rank a block of its own, or the whole block for every rank of the job where the ranks
    outnumber it. None where the jobs outnumber the CPUs (the kernel places them).

    Why blocks per job (2 jobs x 2 ranks on 2 CPUs, all_reduce, 10 alternated rounds,
    docs/placement.md "A shared host"): left to the kernel, the four ranks
    often end one rank of each job per CPU, each job then waking its peer across CPUs
    through the other job's rank: 64 KiB median 150 us, rounds up to 1,228; each job on a
    CPU of its own: 58 us, every round 53-121."""
    if job not in jobs or len(jobs) > len(cpus):
        return None
    block = len(cpus) // len(jobs)
    at = jobs.index(job) * block
    mine = cpus[at:at + block]
    if local_size > block:
        return mine
    each = block // local_size
    return mine[local_rank * each:(local_rank + 1) * each]


def place(local_rank: int, local_size: int, pids: list[int] | None = None,
          alive: Callable[[], bool] | None = None) -> list[int] | None:
    """Have every thread of this process pinned to its own share of the CPUs (``share``), the
    first time a host's ranks connect: alone on the host, ``local_rank``'s block of
    ``len(cpus) // local_size`` CPUs of the affinity set (returned), pinned at once: left
    unpinned until the watch's first look, 1 MiB all_reduces timed in a job's first half
    second had their slowest of 10 fresh jobs at 293-746 us against 264-384 pinned at once
    (docs/placement.md "A shared host"). Beside other jobs of the register,
    the watch pins it at its first look (``WATCH_S`` later), when jobs started together have
    all enrolled: three jobs pinned at enrolment on two CPUs, then unpinned when the third
    came, had left two of them each on one CPU (64 KiB: 2.3x ``PYC10D_BIND=none``'s time).

    Why (docs/placement.md, "Two speeds decided at start-up"): left to the kernel, two ranks
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

    Every such group enrols in the host's register of pyc10d processes, under its job (the
    least pid of its ranks here), and watches it (``_watch``) while ``alive()``: with other
    jobs in it, the CPUs are shared out by job (``share``), again at every look that finds
    the jobs changed; pinned apart rank by rank, two jobs' ranks end one of each job per CPU,
    a split that outlives unpinning (the load looks balanced to the kernel).
    """
    global _tried, _job, _slot
    if pids is not None and pids.count(os.getpid()) > 1:
        return None
    own = sorted(set(pids or []) | {os.getpid()})
    if local_size >= 2:
        with _watch_lock:
            if not _job:
                _job = own[0]
        _rewrite_register(lambda pid, start: pid != os.getpid() and _started(pid) == start, add=True)
        _watch_while(own, alive)
    if _tried:
        return _placed
    _tried = True
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if settings.BIND.get().lower() in ("none", "0", "off", "false"):
        return None
    if local_size < 2 or local_size > len(cpus) or not 0 <= local_rank < local_size:
        return None
    if local_size > usable_cpus():  # a quota below the affinity set: the ranks share anyway
        return None
    with _watch_lock:
        if _gave_up:
            return None
        _original[:] = cpus
        _slot = (local_rank, local_size)
        if register_jobs()[0] == [_job]:  # alone on the host (see the docstring)
            return _repin([_job])
    return share(cpus, [_job], _job, local_rank, local_size)  # (the watch pins it)


def _repin(jobs: list[int]) -> list[int] | None:
    """Pin this process to its share with ``jobs`` on the host, or give the whole affinity set
    back where it has none (caller holds ``_watch_lock``)."""
    global _placed
    mine = None if _slot is None else share(_original, jobs, _job, *_slot)
    if mine is None:
        if _placed is not None:
            _pin_all(_original)
        _placed = None
    elif mine != _placed:
        _pin_all(mine)
        _placed = mine
    return mine


def _pin_all(cpus: list[int]) -> None:
    """Set the affinity of every thread of this process (new threads inherit it)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            pass


# -- knowing it is not alone -------------------------------------------------------------------
#: Seconds between two looks at who else uses the CPUs, and how many CPUs' worth of time
#: others must have taken in two looks in a row for a placed rank to give its placement up.
WATCH_S = 0.5
OTHERS_CPUS = 0.5
_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _busy_ticks() -> int | None:
    """Ticks every CPU of the machine spent running anything (``/proc/stat``; steal and idle
    time left out): the kernel counts every process here, in any namespace or container."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return user + nice + system + irq + softirq


def _own_ticks(pids: list[int]) -> int:
    """Ticks the processes ``pids`` (every thread of each) have run, user and system."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):  # (a rank that ended)
            pass
    return total


def others_cpus(pids: list[int], window_s: float) -> float | None:
    """CPUs' worth of time that processes other than ``pids`` used during ``window_s`` seconds
    from now (blocks that long); None where ``/proc`` does not say."""
    busy0, own0 = _busy_ticks(), _own_ticks(pids)
    if busy0 is None:
        return None
    time.sleep(window_s)
    busy1, own1 = _busy_ticks(), _own_ticks(pids)
    if busy1 is None:
        return None
    return max(0.0, (busy1 - busy0) - (own1 - own0)) * _TICK_S / window_s


#: True once this process saw another job in the register or other processes use the host's
#: CPUs (``_watch``): its ranks then wait as ranks that outnumber the CPUs do (``oversubscribed``).
host_shared = False
_hooks: list[weakref.ref] = []
_original: list[int] = []  # the affinity set before placement (its size: the host's CPUs)
_groups: list[tuple[list[int], Callable[[], bool]]] = []  # (ranks' pids, still there?) watched
_watch_lock = threading.RLock()  # (``place`` and the watch re-pin under it)
_watching = False
_gave_up = False  # others' load seen: placement and the watch ended for this process


def _watch_while(own: list[int], alive: Callable[[], bool] | None) -> None:
    """Watch for other jobs while some group registered here is alive (one thread)."""
    global _watching
    with _watch_lock:
        if _gave_up:
            return
        _groups.append((own, alive or (lambda: True)))
        if _watching:
            return
        _watching = True
    threads.start(_watch, "pyc10d-placement", join_at_exit=False)


def when_shared(waiter: Any) -> None:
    """Call ``waiter.host_shared()`` when the host turns out to be shared (at once if it is):
    how a wait policy fixed at creation (a shm arena's spin) learns it (held weakly)."""
    with _watch_lock:
        if not host_shared:
            _hooks.append(weakref.ref(waiter))
            return
    waiter.host_shared()


# -- the host's register of pyc10d processes ----------------------------------------------------
#: One line per process of this user that runs a shm group on this host (its ``/dev/shm``):
#: ``<pid> <start time> <job>``. Another job's live line tells the watch the host is shared at
#: its next look, before that job has used any CPU (two jobs started together sleep until their
#: first collective: pinned meanwhile, both ran it on the same CPUs). Lines of ended
#: processes are dropped when a process enrols; a process leaves it when its watch ends.
def register_path() -> str:
    return f"/dev/shm/pyc10d-jobs-{os.getuid()}"


def _started(pid: int) -> str | None:
    """The start time of process ``pid`` (``/proc``), telling it from a later one with its pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _lines(text: str) -> list[tuple[int, str, int]]:
    """(pid, start time, job) of each well-formed line (a line without a job: its own pid's)."""
    out = []
    for ln in text.splitlines():
        f = ln.split()
        if len(f) in (2, 3) and f[0].isdigit() and (len(f) == 2 or f[2].isdigit()):
            out.append((int(f[0]), f[1], int(f[2]) if len(f) == 3 else int(f[0])))
    return out


def _rewrite_register(keep: Callable[[int, str], bool], add: bool) -> None:
    """Under the file's lock: keep the lines ``keep(pid, start)`` answers True for, and this
    process's own line when ``add``."""
    import fcntl

    try:
        fd = os.open(register_path(), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(os.dup(fd), "r+") as f:
            kept = [f"{p} {t} {j}" for p, t, j in _lines(f.read()) if keep(p, t)]
            me = _started(os.getpid())
            if add and me is not None:
                kept.append(f"{os.getpid()} {me} {_job or os.getpid()}")
            f.seek(0)
            f.truncate()
            f.write("".join(f"{ln}\n" for ln in kept))
    finally:
        os.close(fd)


def register_jobs() -> tuple[list[int], list[int]]:
    """The jobs of the register's live processes, this one's among them (sorted), and those
    processes' pids."""
    try:
        with open(register_path()) as f:
            live = [(p, j) for p, t, j in _lines(f.read()) if _started(p) == t]
    except OSError:
        live = []
    return sorted({j for _, j in live} | {_job or os.getpid()}), [p for p, _ in live]


def _watch() -> None:
    """Every shm rank's watch of its host. At each look: the jobs in the register (a change
    re-pins a placed rank to its share, ``share``; a second job turns every wait policy of
    the process to the one for ranks sharing CPUs: yield while spinning, short spins), and
    how much CPU time processes outside the register used. Once those have used
    ``OTHERS_CPUS`` or more in two looks in a row (a job that is not pyc10d's, or the host
    runs something busy), a placed rank's threads go back to the whole affinity set for good:
    pinned ranks cannot move away from another's load, and ranks that spin hold CPUs the
    ranks they wait for need (measured: placement.md, "A shared host").
    It ends with the last group it watches for (no pyc10d thread outlives the groups)."""
    global _watching, _gave_up, _slot
    busy = 0
    seen: tuple[list[int], tuple[int, int] | None] = ([], None)  # the jobs and _slot last pinned for
    registered = register_jobs()[1]
    while True:
        with _watch_lock:
            _groups[:] = [g for g in _groups if g[1]()]
            if not _groups:
                _watching = False
                _rewrite_register(lambda pid, start: pid != os.getpid(), add=False)
                return
            own = sorted({pid for pids, _ in _groups for pid in pids})
        used = others_cpus(sorted(set(own) | set(registered)), WATCH_S)
        jobs, registered = register_jobs()
        if (jobs, _slot) != seen:  # (``place`` sets _slot after starting this watch)
            with _watch_lock:
                seen = (jobs, _slot)
                _repin(jobs)
            if len(jobs) > 1 and not host_shared:
                _mark_shared()
        if used is None:
            break
        busy = busy + 1 if used >= OTHERS_CPUS else 0
        if busy >= 2:
            with _watch_lock:
                _gave_up, _slot = True, None
                _repin(jobs)
            _mark_shared()
            break
    with _watch_lock:
        _watching = False
        _groups.clear()


def _mark_shared() -> None:
    """Tell every wait policy of the process (``when_shared``) that the host is shared."""
    global host_shared
    with _watch_lock:
        host_shared = True
        hooks = list(_hooks)
        _hooks.clear()
    for ref in hooks:
        waiter = ref()
        if waiter is not None:
            waiter.host_shared()


def _forget_after_fork() -> None:
    """A forked child is a process of its own: it places itself when its transport starts."""
    global _placed, _tried, host_shared, _watching, _watch_lock, _slot, _job, _gave_up
    _placed, _tried, host_shared, _watching, _slot, _job, _gave_up = None, False, False, False, None, 0, False
    _watch_lock = threading.RLock()  # (a lock held by a thread of the parent stays held)
    _hooks.clear()
    _groups.clear()
    _quota.cache_clear()


os.register_at_fork(after_in_child=_forget_after_fork)
