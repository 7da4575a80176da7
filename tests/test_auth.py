"""``PYC10D_AUTH_TOKEN``: with it set, the store and the tcp transport admit only peers that
hold the same token; the ranks that do run their collectives as usual.

In one process a TCPStore server and a TCPTransport read the token when they are created, a
client when it connects, so a test sets the variable, builds the server, then changes it for
the client it wants to play.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch
from _multirank import run_ranks

import pyc10d as dist
from pyc10d import auth
from pyc10d.errors import DistNetworkError
from pyc10d.store import HashStore, PrefixStore, TCPStore
from pyc10d.transport.tcp import TCPTransport
from pyc10d.transport.tcp.listener import HELLO

TOKEN = "correct horse battery staple"
#: The timeout of a client that is refused: it must fail well before it (a third of it), which a
#: machine 3x slower than the 2-core VM (refusals in well under a second there) stays far under.
REFUSED_TIMEOUT_S = 30


class Warnings(logging.Handler):
    """Collects the ``pyc10d`` logger's warnings; ``wait_for`` blocks until enough came (a
    server thread logs when it is done with a connection, which may be a moment later)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self._cond = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._cond:
            self.messages.append(record.getMessage())
            self._cond.notify_all()

    def wait_for(self, words: str, count: int, timeout: float = 10.0) -> list[str]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.matching(words)) >= count, timeout)
            return self.matching(words)

    def matching(self, words: str) -> list[str]:
        return [m for m in self.messages if words in m]


@pytest.fixture
def warnings():
    handler = Warnings()
    logger = logging.getLogger("pyc10d")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.WARNING)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_handshake_both_ways() -> None:
    """The handshake on a socket pair: same token passes, another fails on both ends."""
    for client_secret, ok in ((b"k", True), (b"other", False)):
        a, b = socket.socketpair()
        a.settimeout(5)
        b.settimeout(5)
        errors: list[BaseException] = []

        def serve(sock: socket.socket = b, errors: list[BaseException] = errors) -> None:
            try:
                auth.server_handshake(sock, b"k")
            except auth.AuthError as e:
                errors.append(e)

        t = threading.Thread(target=serve)
        t.start()
        try:
            if ok:
                auth.client_handshake(a, client_secret)
            else:
                with pytest.raises(auth.AuthError, match="PYC10D_AUTH_TOKEN differs"):
                    auth.client_handshake(a, client_secret)
        finally:
            a.close()
            t.join(5)
            b.close()
        assert (not errors) if ok else ("before proving its token" in str(errors[0]))


@pytest.mark.timeout(30)
def test_store_refuses_clients_without_the_token(monkeypatch, warnings) -> None:
    monkeypatch.setenv(auth.ENV, TOKEN)
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=10))
    good = TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=10))
    good.set("k", "v")
    assert master.get("k") == b"v" and good.add("n", 2) == 2
    monkeypatch.setenv(auth.ENV, "a wrong token")
    start = time.monotonic()
    with pytest.raises(DistNetworkError, match="authentication .*failed.*differs"):
        TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=REFUSED_TIMEOUT_S))
    monkeypatch.delenv(auth.ENV)
    # A client without any token speaks the plain protocol and is told so in it.
    with pytest.raises(DistNetworkError, match="authentication failed.*requires PYC10D_AUTH_TOKEN"):
        TCPStore("127.0.0.1", master.port, world_size=2, timeout=timedelta(seconds=REFUSED_TIMEOUT_S))
    # A raw request gets the same answer and never reaches the data.
    with socket.create_connection(("127.0.0.1", master.port), timeout=5) as s:
        s.sendall(b"\x07\x00\x00\x00\x01\x00\x00\x00\x02/k")  # delete_key("k")
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert b"requires PYC10D_AUTH_TOKEN" in reply
    # One that ignores the server's proof and guesses its own is cut off before its request.
    with socket.create_connection(("127.0.0.1", master.port), timeout=5) as s:
        s.sendall(auth.MAGIC + os.urandom(32))
        assert len(s.recv(72, socket.MSG_WAITALL)) == 72
        s.sendall(os.urandom(32) + b"\x01\x00\x00\x00\x02\x00\x00\x00\x02/k\x00\x00\x00\x03bad")
        try:
            assert s.recv(1) == b""
        except ConnectionResetError:
            pass  # closed with the request unread
    assert time.monotonic() - start < REFUSED_TIMEOUT_S / 3  # refused at once, not after a timeout
    good.set("k2", "v2")  # and the good client never noticed
    assert master.get("k") == b"v" and master.get("k2") == b"v2" and good.add("n", 1) == 3
    refused = warnings.wait_for("refused the connection from", 4)
    assert len(refused) == 4, refused
    assert sum("a different PYC10D_AUTH_TOKEN" in m for m in refused) == 1, refused
    assert sum("proof does not match" in m for m in refused) == 1, refused
    assert sum("did not authenticate" in m for m in refused) == 2, refused


