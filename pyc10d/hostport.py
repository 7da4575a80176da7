"""``host:port`` strings that hold IPv6 literals too: ``[fd00::1]:29500``.

An IPv6 address has colons of its own, so wherever pyc10d writes a host and a port together
(an error message, ``--store`` for ``pyc10d.status``, a log line) it brackets an IPv6 host, as
URLs do (RFC 3986), and reads both spellings back. Hosts handed to the socket layer are never
bracketed: ``unbracket`` takes the brackets off a ``MASTER_ADDR=[fd00::1]`` (torch wants the
bare literal; pyc10d accepts both).

A leaf module, like ``auth``, ``tls`` and ``keepalive``: the store and the transport use it.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["family_of", "format_hostport", "split_hostport", "unbracket"]


def unbracket(host: str) -> str:
    """``"[fd00::1]"`` -> ``"fd00::1"``; anything else unchanged."""
    text = host.strip()
    return text[1:-1] if text.startswith("[") and text.endswith("]") else text


def format_hostport(host: str, port: int | str) -> str:
    """``host:port``, with an IPv6 host (anything with a colon) in brackets."""
    host = unbracket(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_hostport(text: str, default_port: int | None = None) -> tuple[str, int]:
    """``"host:port"``, ``"[v6]:port"``, a bare IPv6 literal's last group taken as the port
    when it cannot be part of the address (``"fd00::1:29500"`` is read as written by
    ``f"{host}:{port}"``), or a bare host with ``default_port``. ``ValueError`` otherwise."""
    s = text.strip()
    if s.startswith("["):
        host, sep, rest = s[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad address {text!r}: use host:port or [v6addr]:port")
        port_text = rest[1:]
    elif s.count(":") == 1:
        host, port_text = s.split(":")
    elif ":" in s:  # unbracketed IPv6: ``addr:port`` when the part before the last colon parses
        head, _, tail = s.rpartition(":")
        if _is_ipv6(s) and not _is_ipv6(head):
            host, port_text = s, ""
        else:
            host, port_text = head, tail
    else:
        host, port_text = s, ""
    if not host:
        raise ValueError(f"bad address {text!r}: no host")
    if not port_text:
        if default_port is None:
            raise ValueError(f"bad address {text!r}: no port")
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad address {text!r}: port {port_text!r} is not 1-65535")
    return host, int(port_text)


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def family_of(host: str) -> socket.AddressFamily:
    """``AF_INET6`` for an IPv6 literal (bracketed or not), ``AF_INET`` otherwise."""
    return socket.AF_INET6 if _is_ipv6(unbracket(host).split("%", 1)[0]) else socket.AF_INET
