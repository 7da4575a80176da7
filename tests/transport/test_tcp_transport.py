"""TCPTransport: whole messages in both orders, and the socket-buffer policy."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
import torch

from pyc10d.algorithms.comm import byte_view
from pyc10d.errors import DistNetworkError
from pyc10d.store import HashStore, PrefixStore
from pyc10d.transport import cpus, framed
from pyc10d.transport.tcp import TCPTransport
from pyc10d.transport.tcp import connect as tcp
from pyc10d.transport.tcp.connect import sockbuf_bytes

pytestmark = pytest.mark.timeout(30)

CH = (3 << 32) | 9


def world(size: int, store: HashStore | None = None, timeout_s: float = 10) -> list[TCPTransport]:
    """``size`` transports in threads of this process (construction blocks until all publish)."""
    store = store if store is not None else HashStore()
    out: list[TCPTransport | None] = [None] * size
    errors: list[BaseException] = []

    def make(r: int) -> None:
        try:
            out[r] = TCPTransport(PrefixStore("t", store), r, size, timedelta(seconds=timeout_s))
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
        close_all(a, b)


def test_sockbuf_policy(monkeypatch) -> None:
    monkeypatch.delenv("PYC10D_TCP_SOCKBUF", raising=False)
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 2)
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
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ts = world(3)
    try:
        ring(ts)
        checked = 0
        for t in ts:
            for peer, sock in enumerate(t.socks):
                if sock is None:
                    continue
                # Linux reports twice the requested size (it books its own overhead).
                got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                assert tcp._OVERSUBSCRIBED_SOCKBUF <= got <= 2 * tcp._OVERSUBSCRIBED_SOCKBUF, (t.rank, peer)
                checked += 1
        assert checked == 6
    finally:
        close_all(*ts)


def ring(ts: list[TCPTransport], payload: bytes = b"ring") -> None:
    """Each rank sends to its right and receives from its left, all at once."""
    n = len(ts)
    bufs = [bytearray(len(payload)) for _ in ts]
    handles = [t.irecv((t.rank - 1) % n, CH, memoryview(bufs[t.rank])) for t in ts]
    senders = [threading.Thread(target=t.send, args=((t.rank + 1) % n, CH, memoryview(payload)))
               for t in ts]
    for th in senders:
        th.start()
    for th in senders:
        th.join(20)
    for h in handles:
        assert h.wait(20) == (len(payload), 0)
    assert all(bytes(b) == payload for b in bufs)


def connections(t: TCPTransport) -> list[int]:
    return [p for p, s in enumerate(t.socks) if s is not None]


def test_connections_open_on_first_use() -> None:
    """Construction connects nothing; a ring opens two connections per rank, not size - 1."""
    ts = world(5)
    try:
        assert all(connections(t) == [] for t in ts)
        ring(ts)
        for t in ts:
            assert connections(t) == sorted({(t.rank - 1) % 5, (t.rank + 1) % 5}), t.rank
        ring(ts, b"again")  # no new connection
        assert all(len(connections(t)) == 2 for t in ts)
    finally:
        close_all(*ts)


@pytest.mark.parametrize("trial", range(10))
def test_simultaneous_dials_leave_one_connection(trial: int) -> None:
    """Both ranks of a pair receive from and send to each other at once, so each dials the
    other: one connection survives (the higher rank's), on both sides, and nothing is lost."""
    a, b = world(2)
    try:
        got = [bytearray(3), bytearray(3)]
        ha = a.irecv(1, CH, memoryview(got[0]))  # both dial in the background...
        hb = b.irecv(0, CH, memoryview(got[1]))
        ts = [threading.Thread(target=a.send, args=(1, CH, memoryview(b"a>b"))),
              threading.Thread(target=b.send, args=(0, CH, memoryview(b"b>a")))]
        for th in ts:
            th.start()
        for th in ts:
            th.join(20)
        assert ha.wait(10) == (3, 0) and hb.wait(10) == (3, 0)
        assert got == [bytearray(b"b>a"), bytearray(b"a>b")]
        sa, sb = a.socks[1], b.socks[0]
        assert sa is not None and sb is not None
        assert sa.getsockname() == sb.getpeername() and sa.getpeername() == sb.getsockname()
    finally:
        close_all(a, b)


def close_all(*ts: TCPTransport) -> None:
    """Close every transport at once, as the ranks of a world do. One after the other, each
    close would wait out its 1 s for the goodbyes of peers not closed yet."""
    threads = [threading.Thread(target=t.close) for t in ts]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)


