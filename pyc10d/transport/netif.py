"""Which IPv4 address a rank advertises to its peers for their TCP connections.

In order:

1. ``PYC10D_SOCKET_ADDR``: that address, as given.
2. ``PYC10D_SOCKET_IFNAME``, else torch's ``GLOO_SOCKET_IFNAME``: the address of the first
   interface the spec selects. NCCL's syntax: ``eth0,ib`` (a comma list of name prefixes,
   tried in order), ``^docker0,lo`` (any interface but those prefixes, non-loopback first),
   ``=eth0`` / ``^=eth0`` (exact names). Gloo opens a device per listed interface; pyc10d
   uses one, the first listed that has an IPv4 address.
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
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import subprocess
from collections.abc import Mapping

from ..errors import DistNetworkError

__all__ = ["advertised_address", "choose_interface", "interface_addresses", "is_loopback"]

_SIOCGIFADDR = 0x8915  # Linux: the interface's primary IPv4 address
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_IFNAME_VARS = ("PYC10D_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def interface_addresses() -> dict[str, str]:
    """``{interface: IPv4 address}`` in interface index order; interfaces without IPv4 left out."""
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
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def _resolves_to_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to here is a loopback one (or it is one)."""
    if is_loopback(host):
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(is_loopback(str(info[4][0])) for info in infos)


def choose_interface(spec: str, addrs: Mapping[str, str]) -> tuple[str, str]:
    """The ``(name, address)`` that an ``*_SOCKET_IFNAME`` spec picks out of ``addrs``."""
    text = spec.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    patterns = [p.strip() for p in text.split(",") if p.strip()]

    def matches(name: str, pattern: str) -> bool:
        return name == pattern if exact else name.startswith(pattern)

    if exclude:
        left = [n for n in addrs if not any(matches(n, p) for p in patterns)]
        left.sort(key=lambda n: is_loopback(addrs[n]))  # stable: index order otherwise
        if left:
            return left[0], addrs[left[0]]
    else:
        for pattern in patterns:
            for name, addr in addrs.items():
                if matches(name, pattern):
                    return name, addr
    have = ", ".join(f"{n}={a}" for n, a in addrs.items()) or "none"
    raise DistNetworkError(f"no network interface with an IPv4 address matches {spec!r} "
                           f"(interfaces: {have})")


def _route_source(store_host: str) -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((store_host, 9))
            return str(probe.getsockname()[0])
    except OSError:
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
    local_store = store_host is None or store_host in _LOOPBACK_NAMES or is_loopback(store_host)
    if env.get("PYC10D_SOCKET_ADDR"):
        addr, how = env["PYC10D_SOCKET_ADDR"], "from PYC10D_SOCKET_ADDR"
    elif var := next((v for v in _IFNAME_VARS if env.get(v, "").strip()), None):
        name, addr = choose_interface(env[var], interface_addresses())
        how = f"interface {name}, from {var}={env[var]}"
    elif shared_file and store_host is None:
        return _own_address()
    elif local_store:
        return "127.0.0.1"
    else:
        assert store_host is not None
        addr = _route_source(store_host) or "127.0.0.1"
        how = f"the route towards {store_host}"
        if is_loopback(addr):
            others = [a for a in interface_addresses().values() if not is_loopback(a)]
            if others:
                return others[0]
    if is_loopback(addr) and not local_store:
        assert store_host is not None
        if not _resolves_to_loopback(store_host):
            raise DistNetworkError(
                f"rank {rank} would advertise the loopback address {addr} ({how}) to its "
                f"peers, but the store is on {store_host}, another host: ranks there could "
                f"not connect. Set PYC10D_SOCKET_IFNAME (e.g. eth0, or ^lo,docker) or "
                f"PYC10D_SOCKET_ADDR to an address the other hosts reach"
            )
    return addr