@pytest.mark.timeout(30)
def test_client_with_token_fails_fast_on_a_server_without_one(monkeypatch) -> None:
    monkeypatch.delenv(auth.ENV, raising=False)
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=10))
    monkeypatch.setenv(auth.ENV, TOKEN)
    start = time.monotonic()
    with pytest.raises(DistNetworkError, match="authentication .*failed.*does it have"):
        TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=REFUSED_TIMEOUT_S))
    assert time.monotonic() - start < REFUSED_TIMEOUT_S / 3  # at once, not after its timeout


@pytest.mark.timeout(30)
def test_transport_listener_refuses_peers_without_the_token(monkeypatch, warnings) -> None:
    """Even a connection that knows the nonce is refused unless it authenticates first, and
    one with a wrong token learns that it failed; the real peer then connects as usual."""
    monkeypatch.setenv(auth.ENV, TOKEN)
    store = PrefixStore("t", HashStore())
    out: dict = {}

    def make(rank: int) -> None:
        try:
            out[rank] = TCPTransport(store, rank, 2, timedelta(seconds=20))
        except BaseException as e:  # noqa: BLE001 - checked below
            out[rank] = e

    t0 = threading.Thread(target=make, args=(0,))
    t0.start()
    store.wait(["tcp_addr/0"], timedelta(seconds=10))
    host, port, nonce = store.get("tcp_addr/0").decode().rsplit(":", 2)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(HELLO.pack(1, int(nonce)))  # a plain hello, right nonce, no token
        try:
            assert s.recv(1) == b""
        except ConnectionResetError:
            pass  # closed with most of the hello unread: the kernel resets the connection
    with socket.create_connection((host, int(port)), timeout=5) as s:
        with pytest.raises(auth.AuthError, match="differs"):
            auth.client_handshake(s, b"a wrong token")
    # Both refusals are logged while setup is still on (connections still being vetted when
    # the last real peer arrives are closed quietly).
    refused = warnings.wait_for("authentication failed", 2)
    assert len(refused) == 2, refused
    assert "did not authenticate" in refused[0] and "a different PYC10D_AUTH_TOKEN" in refused[1]
    t1 = threading.Thread(target=make, args=(1,))
    t1.start()
    t1.join(15)
    t0.join(15)
    assert isinstance(out[0], TCPTransport) and isinstance(out[1], TCPTransport), out
    a, b = out[0], out[1]
    try:
        for src, dst in ((a, b), (b, a)):
            buf = bytearray(5)
            h = dst.irecv(src.rank, 1, memoryview(buf))
            src.send(dst.rank, 1, memoryview(b"hello"))
            assert h.wait(10) == (5, 0) and buf == b"hello"
    finally:
        closer = threading.Thread(target=a.close)
        closer.start()
        b.close()
        closer.join(5)
    assert len(warnings.matching("refused")) == 2, warnings.messages


def _collectives_with_intruders(rank: int, ws: int, port: int, backend: str) -> list[float]:
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ws, timeout=timedelta(seconds=20))
    if backend == "tcp":  # the peer connections were set up with the handshake
        assert dist.group.WORLD.transport._secret == TOKEN.encode()
    t = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(t)
    if rank == 0:
        # Intruders on the store port: a wrong token, then none. Both refused, none got in.
        os.environ[auth.ENV] = "not the token"
        try:
            TCPStore("127.0.0.1", port, timeout=timedelta(seconds=5))
            raise AssertionError("a client with a wrong token was let in")
        except auth.AuthError as e:
            assert "authentication" in str(e) and "failed" in str(e), e
        del os.environ[auth.ENV]
        try:
            TCPStore("127.0.0.1", port, world_size=ws, timeout=timedelta(seconds=5))
            raise AssertionError("a client without a token was let in")
        except auth.AuthError as e:
            assert "requires PYC10D_AUTH_TOKEN" in str(e), e
        os.environ[auth.ENV] = TOKEN
    dist.barrier()
    gathered = [torch.zeros(1) for _ in range(ws)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    b = torch.tensor([7.0 if rank == ws - 1 else 0.0])
    dist.broadcast(b, src=ws - 1)
    return t.tolist() + [g.item() for g in gathered] + b.tolist()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend, ws", [("tcp", 3), ("shm", 2)])
def test_process_group_with_token(monkeypatch, backend: str, ws: int) -> None:
    """Ranks forked with the token in their environment rendezvous over an authenticated
    TCPStore (and, on tcp, authenticated peer connections) and run collectives, while rank 0
    turns away intruders on the store port."""
    monkeypatch.setenv(auth.ENV, TOKEN)
    res = run_ranks("unused", ws, _collectives_with_intruders, free_port(), backend,
                    init=False, timeout=45)
    total = sum(range(ws))
    expected = [float(ws * i + total) for i in range(4)]
    for r in res:
        assert r == expected + [float(i) for i in range(ws)] + [7.0]
