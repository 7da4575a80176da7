"""How many CPUs this process may run on: what the transports' spin and buffer policies, the
functional collectives' inline limit and the benchmarks' spaced mode compare rank counts with."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs of this process's affinity set (``os.cpu_count()`` where that is unknown):
    under ``taskset``, a cgroup cpuset or ``pyc10d.run --bind-to`` fewer than the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
