"""TCPTransport: whole messages in both orders, and the socket-buffer policy."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
import torch

from pyc10d.algorithms.comm import byte_view
from pyc10d.store import HashStore, PrefixStore
from pyc10d.transport import framed, tcp
from pyc10d.transport.tcp import TCPTransport, sockbuf_bytes

pytestmark = pytest.mark.timeout(30)

CH = (3 << 32) | 9


def world(size: int) -> list[TCPTransport]:
    """``size`` transports in threads of this process (construction blocks until all connect)."""
    store = HashStore()
    out: list[TCPTransport | None] = [None] * size
    errors: list[BaseException] = []

    def make(r: int) -> None:
        try:
            out[r] = TCPTransport(PrefixStore("t", store), r, size, timedelta(seconds=10))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors, errors
    return [t for t in out if t is not None]


@pytest.mark.parametrize("numel", [0, 5, 3_000_001])  # 12 MB: many times any socket buffer
@pytest.mark.parametrize("posted_first", [True, False])
def test_message_arrives_whole(numel: int, posted_first: bool, monkeypatch) -> None:
    # A small fixed buffer forces the payload through many partial socket reads.
    monkeypatch.setenv("PYC10D_TCP_SOCKBUF", "65536")
    a, b = world(2)
    try:
        src = torch.randn(numel)
        dst = torch.full((numel,), -1.0)
        h = b.irecv(0, CH, byte_view(dst)) if posted_first else None
        sender = threading.Thread(target=a.send, args=(1, CH, byte_view(src), 11))
        sender.start()
        if h is None:
            h = b.irecv(0, CH, byte_view(dst))
        assert h.wait(20) == (4 * numel, 11)
        sender.join(20)
        assert torch.equal(dst, src)
    finally:
        a.close()
        b.close()


def test_sockbuf_policy(monkeypatch) -> None:
    monkeypatch.delenv("PYC10D_TCP_SOCKBUF", raising=False)
    monkeypatch.setattr(tcp, "_usable_cpus", lambda: 2)
    # More ranks than CPUs on this host: fixed buffers for same-host peers only.
    assert sockbuf_bytes(local=True, ranks_on_host=4) == tcp._OVERSUBSCRIBED_SOCKBUF
    assert sockbuf_bytes(local=False, ranks_on_host=4) == 0
    # A core per rank: autotuning.
    assert sockbuf_bytes(local=True, ranks_on_host=2) == 0
    # The variable overrides the policy either way.
    monkeypatch.setenv("PYC10D_TCP_SOCKBUF", "0")
    assert sockbuf_bytes(local=True, ranks_on_host=4) == 0
    monkeypatch.setenv("PYC10D_TCP_SOCKBUF", "1048576")
    assert sockbuf_bytes(local=False, ranks_on_host=1) == 1048576


def test_oversubscribed_host_gets_fixed_buffers(monkeypatch) -> None:
    monkeypatch.delenv("PYC10D_TCP_SOCKBUF", raising=False)
    monkeypatch.setattr(tcp, "_usable_cpus", lambda: 1)
    ts = world(3)
    try:
        for t in ts:
            for peer, sock in enumerate(t._socks):
                if sock is None:
                    continue
                # Linux reports twice the requested size (it books its own overhead).
                got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                assert tcp._OVERSUBSCRIBED_SOCKBUF <= got <= 2 * tcp._OVERSUBSCRIBED_SOCKBUF, (t.rank, peer)
    finally:
        for t in ts:
            t.close()


def test_large_message_waits_briefly_for_its_receive(monkeypatch) -> None:
    """Posted within the pump's grace period: read straight into place, no holding buffer."""
    a, b = world(2)
    try:
        held = []
        real = b.mailbox.pool.acquire
        monkeypatch.setattr(b.mailbox.pool, "acquire", lambda n: held.append(n) or real(n))
        monkeypatch.setattr(framed, "WAIT_FOR_POST", 5.0)
        src = torch.randn(1 << 20)
        dst = torch.empty_like(src)
        # (from a thread: the payload is larger than the socket buffers, so the send
        # finishes only once the pump reads it)
        sender = threading.Thread(target=a.send, args=(1, CH, byte_view(src)))
        sender.start()
        time.sleep(0.2)  # the header is in; the pump holds the payload for our receive
        h = b.irecv(0, CH, byte_view(dst))
        h.wait(10)
        sender.join(10)
        assert torch.equal(dst, src) and held == []
    finally:
        a.close()
        b.close()


def test_receives_posted_out_of_stream_order_complete() -> None:
    """The receiver wants the second message first: the held first one must not block it."""
    a, b = world(2)
    try:
        first, second = torch.randn(1 << 20), torch.randn(5)

        def send_both() -> None:
            a.send(1, CH, byte_view(first))
            a.send(1, CH + 1, byte_view(second))

        sender = threading.Thread(target=send_both)
        sender.start()
        got2 = torch.empty(5)
        b.irecv(0, CH + 1, byte_view(got2)).wait(10)
        got1 = torch.empty(1 << 20)
        b.irecv(0, CH, byte_view(got1)).wait(10)
        sender.join(10)
        assert torch.equal(got1, first) and torch.equal(got2, second)
    finally:
        a.close()
        b.close()