def test_a_peer_gone_before_any_connection_is_named() -> None:
    """Rank 2 leaves before anyone connected to it: a receive from it fails at once (its
    listener refuses), naming it, rather than waiting out the timeout; sends fail the same."""
    timeout_s = 30
    ts = world(3, timeout_s=timeout_s)
    try:
        ts[2].close()
        start = time.monotonic()
        h = ts[0].irecv(2, CH, memoryview(bytearray(4)))
        with pytest.raises(DistNetworkError, match="rank 2 .*refused"):
            h.wait(timeout_s)
        with pytest.raises(DistNetworkError, match="rank 2"):
            ts[1].send(2, CH, memoryview(b"lost"))
        # at once, not at the timeout: a third of it, far above a 3x slower machine's time
        assert time.monotonic() - start < timeout_s / 3
        assert not ts[0].is_alive(2) and ts[0].is_alive(1)
        ring_pair = ts[:2]
        exchange = bytearray(2)
        h = ring_pair[1].irecv(0, CH, memoryview(exchange))
        ring_pair[0].send(1, CH, memoryview(b"ok"))
        assert h.wait(10) == (2, 0) and exchange == b"ok"
    finally:
        close_all(*ts)


def test_a_peer_that_dies_during_the_first_dial_is_named() -> None:
    """Rank 1 never connects; rank 0's receive dials it to see whether it lives, and rank 1
    dies in the middle of that dial (here: its listener takes the connection, then closes it
    and itself without answering the hello). The receive fails naming rank 1 within seconds
    instead of waiting out the timeout (the probe gave up after one failed dial before)."""
    store = PrefixStore("t", HashStore())
    listener = socket.create_server(("127.0.0.1", 0))
    store.set("tcp_addr/1", f"127.0.0.1:{listener.getsockname()[1]}:1")
    store.add("tcp_joined", 1)  # rank 1 joined: rank 0's join completes the world
    timeout_s = 30
    t = TCPTransport(store, 0, 2, timedelta(seconds=timeout_s))
    try:
        start = time.monotonic()
        h = t.irecv(1, CH, memoryview(bytearray(4)))
        conn, _ = listener.accept()  # the probe's dial
        conn.recv(64)
        listener.close()  # rank 1 dies: no listener, and the dial it took is closed unanswered
        conn.close()
        with pytest.raises(DistNetworkError, match="rank 1"):
            h.wait(timeout_s)
        # within seconds, not at the timeout: a third of it, far above a 3x slower machine's time
        assert time.monotonic() - start < timeout_s / 3
        assert not t.is_alive(1)
    finally:
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
        close_all(a, b)


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
        close_all(a, b)


def test_a_refused_dial_from_the_higher_rank_is_not_silent() -> None:
    """The higher rank uses its dial before hearing the answer (its dial wins every race);
    when the peer refuses it after all (here: it dropped this rank earlier), the dialler
    learns it from the answer and the peer is lost, not silently unreachable."""
    a, b = world(2)
    try:
        a.mailbox.peer_lost(1, DistNetworkError("rank 1 sent garbage earlier"))
        b.send(0, CH, memoryview(b"lost"))  # goes out before the answer comes back
        h = b.irecv(0, CH, memoryview(bytearray(4)))
        with pytest.raises(DistNetworkError, match="rank 0 .*did not take rank 1's connection"):
            h.wait(10)
        assert not b.is_alive(0)
    finally:
        close_all(a, b)


def test_a_later_world_on_the_same_store_uses_fresh_addresses() -> None:
    """Destroy and init again over one store (same key prefix): the join of the second round
    must wait for the second round's addresses, not pass on the first round's keys."""
    store = HashStore()
    for round_ in range(3):
        ts = world(3, store)
        try:
            ring(ts, f"round {round_}".encode())
        finally:
            close_all(*ts)
