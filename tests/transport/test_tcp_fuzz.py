"""The tcp transport under garbage: connections to a rank's listener that are not its peers,
and peers that send frames no rank sends. Only the offending connection is closed (with a
logged reason); the real ranks connect on time and keep exchanging messages.

``PYC10D_FUZZ_FRAMES`` scales the runs and ``PYC10D_FUZZ_HANDSHAKES`` sets the garbage
connections at the listener (``make fuzz``: 100,000 of them); ``make test`` runs short ones.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from datetime import timedelta

import pytest

from pyc10d import settings
from pyc10d.errors import DistNetworkError
from pyc10d.store import HashStore, PrefixStore, Store
from pyc10d.transport import framed
from pyc10d.transport.tcp.listener import ACCEPTED, HELLO, HELLO_TIMEOUT_S
from pyc10d.transport.tcp.transport import _HEADER, TCPTransport


@pytest.fixture(autouse=True)
def _no_auth_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests speak the unauthenticated wire (tests/test_auth.py covers the token)."""
    monkeypatch.delenv("PYC10D_AUTH_TOKEN", raising=False)


FRAMES = settings.FUZZ_FRAMES.get()
HANDSHAKES = settings.FUZZ_HANDSHAKES.get(max(FRAMES // 10, 200))
CH = (5 << 32) | 1


def start_rank(store: Store, rank: int, size: int, out: dict) -> threading.Thread:
    """Build rank ``rank``'s transport on a thread (construction blocks until its peers come)."""

    def make() -> None:
        try:
            out[rank] = TCPTransport(store, rank, size, timedelta(seconds=20))
        except BaseException as e:  # noqa: BLE001 - checked by the test
            out[rank] = e

    t = threading.Thread(target=make, name=f"rank{rank}")
    t.start()
    return t


def address(store: Store, rank: int) -> tuple[str, int, int]:
    store.wait([f"tcp_addr/{rank}"], timedelta(seconds=10))
    host, port, nonce = store.get(f"tcp_addr/{rank}").decode().rsplit(":", 2)
    return host, int(port), int(nonce)


def exchange(a: TCPTransport, b: TCPTransport, payload: bytes) -> None:
    """``a`` sends ``payload`` to ``b`` and back; both arrive whole."""
    for src, dst in ((a, b), (b, a)):
        buf = bytearray(len(payload))
        h = dst.irecv(src.rank, CH, memoryview(buf))
        src.send(dst.rank, CH, memoryview(payload))
        assert h.wait(10) == (len(payload), 0)
        assert bytes(buf) == payload


def close_all(*transports: TCPTransport) -> None:
    """Close together: each close waits (up to 1 s) for its peers' goodbyes."""
    threads = [threading.Thread(target=t.close) for t in transports]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)


def garbage_hello(rng: random.Random, nonce: int, size: int) -> tuple[str, bytes]:
    kind = rng.choice(["random", "wrong_nonce", "bad_rank", "own_rank", "half", "long"])
    if kind == "random":
        return kind, rng.randbytes(rng.randrange(1, 40))
    if kind == "wrong_nonce":
        return kind, HELLO.pack(1, nonce ^ rng.randrange(1, 1 << 40))
    if kind == "bad_rank":
        return kind, HELLO.pack(rng.randrange(size, 1 << 32), nonce)
    if kind == "own_rank":
        return kind, HELLO.pack(0, nonce)
    if kind == "half":
        return kind, HELLO.pack(1, nonce)[: rng.randrange(1, HELLO.size)]
    return kind, rng.randbytes(rng.randrange(64, 4096))  # far more than a hello


def send_garbage(host: str, port: int, nonce: int, n: int, rng: random.Random,
                 kinds: dict[str, int]) -> None:
    for _ in range(n):
        kind, data = garbage_hello(rng, nonce, 2)
        kinds[kind] = kinds.get(kind, 0) + 1
        with socket.create_connection((host, port), timeout=5) as s:
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(10)
                assert s.recv(1) == b""  # refused: closed without a word
            except OSError:
                pass  # reset already: it closed with some of our bytes unread


@pytest.mark.timeout(300 if HANDSHAKES > 2000 else 40)
def test_garbage_at_the_listener(caplog) -> None:
    """Garbage and silent connections reach rank 0's listener before its real peer does and
    while the two are connected (the listener is up for the transport's lifetime: connections
    open on first use); the real peer still connects at once and the two exchange messages."""
    rng = random.Random(11)
    store = PrefixStore("t", HashStore())
    out: dict = {}
    t0 = start_rank(store, 0, 2, out)
    host, port, nonce = address(store, 0)
    silent = [socket.create_connection((host, port), timeout=5) for _ in range(16)]
    n = HANDSHAKES
    kinds: dict[str, int] = {}
    with caplog.at_level(logging.WARNING, logger="pyc10d"):
        send_garbage(host, port, nonce, n // 2, rng, kinds)
        start = time.monotonic()
        t1 = start_rank(store, 1, 2, out)
        t1.join(15)
        t0.join(15)
        a, b = out[0], out[1]
        assert isinstance(a, TCPTransport) and isinstance(b, TCPTransport), out
        try:
            exchange(a, b, b"first")  # rank 1 dials rank 0 through the crowd
            setup_s = time.monotonic() - start
            send_garbage(host, port, nonce, n - n // 2, rng, kinds)
            # (a long run outlasts the hello timeout: the silent ones are refused as well)
            silent_refused = caplog.text.count("it sent no hello in time")
            refused = caplog.text.count("refused the connection from") - silent_refused
            print(f"\ntcp listener fuzz: {n} garbage connections ({kinds}) and {len(silent)} "
                  f"silent ones; {refused} refusals logged; the real peer connected and "
                  f"exchanged its first message in {setup_s:.2f}s")
            # Silent connections are still being vetted: they must not have held the peer up.
            assert setup_s < HELLO_TIMEOUT_S / 2
            assert refused == n and silent_refused <= len(silent)
            for size in (0, 1, 100_000):
                exchange(a, b, rng.randbytes(size))
        finally:
            for s in silent:
                s.close()
            close_all(a, b)
    # The listener is gone once the transport is closed: nothing more to attack.
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2).close()


class FakePeer:
    """A highest rank made of raw sockets: it joins, dials every real rank (which accepts the
    connection), then misbehaves."""

    def __init__(self, store: Store, rank: int, real: int, size: int) -> None:
        store.set(f"tcp_addr/{rank}", "127.0.0.1:9:0")  # never dialled: it dials the real ranks
        if store.add("tcp_joined", 1) == size:
            store.set("tcp_all/0", b"1")
        self.socks = []
        for peer in range(real):
            host, port, nonce = address(store, peer)
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(HELLO.pack(rank, nonce))
            assert s.recv(1) == ACCEPTED
            self.socks.append(s)

    def close(self) -> None:
        for s in self.socks:
            s.close()


def bad_frame(rng: random.Random, limit: int) -> tuple[str, bytes, str]:
    """A frame a rank never sends, and the words the receiver's error must contain."""
    kind = rng.choice(["kind", "huge", "control", "random", "cut"])
    channel = rng.randrange(1 << 64)
    if kind == "kind":
        k = rng.randrange(3, 1 << 32)
        return kind, _HEADER.pack(channel, 8, 0, k), f"unknown kind {k}"
    if kind == "huge":
        n = rng.randrange(limit + 1, 1 << 64)
        return kind, _HEADER.pack(channel, n, 0, framed.KIND_DATA), f"message of {n} bytes"
    if kind == "control":
        n = rng.randrange(framed.MAX_CONTROL_BYTES + 1, 1 << 64)
        k = rng.choice([framed.KIND_ABORT, framed.KIND_BYE])
        return kind, _HEADER.pack(channel, n, 0, k), f"control frame of {n} bytes"
    if kind == "random":
        data = rng.randbytes(_HEADER.size)
        channel, n, meta, k = _HEADER.unpack(data)
        if k not in (0, 1, 2):
            return kind, data, f"unknown kind {k}"
        data = _HEADER.pack(channel, n, meta, 9)
        return kind, data, "unknown kind 9"
    # A data frame cut short: the peer is lost (closed its connection), as when a rank dies.
    return kind, _HEADER.pack(CH, 1000, 0, framed.KIND_DATA) + b"x" * 10, "closed its connection"


@pytest.mark.timeout(300 if FRAMES > 20000 else 40)
def test_bad_frames_from_a_peer_drop_only_that_peer(monkeypatch, caplog) -> None:
    """Ranks 0 and 1 are real; the others send one good message and then a bad frame each.
    Each bad sender is dropped with its reason; 0 and 1 keep talking throughout."""
    limit = 1 << 20
    monkeypatch.setenv("PYC10D_MAX_MESSAGE_BYTES", str(limit))
    rng = random.Random(5)
    rounds = max(FRAMES // 1000, 2)
    fakes_per_round = 12
    seen = 0
    for _ in range(rounds):
        size = 2 + fakes_per_round
        store = PrefixStore("t", HashStore())
        out: dict = {}
        threads = [start_rank(store, r, size, out) for r in (0, 1)]
        fakes = [FakePeer(store, r, 2, size) for r in range(2, size)]
        for t in threads:
            t.join(15)
        a, b = out[0], out[1]
        assert isinstance(a, TCPTransport) and isinstance(b, TCPTransport), out
        try:
            with caplog.at_level(logging.WARNING, logger="pyc10d"):
                expected = []
                for i, fake in enumerate(fakes):
                    rank = i + 2
                    kind, data, words = bad_frame(rng, limit)
                    good = _HEADER.pack(CH, 4, 7, framed.KIND_DATA) + b"good"
                    fake.socks[0].sendall(good + data)
                    if kind == "cut":
                        fake.socks[0].shutdown(socket.SHUT_WR)
                    expected.append((rank, kind, words))
                    exchange(a, b, rng.randbytes(rng.randrange(0, 5000)))
                for rank, kind, words in expected:
                    buf = bytearray(4)
                    assert a.irecv(rank, CH, memoryview(buf)).wait(10) == (4, 7)
                    assert bytes(buf) == b"good"
                    with pytest.raises(DistNetworkError, match=words):
                        a.irecv(rank, CH, memoryview(bytearray(4))).wait(10)
                    if kind != "cut":
                        assert f"rank 0 dropped its connection to rank {rank}" in caplog.text
                    assert not a.is_alive(rank)
                    seen += 1
                # Rank 1 heard nothing bad from the fakes: they are still its peers.
                assert all(b.is_alive(r) for r in range(2, size))
                exchange(a, b, b"still fine")
        finally:
            for fake in fakes:
                fake.close()
            close_all(a, b)
    print(f"\ntcp frame fuzz: {seen} bad frames from {seen} fake peers over {rounds} worlds; "
          f"ranks 0 and 1 exchanged messages throughout")
