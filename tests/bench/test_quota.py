"""``bench.quota``: a process started in the group sees its quota (``transport.cpus``), and the
group goes afterwards. Needs root and a writable cgroup filesystem (as ``bench --quota``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pyc10d.bench.quota import QuotaUnavailable, cpu_quota_group

PROBE = "from pyc10d.transport import cpus; print(cpus.cpu_quota(), cpus.usable_cpus())"


@pytest.mark.timeout(30)
def test_a_job_in_the_group_sees_its_quota() -> None:
    try:
        with cpu_quota_group(0.5) as enter:
            made = True
            got = subprocess.run([sys.executable, "-c", PROBE], preexec_fn=enter, capture_output=True, text=True,
                                 check=True).stdout.split()
    except QuotaUnavailable as e:
        pytest.skip(f"no cgroup with a CPU quota here: {e}")
    assert made and got == ["0.5", "1"], got
    outside = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.split()
    assert outside[0] != "0.5", outside
