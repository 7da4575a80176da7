"""Behaviour of the four stores (same suite for each) plus multi-process and TCP specifics."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import re
import signal
import socket
import threading
import time
from datetime import timedelta

import pytest
from _clock import bound

from pyc10d.errors import DistNetworkError, DistStoreError, DistTimeoutError
from pyc10d.store import FileStore, HashStore, PrefixStore, Store, TCPStore

FORK = mp.get_context("fork")
KINDS = ["hash", "file", "tcp", "prefix"]


def _make(kind: str, tmp_path) -> Store:
    if kind == "hash":
        return HashStore()
    if kind == "file":
        return FileStore(str(tmp_path / "store"), 1)
    if kind == "tcp":
        return TCPStore("localhost", 0, world_size=1, is_master=True, timeout=timedelta(seconds=10))
    return PrefixStore("pre", HashStore())


@pytest.fixture(params=KINDS)
def store(request, tmp_path) -> Store:
    return _make(request.param, tmp_path)


def _run_procs(target, n: int, *args) -> None:
    procs = [FORK.Process(target=target, args=(r, *args)) for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(20)
    assert [p.exitcode for p in procs] == [0] * n


# -- the shared behaviour suite --------------------------------------------------------------
@pytest.mark.timeout(10)
def test_set_get_add_check_num_keys(store):
    base = store.num_keys()  # FileStore/TCPStore count one bookkeeping key, as torch's do
    for n in (1, 2, 3):
        store.add("key", n)
    store.set("key0", "value0")
    store.set("key1", b"value1")
    for n in range(1, 7):
        store.add("key3", n)
    assert store.num_keys() == base + 4
    assert store.get("key") == b"6"
    assert store.get("key0") == b"value0"
    assert store.get("key1") == b"value1"
    assert store.get("key3") == b"21"
    assert store.add("key3", -21) == 0
    assert store.check(["key3", "key0"]) and not store.check(["key3", "nope"])
    store.set("-key3", "7")
    assert store.delete_key("-key3") is True
    assert store.delete_key("-key3") is False
    assert store.num_keys() == base + 4
    assert not store.check(["-key3"])


@pytest.mark.timeout(10)
def test_add_to_non_integer_fails(store):
    store.set("word", "abc")
    with pytest.raises(DistStoreError):
        store.add("word", 1)
    assert store.get("word") == b"abc"
    assert store.add("fresh", 5) == 5  # the store still works afterwards


@pytest.mark.timeout(10)
def test_binary_and_large_values(store):
    blob = bytes(range(256)) * 4096  # 1 MiB with every byte value, NULs included
    store.set("blob", blob)
    assert store.get("blob") == blob
    store.set("empty", b"")
    assert store.get("empty") == b"" and store.check(["empty"])
    store.set("uni", "héllo")
    assert store.get("uni") == "héllo".encode()


@pytest.mark.timeout(10)
def test_compare_set(store):
    assert store.compare_set("cs0", "wrong", "new0") == b"wrong"  # missing key, non-empty expected
    assert not store.check(["cs0"])
    store.set("cs0", "value0")
    assert store.compare_set("cs0", "wrong", "new0") == b"value0"
    assert store.get("cs0") == b"value0"
    assert store.compare_set("cs0", "value0", "new0") == b"new0"
    assert store.get("cs0") == b"new0"
    assert store.compare_set("cs1", "", "new1") == b"new1"  # missing key, empty expected
    assert store.get("cs1") == b"new1"


@pytest.mark.timeout(10)
def test_wait_timeout_message_and_types(store):
    t0 = time.monotonic()
    with pytest.raises(DistTimeoutError, match=r"(?i)timeout") as info:
        store.wait(["bad_key"], timedelta(seconds=0.25))
    assert 0.2 < time.monotonic() - t0 < bound(2)  # at its 0.25 s, not the store's own timeout
    assert "bad_key" in str(info.value) and "250ms" in str(info.value)
    assert isinstance(info.value, DistStoreError) and isinstance(info.value, RuntimeError)
    store.add("good_key", 1)
    store.wait(["good_key"])
    store.wait(["good_key"], timedelta(seconds=0.1))


@pytest.mark.timeout(10)
def test_get_uses_store_timeout(store):
    store.set_timeout(timedelta(seconds=0.2))
    assert store.timeout == timedelta(seconds=0.2)
    with pytest.raises(DistTimeoutError, match=r"(?i)timeout.*200ms.*missing_key"):
        store.get("missing_key")
    with pytest.raises(DistTimeoutError, match="other_missing"):
        store.multi_get(["missing_key_not", "other_missing"])
    store.set("missing_key", "now")  # the store is still usable after a timeout
    assert store.get("missing_key") == b"now"


@pytest.mark.timeout(10)
def test_extended_api(store):
    assert store.has_extended_api()
    store.set("foo", "po")
    store.append("foo", "tato")
    store.append("bar", "po")
    store.append("bar", "tato")
    assert store.get("foo") == b"potato" and store.get("bar") == b"potato"
    store.multi_set(["a", "b"], ["x", b"y"])
    assert store.multi_get(["a", "b", "foo"]) == [b"x", b"y", b"potato"]


@pytest.mark.timeout(10)
def test_blocking_get_woken_by_other_handle(store):
    other = store.clone()
    store.set_timeout(timedelta(seconds=5))
    got: list[bytes] = []
    waiter = threading.Thread(target=lambda: got.append(store.get("late")))
    waiter.start()
    time.sleep(0.1)
    for i in range(20):  # the other handle is served while one get is parked
        other.set(f"x{i}", "y")
    other.set("late", "here")
    waiter.join(5)
    assert got == [b"here"]


@pytest.mark.timeout(10)
def test_blocked_wait_does_not_spin(store):
    store.set_timeout(timedelta(seconds=0.6))
    cpu0 = time.process_time()
    with pytest.raises(DistTimeoutError):
        store.get("never")
    assert time.process_time() - cpu0 < 0.2


# -- PrefixStore -----------------------------------------------------------------------------
@pytest.mark.timeout(10)
def test_prefix_store_namespacing():
    base = HashStore()
    p = PrefixStore("pg0", base)
    p.set("k", "v")
    assert base.get("pg0/k") == b"v" and not base.check(["k"])
    assert p.underlying_store is base
    assert PrefixStore("a", p)._underlying_non_prefix_store is base
    base.set("other", "x")
    assert p.num_keys() == 2  # delegates: counts the whole underlying store
    p.set_timeout(timedelta(seconds=0.1))
    assert base.timeout == timedelta(seconds=0.1)
    with pytest.raises(DistTimeoutError, match="pg0/missing"):
        p.get("missing")
    with pytest.raises(ValueError):
        PrefixStore("p", None)  # type: ignore[arg-type]


class _NoExtendedStore(HashStore):
    def has_extended_api(self) -> bool:
        return False

    def append(self, key, value):
        raise NotImplementedError


@pytest.mark.timeout(10)
def test_prefix_append_fallback_uses_compare_set():
    p = PrefixStore("p", _NoExtendedStore())
    assert not p.has_extended_api()
    for _ in range(3):
        p.append("k", "x")  # same value each time: must not be mistaken for success
    assert p.get("k") == b"xxx"


# -- FileStore -------------------------------------------------------------------------------
@pytest.mark.timeout(10)
def test_file_store_two_objects_one_process(tmp_path):
    path = str(tmp_path / "fs")
    a, b = FileStore(path, 2), FileStore(path, 2)
    a.set("k", "v")
    assert b.get("k") == b"v"
    assert b.add("n", 2) == 2 and a.add("n", 3) == 5
    assert b.delete_key("k") and not a.check(["k"])
    assert a.num_keys() == b.num_keys() == 2  # "n" + refcount


@pytest.mark.timeout(10)
def test_file_store_refcount_removes_file(tmp_path):
    path = str(tmp_path / "fs")
    a, b = FileStore(path, 1), FileStore(path, 1)
    del a
    gc.collect()
    assert os.path.exists(path)
    del b
    gc.collect()
    assert not os.path.exists(path)
    keep = FileStore(path)  # world_size -1: never removed
    del keep
    gc.collect()
    assert os.path.exists(path)


def _file_worker(rank: int, path: str, n: int) -> None:
    store = FileStore(path, n)
    store.set_timeout(timedelta(seconds=10))
    store.add("count", 1)
    store.set(f"rank{rank}", str(rank))
    store.wait([f"rank{i}" for i in range(n)])
    assert store.get(f"rank{(rank + 1) % n}") == str((rank + 1) % n).encode()
    store.add("done", 1)
    store.wait(["count"])
    t0 = time.monotonic()
    try:
        store.wait([f"missing{rank}"], timedelta(seconds=0.5))
        raise AssertionError("no timeout")
    except DistTimeoutError as e:
        assert f"missing{rank}" in str(e) and re.search("(?i)timeout", str(e))
    assert time.monotonic() - t0 < bound(1.5)  # at its 0.5 s, not the store's 10 s


@pytest.mark.timeout(30)
def test_file_store_multiprocess(tmp_path):
    path = str(tmp_path / "mp")
    main = FileStore(path)
    _run_procs(_file_worker, 3, path, 3)
    assert main.get("count") == b"3" and main.get("done") == b"3"


# -- TCPStore --------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(10)
def test_tcp_port_zero_and_clients():
    master = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    assert master.port > 0 and master.host == "localhost"
    client = TCPStore("localhost", master.port, timeout=timedelta(seconds=5))
    master.set("k", "v")
    assert client.get("k") == b"v"
    assert master.num_keys() == 1  # no world_size: no worker-count key
    with pytest.raises(ValueError, match="world size cannot be 0"):
        TCPStore("localhost", 0, world_size=0)


@pytest.mark.timeout(10)
def test_tcp_client_retries_until_server_starts():
    port = _free_port()
    out: list[bytes] = []

    def client() -> None:
        out.append(TCPStore("localhost", port, timeout=timedelta(seconds=5)).get("k"))

    t = threading.Thread(target=client)
    t.start()
    time.sleep(0.3)
    master = TCPStore("localhost", port, is_master=True)
    master.set("k", "late-server")
    t.join(5)
    assert out == [b"late-server"]


@pytest.mark.timeout(10)
def test_tcp_client_gives_up_on_a_server_that_never_answers(monkeypatch):
    """The client's own deadline (in the kernel, the socket blocking for Python) ends a call
    to a server that accepted the connection and then says nothing, naming what happened."""
    import pyc10d.store.tcp as tcp_mod

    monkeypatch.setattr(tcp_mod, "_GRACE_S", 0.2)
    # (the plain protocol: with a token the handshake fails first, see tests/test_auth.py)
    monkeypatch.delenv("PYC10D_AUTH_TOKEN", raising=False)
    mute = socket.create_server(("localhost", 0))
    port = mute.getsockname()[1]
    store = TCPStore("localhost", port, timeout=timedelta(seconds=0.3), wait_for_workers=False)
    conn, _ = mute.accept()
    t0 = time.monotonic()
    with pytest.raises(DistStoreError, match=rf"no answer from the server at localhost:{port} within 0.5 s"):
        store.get("k")
    assert time.monotonic() - t0 < bound(3)  # at its 0.5 s deadline, not never
    with pytest.raises(DistStoreError, match="no answer"):  # and every later call says the same
        store.set("k", "v")
    conn.close()
    mute.close()


@pytest.mark.timeout(10)
def test_tcp_connect_timeout():
    t0 = time.monotonic()
    port = _free_port()
    with pytest.raises(
        DistNetworkError, match=rf"timed out after 500ms.*localhost, {port}"
    ) as info:
        TCPStore("localhost", port, timeout=timedelta(seconds=0.5))
    assert isinstance(info.value, DistTimeoutError)
    assert time.monotonic() - t0 < bound(3)  # at its 0.5 s


@pytest.mark.timeout(10)
def test_tcp_wait_for_workers():
    with pytest.raises(
        DistTimeoutError, match=r"Timed out after 1 seconds waiting for clients\. 1/2"
    ):
        TCPStore("localhost", 0, world_size=2, is_master=True, timeout=timedelta(seconds=1))
    # success path: master blocks until 2 more clients join; it listens on a pre-bound socket
    listener = socket.create_server(("localhost", 0))
    port = listener.getsockname()[1]
    clients = [
        threading.Thread(target=TCPStore, args=("localhost", port, 3), daemon=True)
        for _ in range(2)
    ]
    for c in clients:
        c.start()
    master = TCPStore(
        "localhost", port, 3, True, timeout=timedelta(seconds=5), master_listen_fd=listener.detach()
    )
    assert master.num_keys() == 1  # torch counts its worker-count key


@pytest.mark.timeout(10)
def test_tcp_multi_tenant_and_address_in_use():
    port = _free_port()
    a = TCPStore("localhost", port, 1, True, multi_tenant=True)
    b = TCPStore("localhost", port, 1, True, multi_tenant=True)
    a.set("shared", "1")
    assert b.get("shared") == b"1"
    with pytest.raises(DistNetworkError, match=rf"failed to listen on any local .*{port}"):
        TCPStore("localhost", port, 1, True)
    del a
    gc.collect()
    assert b.get("shared") == b"1"  # server lives while any tenant does


@pytest.mark.timeout(10)
def test_tcp_server_gone_in_process():
    master = TCPStore("localhost", 0, is_master=True)
    client = TCPStore("localhost", master.port, timeout=timedelta(seconds=30))
    errors: list[Exception] = []

    def blocked() -> None:
        try:
            client.get("never")
        except Exception as e:  # noqa: BLE001 - the test asserts on it
            errors.append(e)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    port = master.port
    del master
    gc.collect()
    t.join(5)
    assert len(errors) == 1 and isinstance(errors[0], DistStoreError)
    assert f"localhost:{port}" in str(errors[0])
    with pytest.raises(DistStoreError, match=f"localhost:{port}"):
        client.set("x", "y")


def _serve_then_hang(conn) -> None:
    store = TCPStore("localhost", 0, is_master=True)
    conn.send(store.port)
    time.sleep(60)


@pytest.mark.timeout(15)
def test_tcp_server_process_killed():
    parent, child = FORK.Pipe()
    proc = FORK.Process(target=_serve_then_hang, args=(child,))
    proc.start()
    port = parent.recv()
    timeout_s = 30
    client = TCPStore("localhost", port, timeout=timedelta(seconds=timeout_s))
    client.set("k", "v")
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(5)
    t0 = time.monotonic()
    with pytest.raises(DistStoreError, match=f"localhost:{port}"):
        client.get("never")
    assert time.monotonic() - t0 < timeout_s / 3  # the lost server is seen, not the timeout


def _tcp_worker(rank: int, port: int, n: int) -> None:
    store = TCPStore("localhost", port, world_size=n, timeout=timedelta(seconds=10))
    store.add("count", 1)
    store.set(f"rank{rank}", str(rank))
    store.wait([f"rank{i}" for i in range(n - 1)])
    assert store.get(f"rank{(rank + 1) % (n - 1)}") == str((rank + 1) % (n - 1)).encode()
    store.set_timeout(timedelta(seconds=0.5))
    t0 = time.monotonic()
    try:
        store.get(f"missing{rank}")
        raise AssertionError("no timeout")
    except DistTimeoutError as e:
        assert f"missing{rank}" in str(e) and re.search("(?i)timeout", str(e))
    assert time.monotonic() - t0 < bound(1.5)  # at its 0.5 s, not the store's 10 s


@pytest.mark.timeout(30)
def test_tcp_multiprocess():
    listener = socket.create_server(("localhost", 0))
    port = listener.getsockname()[1]
    procs = [FORK.Process(target=_tcp_worker, args=(r, port, 4)) for r in range(3)]
    for p in procs:
        p.start()
    listener_fd = listener.detach()
    # blocks until all three children have joined (wait_for_workers)
    master = TCPStore(
        "localhost", port, 4, True, timeout=timedelta(seconds=15), master_listen_fd=listener_fd
    )
    for p in procs:
        p.join(20)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert master.get("count") == b"3"
