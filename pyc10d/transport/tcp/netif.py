"""Which address (IPv4 or IPv6) a rank advertises to its peers for their TCP connections.

In order:

1. ``PYC10D_SOCKET_ADDR``: that address, as given (a comma list: one per link, see below).
2. ``PYC10D_SOCKET_IFNAME``, else torch's ``GLOO_SOCKET_IFNAME``: the address of the first
   interface the spec selects. NCCL's syntax: ``eth0,ib`` (a comma list of name prefixes,
   tried in order), ``^docker0,lo`` (any interface but those prefixes, non-loopback first),
   ``=eth0`` / ``^=eth0`` (exact names).
3. Otherwise the source address of a route towards the store's host (a UDP "connect" sends
   nothing). When that is a loopback address although the store's host is not written as
   one (Debian maps the host's own name to 127.0.1.1), the first non-loopback interface's.
4. A store with no host but a file (``file://``, a ``FileStore``: ranks may be on any host
   that shares the file): what this host's name resolves to, as Gloo does, when one of its
   interfaces has that address, else the first non-loopback interface's. Other host-less
   stores (``HashStore``: one process) advertise 127.0.0.1.

A multi-host job (the store's host does not resolve to loopback here) that would advertise
a loopback address fails at once with an error naming the rank, the address and the store's
host, instead of peers on other hosts timing out while dialling 127.0.0.1.

An interface's address is its IPv4 one, or, on an IPv6-only interface (or when the store's
host is an IPv6 address, or a name that resolves to IPv6 only), its first IPv6 address that
is neither link-local (``fe80::/10`` needs a scope id the peers' hosts cannot know) nor still
tentative (duplicate address detection not done: it cannot be bound yet).

Links (``advertised_addresses``): a positive interface list names one interface per entry,
``eth0,eth1``: each entry that matches an interface not picked already adds an address, in
the list's order. A rank that advertises several addresses takes one connection per address
pair (same index) to a peer that advertises several too, and stripes large messages over
them (see ``tcp``); the first address is the rank's address for everything else. A prefix
such as ``eth`` still picks one interface, so a spec written for Gloo keeps its meaning.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import subprocess
from collections.abc import Mapping

from ...errors import DistNetworkError
from ...hostport import family_of, unbracket
from ...settings import SOCKET_ADDR, SOCKET_IFNAME

__all__ = ["advertised_address", "advertised_addresses", "choose_interface", "choose_interfaces",
           "interface_addresses", "is_loopback"]

_SIOCGIFADDR = 0x8915  # Linux: the interface's primary IPv4 address
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_IFNAME_VARS = (SOCKET_IFNAME.name, *SOCKET_IFNAME.aliases)
# /proc/net/if_inet6: scope 0x20 is link-local; flags: tentative (DAD under way), DAD failed.
_SCOPE_LINK = 0x20
_IFA_F_TENTATIVE, _IFA_F_DADFAILED = 0x40, 0x08


def _ipv4_addresses() -> dict[str, str]:
    """``{interface: IPv4 address}`` in interface index order."""
    try:
        import fcntl

        names = [name for _, name in sorted(socket.if_nameindex())]
    except (ImportError, AttributeError, OSError):
        return _ip_command_addresses()
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                req = struct.pack("256s", name.encode()[:15])
                res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)
            except OSError:  # no IPv4 address on it (or it went away)
                continue
            out[name] = socket.inet_ntoa(res[20:24])
    return out


def _ipv6_addresses() -> dict[str, list[str]]:
    """``{interface: [IPv6 address, ...]}`` in interface index order, link-local and
    tentative addresses left out (``/proc/net/if_inet6``; empty where IPv6 is off)."""
    try:
        with open("/proc/net/if_inet6") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    rows = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or len(fields[0]) != 32:
            continue
        index, scope, flags = int(fields[1], 16), int(fields[3], 16), int(fields[4], 16)
        if scope & 0xF0 == _SCOPE_LINK or flags & (_IFA_F_TENTATIVE | _IFA_F_DADFAILED):
            continue
        addr = str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
        rows.append((index, fields[5], addr))
    out: dict[str, list[str]] = {}
    for _, name, addr in sorted(rows, key=lambda r: r[0]):
        out.setdefault(name, []).append(addr)
    return out


def interface_addresses(prefer_ipv6: bool = False) -> dict[str, str]:
    """``{interface: address}`` in interface index order: its IPv4 address, else its first
    IPv6 one (``prefer_ipv6``: the other way round); interfaces with neither left out."""
    v4, v6 = _ipv4_addresses(), _ipv6_addresses()
    names = list(v4) + [n for n in v6 if n not in v4]
    try:
        order = {name: i for i, name in socket.if_nameindex()}
        names.sort(key=lambda n: order.get(n, 1 << 30))
    except OSError:
        pass
    out: dict[str, str] = {}
    for name in names:
        first = [v6[name][0]] if name in v6 else []
        choices = ([v4[name]] if name in v4 else []) + first
        out[name] = choices[-1] if prefer_ipv6 and first else choices[0]
    return out


def _ip_command_addresses() -> dict[str, str]:
    """Fallback where the ioctl is missing: parse ``ip -o -4 addr``."""
    try:
        text = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                              text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "inet":
            out.setdefault(fields[1].rstrip(":"), fields[3].split("/")[0])
    return out


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(unbracket(addr)).is_loopback
    except ValueError:
        return addr == "localhost"


def _resolves_to_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to here is a loopback one (or it is one)."""
    if is_loopback(host):
        return True
    try:
        infos = socket.getaddrinfo(unbracket(host), None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(is_loopback(str(info[4][0])) for info in infos)


def _prefers_ipv6(store_host: str | None) -> bool:
    """The store's host is an IPv6 literal, or a name with IPv6 addresses only: the ranks'
    addresses should be IPv6 too (an IPv6-only cluster)."""
    if store_host is None:
        return False
    if family_of(store_host) == socket.AF_INET6:
        return True
    try:
        infos = socket.getaddrinfo(unbracket(store_host), None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(info[0] == socket.AF_INET6 for info in infos)


def choose_interfaces(spec: str, addrs: Mapping[str, str]) -> list[tuple[str, str]]:
    """The ``(name, address)`` pairs an ``*_SOCKET_IFNAME`` spec picks out of ``addrs``: one
    per entry of a positive list that matches an interface not picked yet, in the list's
    order (the links); the one interface an exclusion (``^...``) leaves first."""
    text = spec.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    patterns = [p.strip() for p in text.split(",") if p.strip()]

    def matches(name: str, pattern: str) -> bool:
        return name == pattern if exact else name.startswith(pattern)

    picked: list[tuple[str, str]] = []
    if exclude:
        left = [n for n in addrs if not any(matches(n, p) for p in patterns)]
        left.sort(key=lambda n: is_loopback(addrs[n]))  # stable: index order otherwise
        picked = [(left[0], addrs[left[0]])] if left else []
    else:
        for pattern in patterns:
            name = next((n for n in addrs if matches(n, pattern) and all(n != p for p, _ in picked)), None)
            if name is not None:
                picked.append((name, addrs[name]))
    if picked:
        return picked
    have = ", ".join(f"{n}={a}" for n, a in addrs.items()) or "none"
    raise DistNetworkError(f"no network interface with an IP address matches {spec!r} "
                           f"(interfaces: {have})")


def choose_interface(spec: str, addrs: Mapping[str, str]) -> tuple[str, str]:
    """The first ``(name, address)`` of ``choose_interfaces``: the rank's address."""
    return choose_interfaces(spec, addrs)[0]


def _route_source(store_host: str) -> str | None:
    try:
        infos = socket.getaddrinfo(unbracket(store_host), 9, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.connect(sockaddr)
                return str(probe.getsockname()[0])
        except OSError:
            continue
    return None


def _own_address() -> str:
    """This host's address for peers that share only a file with it: its name's address if
    one of its interfaces has it (not loopback), else the first non-loopback interface's,
    else 127.0.0.1."""
    others = [a for a in interface_addresses().values() if not is_loopback(a)]
    try:
        addr = socket.gethostbyname(socket.gethostname())
        if addr in others:
            return addr
    except OSError:
        pass
    return others[0] if others else "127.0.0.1"


def advertised_address(env: Mapping[str, str], store_host: str | None, rank: int,
                       shared_file: bool = False) -> str:
    """The address rank ``rank`` publishes for its listener (see the module docstring).
    ``shared_file``: the store has no host, only a file other hosts may share."""
    return advertised_addresses(env, store_host, rank, shared_file)[0]


def advertised_addresses(env: Mapping[str, str], store_host: str | None, rank: int,
                         shared_file: bool = False) -> list[str]:
    """Every address rank ``rank`` publishes, one per link; the first is its address (see
    the module docstring)."""
    store_host = None if store_host is None else unbracket(store_host)
    local_store = store_host is None or store_host in _LOOPBACK_NAMES or is_loopback(store_host)
    if env.get(SOCKET_ADDR.name):
        addrs = [unbracket(a) for a in env[SOCKET_ADDR.name].split(",") if a.strip()]
        how = "from PYC10D_SOCKET_ADDR"
    elif var := next((v for v in _IFNAME_VARS if env.get(v, "").strip()), None):
        have = interface_addresses(True) if _prefers_ipv6(store_host) else interface_addresses()
        picked = choose_interfaces(env[var], have)
        addrs = [a for _, a in picked]
        how = f"interface {picked[0][0]}, from {var}={env[var]}"
    elif shared_file and store_host is None:
        return [_own_address()]
    elif local_store:
        return ["::1" if store_host == "::1" else "127.0.0.1"]
    else:
        assert store_host is not None
        addr = _route_source(store_host) or "127.0.0.1"
        how = f"the route towards {store_host}"
        if is_loopback(addr):
            others = [a for a in interface_addresses(_prefers_ipv6(store_host)).values() if not is_loopback(a)]
            if others:
                return [others[0]]
        addrs = [addr]
    addr = addrs[0]
    if is_loopback(addr) and not local_store:
        assert store_host is not None
        if not _resolves_to_loopback(store_host):
            raise DistNetworkError(
                f"rank {rank} would advertise the loopback address {addr} ({how}) to its "
                f"peers, but the store is on {store_host}, another host: ranks there could "
                f"not connect. Set PYC10D_SOCKET_IFNAME (e.g. eth0, or ^lo,docker) or "
                f"PYC10D_SOCKET_ADDR to an address the other hosts reach"
            )
    return addrs
