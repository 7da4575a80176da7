"""``TorchTCPStore``: pyc10d's client of torch's own TCPStore server (torchrun's agent store)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as td
from _clock import bound

from pyc10d.errors import DistStoreError
from pyc10d.store import TCPStore
from pyc10d.store.base import StoreTimeoutError
from pyc10d.store.torch_tcp import TorchTCPStore

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def server() -> td.TCPStore:
    return td.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                       timeout=timedelta(seconds=10))


def test_every_op_agrees_with_torchs_client(server: td.TCPStore) -> None:
    s = TorchTCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=5))
    s.set("a", "1")
    assert server.get("a") == b"1" and s.get("a") == b"1"
    server.set("b", b"\x00\xff")
    assert s.get("b") == b"\x00\xff"
    assert s.add("n", 5) == 5 and server.add("n", 2) == 7 and s.add("n", 0) == 7
    assert s.compare_set("a", "1", "2") == b"2" and server.get("a") == b"2"
    assert s.compare_set("a", "9", "3") == b"2"  # no match: the current value
    assert s.check(["a", "b"]) and not s.check(["a", "nope"])
    s.multi_set(["m1", "m2"], [b"x", "y"])
    assert s.multi_get(["m1", "m2"]) == [b"x", b"y"] == server.multi_get(["m1", "m2"])
    s.append("m1", b"z")
    assert server.get("m1") == b"xz"
    assert s.num_keys() == server.num_keys()
    assert s.delete_key("m2") and not s.delete_key("m2")
    assert not server.check(["m2"])
    s.wait(["a", "b"])
    assert (s.host, s.port) == ("127.0.0.1", server.port)


def test_wait_blocks_until_another_client_sets(server: td.TCPStore) -> None:
    s = TorchTCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=5))
    threading.Timer(0.2, lambda: server.set("late", b"v")).start()
    t = time.monotonic()
    assert s.get("late") == b"v"
    assert time.monotonic() - t >= 0.15


def test_a_wait_that_times_out_leaves_the_connection_usable(server: td.TCPStore) -> None:
    s = TorchTCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=5))
    with pytest.raises(StoreTimeoutError, match="/missing"):
        s.wait(["missing"], timedelta(milliseconds=200))
    with pytest.raises(StoreTimeoutError):
        s.clone().wait(["missing"], timedelta(milliseconds=100))
    s.set("k", b"v")  # the cancelled wait's answers were all read: the stream is in step
    assert s.get("k") == b"v" and s.add("c", 1) == 1


def test_refuses_a_server_that_is_not_torchs() -> None:
    ours = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=5))
    with pytest.raises(DistStoreError):
        TorchTCPStore("127.0.0.1", ours.port, timeout=timedelta(seconds=2))


def test_get_of_a_missing_key_times_out_naming_it(server: td.TCPStore) -> None:
    s = TorchTCPStore("127.0.0.1", server.port, timeout=timedelta(milliseconds=300))
    t = time.monotonic()
    with pytest.raises(StoreTimeoutError, match="wait timeout after 300ms, keys: /absent"):
        s.get("absent")
    assert time.monotonic() - t < bound(5)  # at its 300 ms, not never


def test_a_server_that_goes_away_is_an_error_not_a_hang() -> None:
    server = td.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10))
    s = TorchTCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=5))
    assert s.add("x", 1) == 1
    del server  # torch stops its server with its last reference
    with pytest.raises(DistStoreError, match="lost its connection"):
        for _ in range(50):  # the first sends may still fit in the socket buffer
            s.add("x", 1)
            time.sleep(0.02)
    with pytest.raises(DistStoreError, match="lost its connection"):
        s.get("x")  # and every later call says so


def test_queues_and_list_keys_agree_with_torchs_client(server: td.TCPStore) -> None:
    """torch 2.13's server has queues and LIST_KEYS; has_extended_api() says so, truly."""
    from pyc10d.errors import QueueEmptyError

    s = TorchTCPStore("127.0.0.1", server.port, world_size=1, timeout=timedelta(seconds=5))
    assert s.has_extended_api()
    # A push has no answer, so two connections' pushes may reach the server in either order:
    # each is followed by a queue_len on its own connection, which the server answers after it.
    s.queue_push("q", b"a")
    assert s.queue_len("q") == 1
    server.queue_push("q", b"b")
    assert server.queue_len("q") == 2
    s.queue_push("q", "c")
    assert s.queue_len("q") == 3 == server.queue_len("q")
    assert s.queue_pop("q") == b"a" and server.queue_pop("q") == b"b"
    assert s.queue_pop("q", block=False) == b"c"
    with pytest.raises(QueueEmptyError):
        s.queue_pop("q", block=False)
    assert s.queue_len("q") == 0 and s.queue_len("never") == 0
    s.set("k1", "v")
    server.set("k2", b"w")  # a set has no answer either: a get on each connection follows it
    assert s.get("k1") == b"v" and server.get("k2") == b"w"
    # the server's own key (init/, from world_size) is left out, as torch's client leaves it
    assert sorted(s.list_keys()) == sorted(server.list_keys()) == ["k1", "k2"]


def test_a_blocking_pop_waits_for_a_push_and_times_out(server: td.TCPStore) -> None:
    s = TorchTCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=5))
    threading.Timer(0.2, lambda: server.queue_push("late", b"v")).start()
    t = time.monotonic()
    assert s.queue_pop("late") == b"v" and time.monotonic() - t >= 0.15
    short = TorchTCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=0.3))
    t = time.monotonic()
    with pytest.raises(StoreTimeoutError):
        short.queue_pop("empty")
    assert 0.25 <= time.monotonic() - t < bound(3)  # at its 0.3 s, not never
    short.queue_push("empty", b"x")  # the connection still works after the cancelled wait
    assert short.queue_pop("empty", block=False) == b"x"
