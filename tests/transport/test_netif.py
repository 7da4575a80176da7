"""Interface addresses beyond the IPv4 cases of tests/test_launchers.py: IPv6 (read from
``/proc/net/if_inet6``, link-local and tentative ones left out), IPv6 preferred towards an
IPv6 store, and one address per listed interface (links)."""

from __future__ import annotations

import pytest

from pyc10d.errors import DistNetworkError
from pyc10d.transport.tcp import netif
from pyc10d.transport.tcp.netif import advertised_addresses, choose_interfaces

pytestmark = pytest.mark.timeout(10)

IF_INET6 = """\
fd000213000000000000000000000001 02 40 00 80     eth0
fe80000000000000147d41fffe85c086 02 40 20 80     eth0
00000000000000000000000000000001 01 80 10 80       lo
fd000214000000000000000000000001 03 40 00 c0     eth1
20010db8000000000000000000000007 03 40 00 80     eth1
"""


@pytest.fixture
def ipv6_only_host(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A host whose eth0/eth1 have IPv6 addresses only (eth1's first still tentative)."""
    (tmp_path / "if_inet6").write_text(IF_INET6)
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(
        tmp_path / "if_inet6" if p == "/proc/net/if_inet6" else p, *a, **k))
    monkeypatch.setattr(netif, "_ipv4_addresses", lambda: {"lo": "127.0.0.1"})
    monkeypatch.setattr(netif.socket, "if_nameindex", lambda: [(1, "lo"), (2, "eth0"), (3, "eth1")])


def test_ipv6_addresses_skip_link_local_and_tentative(ipv6_only_host: None) -> None:
    assert netif._ipv6_addresses() == {"eth0": ["fd00:213::1"], "lo": ["::1"], "eth1": ["2001:db8::7"]}
    assert netif.interface_addresses() == {"lo": "127.0.0.1", "eth0": "fd00:213::1", "eth1": "2001:db8::7"}
    assert netif.interface_addresses(prefer_ipv6=True)["lo"] == "::1"


def test_ipv6_only_host_advertises_ipv6(ipv6_only_host: None) -> None:
    env = {"PYC10D_SOCKET_IFNAME": "eth0"}
    assert advertised_addresses(env, "fd00:213::9", 1) == ["fd00:213::1"]
    assert advertised_addresses(env, "[fd00:213::9]", 1) == ["fd00:213::1"]
    # with no interface named: the route's source, else the first non-loopback interface's
    got = advertised_addresses({}, "fd00:213::9", 1)
    assert got[0] != "127.0.0.1" and ":" in got[0], got


def test_one_address_per_listed_interface() -> None:
    addrs = {"lo": "127.0.0.1", "eth0": "10.0.0.5", "eth1": "10.1.0.5", "ib0": "10.2.0.5"}
    assert choose_interfaces("eth0,eth1", addrs) == [("eth0", "10.0.0.5"), ("eth1", "10.1.0.5")]
    assert choose_interfaces("eth", addrs) == [("eth0", "10.0.0.5")]  # a prefix: one interface
    assert choose_interfaces("eth,eth", addrs) == [("eth0", "10.0.0.5"), ("eth1", "10.1.0.5")]
    assert choose_interfaces("ib,nope,eth1", addrs) == [("ib0", "10.2.0.5"), ("eth1", "10.1.0.5")]
    assert choose_interfaces("^lo", addrs) == [("eth0", "10.0.0.5")]  # an exclusion: one
    with pytest.raises(DistNetworkError, match="matches 'wlan'"):
        choose_interfaces("wlan", addrs)


def test_socket_addr_lists_links() -> None:
    assert advertised_addresses({"PYC10D_SOCKET_ADDR": "10.0.0.5,[fd00::5]"}, "10.0.0.1", 0) == \
        ["10.0.0.5", "fd00::5"]
    assert advertised_addresses({}, "::1", 0) == ["::1"]  # a single-host job on IPv6 loopback
