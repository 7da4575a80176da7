"""pyc10d on IPv6-only hosts: namespace hosts (``Hosts(2, ipv6_only=True)``) whose interfaces
have IPv6 addresses only (``fd00:213::1``, ``fd00:213::2``; 127.0.0.1 exists on ``lo`` alone).

The conformance families run across 2 hosts x 2 ranks, each result checked against a local
reference (``test_conformance``), with the store on rank 0's host's IPv6 address: over
``tcp://[fd00:213::1]:port`` (tcp; torch's API on the plugin's ``pyc10d_tcp``) and over
``env://`` with ``MASTER_ADDR`` the bare IPv6 literal (hier). The hosts have no IPv4 address
but loopback (checked), so ranks on the two hosts connect only if each advertised IPv6.
"""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path

import pytest
from test_multihost import WORKER, _check, _logs, _reports

from pyc10d.testing.hosts import Hosts, unavailable_reason

_WHY_NOT = unavailable_reason()
pytestmark = [pytest.mark.skipif(_WHY_NOT is not None, reason=f"namespace hosts: {_WHY_NOT}"),
              pytest.mark.interpreters]
_PORTS = itertools.count(29700)
#: A representative set: reducing, moving, p2p, objects (each family checks many cases).
FAMILIES = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "p2p", "objects"]
#: Through torch's API: all_to_all's family also checks that pyc10d's API refuses strided
#: tensors, which torch's front end hands to a backend as they are.
TORCH_FAMILIES = [f for f in FAMILIES if f != "all_to_all"]


@pytest.fixture(scope="module")
def hosts() -> Hosts:
    with Hosts(2, ipv6_only=True) as hs:
        yield hs


def _run(hs: Hosts, master: str, backend: str, families: list[str], out: Path, timeout: float) -> dict:
    procs = []
    for h in hs.hosts:
        ranks = ",".join(str(r) for r in range(4) if r // 2 == h.index)
        args = ["families", str(out), master, "4", ranks, backend, ",".join(families)]
        procs.append(h.spawn_script(WORKER, args, str(out / f"{h.name}.log")))
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        pytest.fail(f"ranks still running after {timeout:.0f}s\n{_logs(out)}")
    finally:
        for h in hs.hosts:
            h.kill()
            h.procs.clear()
    reports = _reports(out, [0, 1, 2, 3])
    assert sorted(reports) == [0, 1, 2, 3], f"missing rank reports\n{_logs(out)}"
    return reports


def test_hosts_have_ipv6_addresses_only(hosts: Hosts) -> None:
    for h in hosts.hosts:
        text = h.exec("ip", "-o", "addr", "show", "dev", "eth0").stdout
        assert f"inet6 {h.addr}/64" in text and " inet " not in text, text


@pytest.mark.timeout(50)
@pytest.mark.parametrize("backend, how", [  # make test: the plugin on tcp; make test-full the others
    pytest.param("tcp", "tcp", marks=pytest.mark.full), pytest.param("hier", "env", marks=pytest.mark.full),
    ("torch:pyc10d_tcp", "tcp")])
def test_families_on_ipv6_only_hosts(hosts: Hosts, tmp_path: Path, backend: str, how: str) -> None:
    port = next(_PORTS)
    master = f"[{hosts[0].addr}]:{port}" if how == "tcp" else f"env://{hosts[0].addr}:{port}"
    families = TORCH_FAMILIES if backend.startswith("torch:") else FAMILIES
    reports = _run(hosts, master, backend, families, tmp_path, timeout=40)
    _check(reports, "pyc10d_tcp" if backend.startswith("torch:") else backend)
