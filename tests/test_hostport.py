"""``host:port`` strings with IPv6 hosts (``pyc10d.hostport``)."""

from __future__ import annotations

import socket

import pytest

from pyc10d.hostport import family_of, format_hostport, split_hostport, unbracket


@pytest.mark.parametrize("host, port, text", [
    ("10.0.0.1", 29500, "10.0.0.1:29500"), ("node7", 1, "node7:1"),
    ("fd00:213::1", 29500, "[fd00:213::1]:29500"), ("[::1]", 5, "[::1]:5"),
])
def test_format_then_split_round_trips(host: str, port: int, text: str) -> None:
    assert format_hostport(host, port) == text
    assert split_hostport(text) == (unbracket(host), port)


@pytest.mark.parametrize("text, want", [
    ("::1", ("::1", 7)), ("fd00::1", ("fd00::1", 7)), ("[fd00::1]", ("fd00::1", 7)),
    ("node", ("node", 7)), ("fd00:213::1:29500", ("fd00:213::1", 29500)),  # as f"{host}:{port}" wrote it
])
def test_split_defaults_and_bare_ipv6(text: str, want: tuple[str, int]) -> None:
    assert split_hostport(text, 7) == want


@pytest.mark.parametrize("text", ["[::1", "[::1]x", ":80", "h:0", "h:99999", "h:x", "h"])
def test_split_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="bad address"):
        split_hostport(text)


def test_family_of() -> None:
    assert family_of("fd00::1") == family_of("[::1]") == family_of("fe80::1%eth0") == socket.AF_INET6
    assert family_of("10.0.0.1") == family_of("node") == socket.AF_INET
