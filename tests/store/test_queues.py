"""Store queues (``queue_push``/``queue_pop``/``queue_len``), ``list_keys`` and ``barrier``:
pyc10d's stores run the same script as torch's, and the answers are compared."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as tdist

import pyc10d
from pyc10d.errors import DistStoreError, DistTimeoutError, QueueEmptyError
from pyc10d.store import FileStore, HashStore, PrefixStore, Store, TCPStore

pytestmark = pytest.mark.timeout(30)


def _tcp(mod: Any) -> Any:
    return mod.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))


#: kind -> (pyc10d's store, torch's store)
PAIRS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "hash": (HashStore, tdist.HashStore),
    "tcp": (lambda: _tcp(pyc10d), lambda: _tcp(tdist)),
    "prefix": (lambda: PrefixStore("pre", _tcp(pyc10d)), lambda: tdist.PrefixStore("pre", _tcp(tdist))),
}


def _script(s: Any) -> list[Any]:
    """One answer per step: a value, or the kind of error it raised."""
    s.set_timeout(timedelta(seconds=0.3))
    steps: list[Callable[[], Any]] = [
        lambda: s.check(["q"]),
        lambda: s.queue_push("q", "a"),
        lambda: s.queue_push("q", b"b\x00"),
        lambda: s.queue_len("q"),
        lambda: s.check(["q"]),
        lambda: s.wait(["q"]),
        lambda: s.list_keys(),
        lambda: s.num_keys() if isinstance(s, (HashStore, tdist.HashStore)) else "n/a",
        lambda: s.queue_pop("q"),
        lambda: s.queue_pop("q", False),
        lambda: s.queue_pop("q", False),
        lambda: s.queue_pop("q"),  # blocks for the store's timeout
        lambda: s.queue_len("q"),
        lambda: s.check(["q"]),
        lambda: s.queue_len("never"),
        lambda: s.set("k", "v"),
        lambda: s.queue_len("k"),
        lambda: sorted(s.list_keys()),
        lambda: s.queue_pop("k", False),
        lambda: s.queue_push("k", "queued"),
        lambda: s.get("k"),
        lambda: s.delete_key("k"),
        lambda: s.queue_len("k"),
        lambda: s.queue_pop("k"),
    ]
    out: list[Any] = []
    for step in steps:
        try:
            out.append(step())
        except (QueueEmptyError, tdist.QueueEmptyError) as e:
            out.append(("QueueEmptyError", str(e)))
        except (DistStoreError, tdist.DistStoreError) as e:
            out.append(("timeout" if "timeout" in str(e).lower() else type(e).__name__,))
    return out


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_queue_script_equals_torch(kind: str) -> None:
    ours, theirs = PAIRS[kind]
    got = _script(ours())
    assert got == _script(theirs())
    assert got[9:12] == [b"b\x00", ("QueueEmptyError", "queue is empty"), ("timeout",)]


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_blocking_pop_is_woken_and_takes_exclusively(kind: str) -> None:
    """A push wakes a parked pop; two parked pops and one push: exactly one gets the value
    and the other runs out of time (a value is never handed out twice)."""
    store: Store = PAIRS[kind][0]()
    store.set_timeout(timedelta(seconds=1.5))
    results: list[Any] = []

    def pop() -> None:
        mine = store.clone()
        try:
            results.append(mine.queue_pop("jobs"))
        except DistTimeoutError as e:
            results.append(str(e))

    threads = [threading.Thread(target=pop) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    store.queue_push("jobs", "one")
    for t in threads:
        t.join(10)
    got, timed_out = sorted(results, key=lambda r: isinstance(r, str))
    assert got == b"one"
    assert re.fullmatch(r"wait timeout after 1500ms, keys: \S*jobs", timed_out), timed_out
    assert store.queue_len("jobs") == 0


def test_many_producers_every_value_popped_once() -> None:
    server = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))
    n, each = 4, 50

    def produce(i: int) -> None:
        mine = server.clone()
        for j in range(each):
            mine.queue_push("q", f"{i}:{j}")

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    got = [server.queue_pop("q") for _ in range(n * each)]
    for t in threads:
        t.join(10)
    assert sorted(got) == sorted(f"{i}:{j}".encode() for i in range(n) for j in range(each))
    for i in range(n):  # each producer's values in its order
        mine = [g for g in got if g.startswith(f"{i}:".encode())]
        assert mine == [f"{i}:{j}".encode() for j in range(each)]
    with pytest.raises(QueueEmptyError):
        server.queue_pop("q", block=False)


@pytest.mark.parametrize("kind", ["hash", "tcp", "prefix", "file"])
def test_barrier(kind: str, tmp_path) -> None:
    store: Store = FileStore(str(tmp_path / "f"), -1) if kind == "file" else PAIRS[kind][0]()
    passed: list[int] = []

    def enter(i: int) -> None:
        store.clone().barrier("b", 3, timedelta(seconds=10))
        passed.append(i)

    threads = [threading.Thread(target=enter, args=(i,)) for i in range(3)]
    for t in threads[:2]:
        t.start()
    time.sleep(0.2)
    assert passed == []  # two of three in: nobody passes
    threads[2].start()
    for t in threads:
        t.join(10)
    assert sorted(passed) == [0, 1, 2]
    with pytest.raises(DistTimeoutError, match=r"store barrier 'alone': 1 of 2 workers arrived within 0.2 s"):
        store.barrier("alone", 2, timedelta(seconds=0.2))


def test_file_store_lists_keys_and_has_no_queues(tmp_path) -> None:
    ours, theirs = FileStore(str(tmp_path / "a"), 1), tdist.FileStore(str(tmp_path / "b"), 1)
    for s in (ours, theirs):
        s.set("x", "1")
        s.add("y", 2)
        with pytest.raises(NotImplementedError, match="queue support is not implemented"):
            s.queue_push("q", "v")
    assert sorted(ours.list_keys()) == ["x", "y"]
    assert {"x", "y"} <= set(theirs.list_keys())


def test_prefix_store_lists_its_own_keys() -> None:
    base = HashStore()
    base.set("outside", "1")
    p = PrefixStore("a", base)
    p.set("k1", "1")
    PrefixStore("b", p).set("k2", "2")
    assert sorted(p.list_keys()) == ["b/k2", "k1"]
    assert sorted(base.list_keys()) == ["a/b/k2", "a/k1", "outside"]


def test_queue_empty_error_is_a_store_error() -> None:
    assert issubclass(pyc10d.QueueEmptyError, DistStoreError)
    assert pyc10d.QueueEmptyError is QueueEmptyError
