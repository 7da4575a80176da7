"""The TCPStore server's event loop: many clients on one thread, parked waits answered by the
key or by their deadline, requests of one connection answered in order, frames that come a
byte at a time, and a server-side timeout among many parked waits."""

from __future__ import annotations

import socket
import struct
import threading
from datetime import timedelta

import pytest

from pyc10d import auth
from pyc10d.store import TCPStore, wire
from pyc10d.store.base import StoreTimeoutError

HEAD, LEN = struct.Struct("!BI"), struct.Struct("!I")


def frame(code: int, parts: list[bytes]) -> bytes:
    return HEAD.pack(code, len(parts)) + b"".join(LEN.pack(len(p)) + p for p in parts)


def replies(sock: socket.socket, n: int) -> list[tuple[int, list[bytes]]]:
    f = sock.makefile("rb")
    try:
        out = [wire.read_frame(f, 1 << 20, wire.STATUSES) for _ in range(n)]
    finally:
        f.close()
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


def raw(port: int) -> socket.socket:
    """A bare connection to the server, authenticated first when PYC10D_AUTH_TOKEN is set."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    secret = auth.token()
    if secret is not None:
        auth.authenticate(sock, secret, "test client")
    return sock


def master() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=20))


@pytest.mark.timeout(40)
def test_many_clients_one_thread() -> None:
    """200 connections cost the server no thread each; each one's parked get is answered."""
    m = master()
    before = set(threading.enumerate())  # (other tests' daemon threads may end meanwhile)
    clients = [TCPStore("127.0.0.1", m.port, timeout=timedelta(seconds=20)) for _ in range(200)]
    assert set(threading.enumerate()) - before == set()
    got: dict[int, bytes] = {}
    lock = threading.Lock()

    def get(i: int) -> None:
        v = clients[i].get(f"k{i % 10}")
        with lock:
            got[i] = v

    # 40 blocked gets across 10 keys, parked on the server at the same time.
    threads = [threading.Thread(target=get, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for i, c in enumerate(clients[40:]):
        assert c.add("n", 1) == i + 1  # the others are served meanwhile
    for k in range(10):
        clients[-1].set(f"k{k}", f"v{k}")
    for t in threads:
        t.join(20)
    assert got == {i: f"v{i % 10}".encode() for i in range(40)}


@pytest.mark.timeout(30)
def test_parked_waits_time_out_one_by_one() -> None:
    """Each parked wait ends at its own deadline with TIMEOUT; one for a key that comes in
    the meantime is answered with it, and the connection keeps working after either."""
    m = master()
    sock = raw(m.port)
    a = TCPStore("127.0.0.1", m.port, timeout=timedelta(seconds=20))
    errors: list[BaseException] = []

    def short_wait() -> None:
        try:
            a.wait(["never"], timedelta(milliseconds=200))
        except StoreTimeoutError as e:
            errors.append(e)

    t = threading.Thread(target=short_wait)
    t.start()
    sock.sendall(frame(wire.WAIT, [b"10000", b"/later"]))
    t.join(10)
    assert len(errors) == 1 and "/never" in str(errors[0])
    m.set("later", "x")  # the long wait is answered by the key, long before its deadline
    assert replies(sock, 1) == [(wire.OK, [])]
    a.set("after", "1")
    assert m.get("after") == b"1"
    sock.close()


@pytest.mark.timeout(30)
def test_pipelined_requests_answered_in_order() -> None:
    """Requests sent together, one of them parked: the later ones wait for its answer."""
    m = master()
    sock = raw(m.port)
    sock.sendall(frame(wire.ADD, [b"/c", b"1"]) + frame(wire.MGET, [b"-1", b"/k"])
                 + frame(wire.ADD, [b"/c", b"10"]))
    assert replies(sock, 1) == [(wire.OK, [b"1"])]
    assert m.add("c", 100) == 101  # the second add has not run: it waits behind the get
    m.set("k", "v")
    assert replies(sock, 2) == [(wire.OK, [b"v"]), (wire.OK, [b"111"])]
    sock.close()


@pytest.mark.timeout(30)
def test_frame_a_byte_at_a_time_and_client_leaving_while_parked() -> None:
    m = master()
    sock = raw(m.port)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for b in frame(wire.MSET, [b"/a", b"1", b"/b", b"2"]):
        sock.send(bytes([b]))
    assert replies(sock, 1) == [(wire.OK, [])]
    assert m.multi_get(["a", "b"]) == [b"1", b"2"]
    # A client that leaves with a parked wait takes it with it; the server serves on.
    sock.sendall(frame(wire.WAIT, [b"-1", b"/gone"]))
    sock.close()
    m.set("gone", "1")
    assert m.get("gone") == b"1" and m.num_keys() == 3


@pytest.mark.timeout(30)
def test_wait_for_count_and_bad_value() -> None:
    """A wait for a counter is answered once it reaches the target; a counter key set to a
    non-number answers the waiter with an error, not the client that set it."""
    m = master()
    s1 = raw(m.port)
    s2 = raw(m.port)
    s1.sendall(frame(wire.WAITGE, [b"-1", b"/n", b"3"]))
    s2.sendall(frame(wire.WAITGE, [b"-1", b"/bad", b"1"]))
    m.add("n", 2)
    m.add("n", 1)
    assert replies(s1, 1) == [(wire.OK, [b"3"])]
    m.set("bad", "not a number")  # answered normally
    status, parts = replies(s2, 1)[0]
    assert status == wire.ERROR and b"bad request" in parts[0]
    s1.close()
    s2.close()
