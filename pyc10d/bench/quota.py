"""A cgroup with a CPU quota, for benchmarks that run jobs as a container's CPU limit would.

``cpu_quota_group(cpus)`` makes a child cgroup of the CPU controller (cgroup v2's
``cpu.max``, else v1's ``cpu.cfs_quota_us``) allowing ``cpus`` CPUs of time per 100 ms
period, and yields the function that moves a process into it (a ``preexec_fn``: the job's
launcher and every rank it forks inherit it; or the caller itself, who is moved back to its
own cgroup at the end); the group is removed afterwards. Needs root and
a writable cgroup filesystem; ``QuotaUnavailable`` says why not.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pyc10d.transport.cpus import CGROUP_ROOT

PERIOD_US = 100_000


class QuotaUnavailable(RuntimeError):
    """No cgroup with a CPU quota can be made here."""


def _parent(root: Path) -> tuple[Path, str]:
    """(directory to make the group in, "v1" or "v2")."""
    if (root / "cgroup.controllers").exists():
        if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
            try:
                (root / "cgroup.subtree_control").write_text("+cpu")
            except OSError as e:
                raise QuotaUnavailable(f"cgroup v2 at {root}: cannot enable the cpu controller ({e})") from None
        return root, "v2"
    for name in ("cpu", "cpu,cpuacct"):
        if (root / name / "cpu.cfs_quota_us").exists():
            return root / name, "v1"
    raise QuotaUnavailable(f"no CPU controller under {root}")


def _current(parent: Path, version: str) -> Path:
    """This process's cgroup directory under ``parent`` (its controller's hierarchy)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (version == "v2" and controllers == "") or (version == "v1" and "cpu" in controllers.split(",")):
            return parent / path.lstrip("/")
    return parent


@contextmanager
def cpu_quota_group(cpus: float, root: Path = CGROUP_ROOT) -> Iterator[Callable[[], None]]:
    parent, version = _parent(root)
    group = parent / f"pyc10d-quota-{os.getpid()}"
    quota = max(1000, int(cpus * PERIOD_US))
    try:
        group.mkdir()
        if version == "v2":
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
    except OSError as e:
        raise QuotaUnavailable(f"cannot make a cgroup with a CPU quota at {group} ({e}); run as root") from None
    procs = group / "cgroup.procs"
    came_from: list[Path] = []

    def enter() -> None:
        if os.getpid() == owner:  # (a child forked later needs no way back)
            came_from.append(_current(parent, version))
        procs.write_text(str(os.getpid()))

    owner = os.getpid()
    try:
        yield enter
    finally:
        for back in came_from:  # this process entered: out again, or the group cannot go
            try:
                (back / "cgroup.procs").write_text(str(owner))
            except OSError:
                pass
        for _ in range(50):  # its processes may take a moment to be gone
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
