"""Multi-NIC striping across namespace hosts with two links each (``Hosts(2, links=2)``:
``eth0`` on one bridge, ``eth1`` on another), every link rate-limited (tbf) to ``RATE``.

One rank per host streams large messages (checked on arrival) to the other, once with
``PYC10D_SOCKET_IFNAME=eth0`` (one link) and once with ``eth0,eth1`` (links: each message
striped over both links): the second must move the bytes at about the sum of the two
links' rates, more than ``MIN_GAIN`` times the first. The same over IPv6-only hosts.
"""

from __future__ import annotations

import itertools
import subprocess
import time
from pathlib import Path

import pytest
from _multihost_worker import STREAM_BYTES, STREAM_MESSAGES
from test_multihost import WORKER, _logs, _reports

from pyc10d.hostport import format_hostport
from pyc10d.testing.hosts import Hosts, ShapingUnsupported, unavailable_reason

_WHY_NOT = unavailable_reason()
pytestmark = [pytest.mark.skipif(_WHY_NOT is not None, reason=f"namespace hosts: {_WHY_NOT}"),
              pytest.mark.interpreters]
_PORTS = itertools.count(29800)
RATE, RATE_MBIT = "200mbit", 200
MIN_GAIN = 1.6


def _stream(hs: Hosts, ifname: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> float:
    """Seconds rank 0 (host h0) took to stream to rank 1 (h1) with ``ifname``."""
    out.mkdir()
    monkeypatch.setenv("PYC10D_SOCKET_IFNAME", ifname)
    master = format_hostport(hs[0].addr, next(_PORTS))
    procs = [h.spawn_script(WORKER, ["stream", str(out), master, "2", str(h.index), "tcp"],
                            str(out / f"{h.name}.log")) for h in hs.hosts]
    deadline = time.monotonic() + 30
    try:
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        pytest.fail(f"ranks still running after 30s\n{_logs(out)}")
    finally:
        for h in hs.hosts:
            h.kill()
            h.procs.clear()
    reports = _reports(out, [0, 1])
    assert sorted(reports) == [0, 1] and all(r["ok"] for r in reports.values()), f"{reports}\n{_logs(out)}"
    return reports[1]["seconds"]


@pytest.mark.timeout(55)
@pytest.mark.parametrize("ipv6_only", [False, True], ids=["ipv4", "ipv6"])
def test_two_links_carry_about_their_sum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ipv6_only: bool) -> None:
    with Hosts(2, links=2, ipv6_only=ipv6_only) as hs:
        try:
            hs.shape(rate=RATE)
        except ShapingUnsupported as e:
            pytest.skip(str(e))
        one = _stream(hs, "eth0", tmp_path / "one", monkeypatch)
        two = _stream(hs, "eth0,eth1", tmp_path / "two", monkeypatch)
    mbit = STREAM_BYTES * STREAM_MESSAGES * 8 / 1e6
    print(f"one link: {mbit / one:.0f} Mbit/s, two links: {mbit / two:.0f} Mbit/s (each link {RATE})")
    assert mbit / one < 1.1 * RATE_MBIT, one  # the shaping holds: one link is not faster
    assert one / two > MIN_GAIN, (one, two)
