"""``store.attempt.scope``: each forming of a group agrees on a prefix no earlier forming used,
whatever a dead attempt left in the store (the multi-process cases, through torchrun and its
forked stand-in, are in ``tests/torch_backend/test_elastic_restart.py``)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from pyc10d.errors import DistTimeoutError
from pyc10d.store import HashStore, PrefixStore
from pyc10d.store.attempt import ROOT, scope


def _form(store: HashStore, size: int, timeout: float = 10, ranks: list[int] | None = None) -> dict[int, object]:
    """``scope`` on ``ranks`` (default: all) as threads; each rank's store or exception."""
    got: dict[int, object] = {}

    def one(rank: int) -> None:
        try:
            got[rank] = scope(store, rank, size, timedelta(seconds=timeout), "g")
        except Exception as e:  # noqa: BLE001 - reported to the test
            got[rank] = e

    threads = [threading.Thread(target=one, args=(r,)) for r in (ranks if ranks is not None else range(size))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return got


def _prefix(s: object) -> str:
    assert isinstance(s, PrefixStore), s
    return s.prefix


@pytest.mark.timeout(30)
@pytest.mark.parametrize("size", [2, 5])
def test_every_rank_gets_one_new_prefix_past_a_dead_attempts_keys(size: int) -> None:
    store = HashStore()
    # a dead attempt: hellos of its ranks (one never admitted), an admission, its transport's keys
    for r in range(1, size):
        store.set(f"{ROOT}/hello/{r}", f"dead{r}")
    store.set(f"{ROOT}/admit/1/dead1", "deadtoken")
    store.set("shm/segment", "pyc10d_1_tgone")
    first = {_prefix(s) for s in _form(store, size).values()}
    assert len(first) == 1 and first != {f"{ROOT}/deadtoken"}, first
    # formed again in the same store (destroy and init, or the next restart): another prefix
    second = {_prefix(s) for s in _form(store, size).values()}
    assert len(second) == 1 and second != first, (first, second)


def test_a_group_of_one_meets_nobody() -> None:
    store = HashStore()
    assert scope(store, 0, 1, timedelta(seconds=1), "g") is store
    assert store.num_keys() == 0


@pytest.mark.timeout(30)
def test_timeouts_name_the_rank_and_whom_it_waited_for() -> None:
    store = HashStore()
    got = _form(store, 3, timeout=0.3, ranks=[0, 2])  # rank 1 never arrives
    assert isinstance(got[0], DistTimeoutError) and isinstance(got[2], DistTimeoutError), got
    assert "forming group 'g': rank 0 timed out" in str(got[0]) and "ranks [1] to arrive" in str(got[0]), got[0]
    assert "rank 2 timed out" in str(got[2]) and "waiting for rank 0 to admit it" in str(got[2]), got[2]
    # rank 1's hello from that failed forming is there now; its rank never acknowledges
    store = HashStore()
    store.set(f"{ROOT}/hello/1", "dead1")
    got = _form(store, 2, timeout=0.3, ranks=[0])
    assert isinstance(got[0], DistTimeoutError) and "ranks [1] to acknowledge" in str(got[0]), got[0]
