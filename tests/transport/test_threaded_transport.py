"""ThreadedTransport: matching, one copy per message, rendezvous through a store, failure."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from pyc10d.algorithms.comm import byte_view
from pyc10d.errors import DistBackendError, DistNetworkError, DistTimeoutError
from pyc10d.store import HashStore, PrefixStore
from pyc10d.transport import threaded as tt
from pyc10d.transport.threaded import ThreadedTransport, terminate

pytestmark = pytest.mark.timeout(30)

CH = (7 << 32) | 1


def world(size: int, store: HashStore | None = None) -> list[ThreadedTransport]:
    store = store or HashStore()
    return [ThreadedTransport(PrefixStore("w", store), r, size, timedelta(seconds=5)) for r in range(size)]


def close_all(ts: list[ThreadedTransport]) -> None:
    for t in ts:
        t.close()


@pytest.mark.parametrize("numel", [0, 3, 70_000])  # 70k floats: the GIL-free copy path
@pytest.mark.parametrize("posted_first", [True, False])
def test_message_arrives_whole(numel: int, posted_first: bool) -> None:
    a, b = world(2)
    src = torch.arange(numel, dtype=torch.float32)
    dst = torch.full((numel,), -1.0)
    if posted_first:
        h = b.irecv(0, CH, byte_view(dst))
        a.send(1, CH, byte_view(src), meta=5)
    else:
        a.send(1, CH, byte_view(src), meta=5)
        src.fill_(42)  # send copied it: the sender may reuse its buffer at once
        h = b.irecv(0, CH, byte_view(dst))
    assert h.wait(5) == (numel * 4, 5)
    assert torch.equal(dst, torch.arange(numel, dtype=torch.float32))
    close_all([a, b])


def test_posted_receive_gets_data_without_staging(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = world(2)
    staged = []
    monkeypatch.setattr(tt, "_copy_of", lambda pool, data: staged.append(1) or bytes(data))
    dst = torch.zeros(100_000, dtype=torch.uint8)
    src = torch.ones(100_000, dtype=torch.uint8)  # byte_view does not keep its tensor alive
    h = b.irecv(0, CH, byte_view(dst))
    a.send(1, CH, byte_view(src))
    h.wait(5)
    assert staged == [] and bool((dst == 1).all())
    close_all([a, b])


def test_read_only_source_is_copied() -> None:
    a, b = world(2)
    dst = torch.zeros(80_000, dtype=torch.uint8)
    h = b.irecv(0, CH, byte_view(dst))
    a.send(1, CH, memoryview(bytes([3]) * 80_000))
    h.wait(5)
    assert bool((dst == 3).all())
    close_all([a, b])


def test_fifo_per_channel_and_channels_apart() -> None:
    a, b = world(2)
    other = CH + 1
    for i in range(5):
        a.send(1, CH, memoryview(bytes([i])))
        a.send(1, other, memoryview(bytes([100 + i])))
    got, got_other = bytearray(1), bytearray(1)
    for i in range(5):
        b.irecv(0, other, memoryview(got_other)).wait(5)
        b.irecv(0, CH, memoryview(got)).wait(5)
        assert (got[0], got_other[0]) == (i, 100 + i)
    close_all([a, b])


def test_larger_message_is_flagged_truncated() -> None:
    a, b = world(2)
    buf = bytearray(2)
    h = b.irecv(0, CH, memoryview(buf))
    a.send(1, CH, memoryview(b"abcd"))
    assert h.wait(5)[0] == 4 and h.truncated
    close_all([a, b])


def test_receive_times_out() -> None:
    a, b = world(2)
    with pytest.raises(DistTimeoutError, match="from rank 0"):
        b.irecv(0, CH, memoryview(bytearray(1))).wait(0.1)
    close_all([a, b])


def test_close_fails_the_peers_receives_and_sends() -> None:
    a, b, c = world(3)
    h = b.irecv(0, CH, memoryview(bytearray(1)))
    a.send(2, CH, memoryview(b"x"))  # already delivered: still received after a leaves
    a.close()
    with pytest.raises(DistNetworkError, match="rank 0"):
        h.wait(5)
    with pytest.raises(DistNetworkError, match="rank 0"):
        b.irecv(0, CH, memoryview(bytearray(1))).wait(5)
    with pytest.raises(DistNetworkError, match="rank 0"):
        b.send(0, CH, memoryview(b"y"))
    assert c.irecv(0, CH, memoryview(bytearray(1))).wait(5) == (1, 0)
    assert not b.is_alive(0) and b.is_alive(2)
    close_all([b, c])


def test_abort_fails_receives_of_that_namespace_only() -> None:
    a, b = world(2)
    h = b.irecv(0, CH, memoryview(bytearray(1)))
    other = b.irecv(0, (8 << 32) | 1, memoryview(bytearray(1)))
    a.abort(CH >> 32, "boom", [0, 1])
    with pytest.raises(DistBackendError, match="aborted by rank 0: boom"):
        h.wait(5)
    a.send(1, (8 << 32) | 1, memoryview(b"z"))
    assert other.wait(5) == (1, 0)
    close_all([a, b])


def test_terminate_releases_every_rank() -> None:
    store = HashStore()
    ts = world(3, store)
    handles = [ts[1].irecv(0, CH, memoryview(bytearray(1))), ts[2].irecv(1, CH, memoryview(bytearray(1)))]
    assert terminate(store, DistBackendError("rank 0 failed")) == 1
    for h in handles:
        with pytest.raises(DistBackendError, match="rank 0 failed"):
            h.wait(5)
    with pytest.raises(DistBackendError, match="rank 0 failed"):
        ts[0].send(1, CH, memoryview(b"x"))
    close_all(ts)
    assert terminate(store, DistBackendError("again")) == 0  # closed worlds leave the registry


def test_ranks_meet_across_threads_and_store_reuse_gives_a_new_world() -> None:
    store = HashStore()
    hubs: dict[tuple[int, int], tt.Hub] = {}

    def rank(r: int) -> None:
        for gen in range(2):
            t = ThreadedTransport(PrefixStore("w", store), r, 4)
            hubs[gen, r] = t.hub
            peer = (r + 1) % 4
            buf = bytearray(1)
            h = t.irecv((r - 1) % 4, CH, memoryview(buf))
            t.send(peer, CH, memoryview(bytes([r])))
            h.wait(5)
            assert buf[0] == (r - 1) % 4
            # leave only when everyone got its message (a closed peer fails later sends)
            barrier.wait()
            t.close()

    barrier = threading.Barrier(4)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert len({id(hubs[0, r]) for r in range(4)}) == 1
    assert len({id(hubs[1, r]) for r in range(4)}) == 1
    assert hubs[0, 0] is not hubs[1, 0]


def test_world_size_and_rank_must_agree() -> None:
    store = HashStore()
    ThreadedTransport(store, 0, 2)
    with pytest.raises(DistBackendError, match="world_size 3"):
        ThreadedTransport(store, 1, 3)
    store = HashStore()
    ThreadedTransport(store, 0, 2)
    with pytest.raises(DistBackendError, match="two threads joined the same world as rank 0"):
        ThreadedTransport(store, 0, 2)


def test_ranks_of_another_process_are_refused() -> None:
    store = HashStore()
    store.add("threaded/joined", 1)  # as if rank 0 had joined from another process
    store.set("threaded/0", "a-hub-of-another-process")
    with pytest.raises(DistBackendError, match="another process"):
        ThreadedTransport(store, 1, 2)
