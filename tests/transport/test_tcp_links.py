"""TCP links (``transport.tcp.links``): several addresses per rank, large messages striped over
one connection per address pair, reassembled whole and in order; and IPv6 listeners.

On one host: every 127.0.0.0/8 address is loopback on Linux, so ``127.0.0.1,127.0.0.2``
gives each rank two addresses (the striped path, not the bandwidth: see
tests/backends/test_multihost_ipv6.py for two rate-limited links)."""

from __future__ import annotations

import socket
import threading

import pytest
import torch
from test_tcp_transport import CH, close_all, world

from pyc10d.algorithms.comm import byte_view
from pyc10d.store import HashStore
from pyc10d.transport.tcp import TCPTransport
from pyc10d.transport.tcp import links as tcp_links

pytestmark = pytest.mark.timeout(30)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("n, parts", [(0, 2), (1, 2), (100, 3), (1 << 20, 2), ((1 << 20) + 12345, 3)])
def test_stripes_cover_the_message(n: int, parts: int) -> None:
    got = tcp_links.stripes(n, parts)
    assert len(got) == parts and got[0][0] == 0 and got[-1][1] == n
    assert all(a <= b and b == c for (a, b), (c, _) in zip(got, got[1:]))


def _exchange(a: TCPTransport, b: TCPTransport, sizes: list[int]) -> None:
    """``a`` and ``b`` send each other ``sizes`` (float32 counts) on one channel, at once, and
    receive them in order: every message must arrive whole and in its place."""
    outs = {t.rank: [torch.randn(n) for n in sizes] for t in (a, b)}
    ins = {t.rank: [torch.full((n,), -1.0) for n in sizes] for t in (a, b)}
    handles = {t.rank: [t.irecv(1 - t.rank, CH, byte_view(x)) for x in ins[t.rank]] for t in (a, b)}

    def send_all(t: TCPTransport) -> None:
        for i, x in enumerate(outs[t.rank]):
            t.send(1 - t.rank, CH, byte_view(x), i)

    senders = [threading.Thread(target=send_all, args=(t,)) for t in (a, b)]
    for th in senders:
        th.start()
    for th in senders:
        th.join(20)
    for t in (a, b):
        for i, (h, x) in enumerate(zip(handles[t.rank], ins[t.rank])):
            assert h.wait(20) == (4 * sizes[i], i)
            assert torch.equal(x, outs[1 - t.rank][i]), (t.rank, i)


def test_large_messages_are_striped_over_links(monkeypatch) -> None:
    monkeypatch.setenv("PYC10D_SOCKET_ADDR", "127.0.0.1,127.0.0.2")
    monkeypatch.setenv("PYC10D_TCP_SOCKBUF", "65536")  # many partial reads and writes per stripe
    striped = []
    real = tcp_links.recv_stripes
    monkeypatch.setattr("pyc10d.transport.tcp.transport.recv_stripes",
                        lambda socks, view, check: (striped.append(len(view)), real(socks, view, check)))
    a, b = world(2)
    try:
        # Big (striped), small in between (the pair's connection), odd sizes: FIFO per channel.
        sizes = [3_000_001, 5, 300_000, 1 << 20, 0, 2_500_003]
        _exchange(a, b, sizes)
        big = sorted(4 * n for n in sizes if 4 * n >= tcp_links.STRIPE_MIN_BYTES)
        assert sorted(striped) == sorted(big * 2), striped  # both directions
        for t in (a, b):
            [link] = t._links._out[1 - t.rank]
            assert link.getsockname()[0] == "127.0.0.2" and link.getpeername()[0] == "127.0.0.2"
            assert t._links.incoming(1 - t.rank, 2) is not None
    finally:
        close_all(a, b)


def test_one_address_means_no_links(monkeypatch) -> None:
    monkeypatch.setenv("PYC10D_SOCKET_ADDR", "127.0.0.1")
    a, b = world(2)
    try:
        _exchange(a, b, [3_000_001])
        assert a._links._out == {} and not a._links.enabled
    finally:
        close_all(a, b)


def test_an_unreachable_link_falls_back_to_one_connection(monkeypatch, caplog) -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this host: a link from it cannot be dialled.
    store = HashStore()
    monkeypatch.setenv("PYC10D_SOCKET_ADDR", "127.0.0.1,192.0.2.1")
    a, b = world(2, store)
    try:
        _exchange(a, b, [3_000_001])
        assert a._links._out[1] == [] and b._links._out[0] == []
        assert "could not open link 1" in caplog.text
    finally:
        close_all(a, b)


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_addresses_and_links(monkeypatch) -> None:
    """An IPv6 listener (the rank advertises ::1) and an IPv4/IPv6 mix of links: the
    listener is dual-stack."""
    monkeypatch.setenv("PYC10D_SOCKET_ADDR", "::1,127.0.0.1")
    a, b = world(2)
    try:
        _exchange(a, b, [3_000_001, 7])
        assert a.socks[1].family == socket.AF_INET6
        [link] = a._links._out[1]
        assert link.getpeername()[0] in ("127.0.0.1", "::ffff:127.0.0.1")
        assert a._addrs[0].startswith("::1,127.0.0.1:")
    finally:
        close_all(a, b)


def test_a_link_is_registered_before_its_dialer_is_answered() -> None:
    """The dialer stripes its next message as soon as it reads the answer: this rank's
    receiver must find the link by then (answered first, a loaded host read a striped header
    before the link was registered and dropped the peer: "over links it did not open")."""
    links = tcp_links.Links(0, ["127.0.0.1", "127.0.0.2"], None, True, lambda s: None)
    seen: list[object] = []

    class Answering:
        def sendall(self, data: bytes) -> None:
            seen.append(links.incoming(1, 2))

        def close(self) -> None:
            pass

    sock = Answering()
    links.admit(1, 1, sock)  # type: ignore[arg-type]
    assert seen == [[sock]]
