"""Each algorithm of ``pyc10d.algorithms`` against a single-process reference.

The ranks are threads of this process talking through ``MemTransport``, a few-line
``Transport`` over ``Mailbox`` (a send hands the bytes straight to the peer's mailbox), so
these tests need no sockets and no processes. World sizes 1-5; sizes 0, 1, fewer elements
than ranks, primes, sizes not divisible by the world size and seeded random ones.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _clock import bound
from _refs import Check, gen, op_names, reduce_op, ref_reduce, short

import pyc10d
from pyc10d import algorithms as algo
from pyc10d.algorithms import Comm, segments
from pyc10d.errors import DistBackendError, DistNetworkError, DistTimeoutError
from pyc10d.transport.base import Mailbox, RecvHandle, Transport, abort_error, lost_error

pytestmark = pytest.mark.timeout(60)

CHANNEL = (7 << 32) | 1
WORLD_SIZES = [1, 2, 3, 4, 5]
#: For the grids of dtypes x sizes x ops of the reductions and broadcasts: up to 3 ranks in make
#: test (every algorithm, alone, in pairs and in an odd ring); 4 and 5 ranks, which cost most of
#: the grid, in make test-full.
WORLD_SIZES_SHORT = [1, 2, 3, pytest.param(4, marks=pytest.mark.full), pytest.param(5, marks=pytest.mark.full)]
REDUCE_DTYPES = [torch.float64, torch.float16, torch.int32, torch.uint8, torch.bool, torch.complex64]
MOVE_DTYPES = [torch.float32, torch.bfloat16, torch.int8, torch.bool, torch.complex64]


class MemTransport(Transport):
    """In-memory transport: every rank's mailbox is reachable from every thread."""

    def __init__(self, rank: int, boxes: list[Mailbox]) -> None:
        self.rank, self.size, self.boxes = rank, len(boxes), boxes
        self.sends = 0

    def send(self, peer: int, channel: int, data: memoryview, meta: int = 0) -> None:
        self.sends += 1
        self.boxes[peer].arrived(self.rank, channel, bytes(data), meta)

    def irecv(self, peer: int, channel: int, buf: memoryview) -> RecvHandle:
        handle = RecvHandle(buf, peer, channel)
        self.boxes[self.rank].post(handle)
        return handle

    def abort(self, namespace: int, reason: str, peers: list[int]) -> None:
        for p in peers:
            if p != self.rank:
                self.boxes[p].abort(namespace, abort_error(self.rank, reason))

    def close(self) -> None:
        pass


def make_comms(ws: int, timeout: float = 10.0) -> list[Comm]:
    boxes = [Mailbox(ws) for _ in range(ws)]
    return [Comm(MemTransport(r, boxes), list(range(ws)), r, CHANNEL, timeout, "test") for r in range(ws)]


def run(ws: int, fn: Callable[[Comm], Any], timeout: float = 20.0, comms: list[Comm] | None = None,
        expect_errors: bool = False) -> list[Any]:
    """Run ``fn(comm)`` on ``ws`` threads; return results (or exceptions if ``expect_errors``)."""
    comms = comms or make_comms(ws)
    results: list[Any] = [None] * ws
    errors: dict[int, str] = {}

    def body(r: int) -> None:
        try:
            results[r] = fn(comms[r])
        except BaseException as e:  # noqa: BLE001
            results[r] = e
            errors[r] = traceback.format_exc()
            comms[r].transport.abort(CHANNEL >> 32, f"rank {r} failed: {e}", list(range(ws)))

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(ws)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"ranks {stuck} did not finish within {timeout}s"
    if errors and not expect_errors:
        raise AssertionError("\n".join(f"rank {r}:\n{tb}" for r, tb in sorted(errors.items())))
    return results


def sizes_for(ws: int) -> list[int]:
    rng = random.Random(1000 + ws)
    fixed = [0, 1, 2, ws - 1, ws + 1, 7, 13, 1009, 5 * ws + 1]
    return sorted(set(fixed + [rng.randrange(0, 3000) for _ in range(3)]))


def block_sizes(ws: int, n: int) -> list[int]:
    """Uneven per-destination block sizes (equal on every rank), some zero when n is small."""
    return [max(0, n + ((p * 5) % 3) - 1) for p in range(ws)]


# -- reductions -------------------------------------------------------------------------------
@pytest.mark.parametrize("ws", WORLD_SIZES_SHORT)
@pytest.mark.parametrize("algorithm", [algo.allreduce_direct, algo.allreduce_ring], ids=lambda f: f.__name__)
def test_allreduce(algorithm: Callable, ws: int) -> None:
    for dtype in REDUCE_DTYPES:
        for n in sizes_for(ws):
            for name in op_names(dtype):
                if name.startswith("PREMUL") or name == "AVG":
                    continue  # premultiply / finish are the backend's, not the algorithm's
                key = f"ar/{short(dtype)}/{n}/{name}"
                xs = [gen(key, r, dtype, n) for r in range(ws)]
                op = reduce_op(pyc10d, name)

                def fn(comm: Comm, xs: list = xs, op: Any = op) -> torch.Tensor:
                    t = xs[comm.rank].clone()
                    algorithm(comm, t, op)
                    return t

                want = ref_reduce(xs, name)
                for r, got in enumerate(run(ws, fn)):
                    assert torch.equal(got, want), f"{key} rank {r}"


@pytest.mark.parametrize("ws", [2, 3, 5])
@pytest.mark.parametrize("algorithm", [algo.allreduce_direct, algo.allreduce_ring], ids=lambda f: f.__name__)
def test_allreduce_bit_identical_on_every_rank(algorithm: Callable, ws: int) -> None:
    """Random (non-integer) floats: every rank ends with exactly the same bytes, close to the sum."""
    xs = [torch.randn(4099, generator=torch.Generator().manual_seed(r), dtype=torch.float32) for r in range(ws)]

    def fn(comm: Comm) -> torch.Tensor:
        t = xs[comm.rank].clone()
        algorithm(comm, t, pyc10d.ReduceOp.SUM)
        return t

    res = run(ws, fn)
    for r in range(1, ws):
        assert torch.equal(res[r], res[0]), f"rank {r} differs from rank 0"
    torch.testing.assert_close(res[0], torch.stack(xs).sum(0))


@pytest.mark.parametrize("ws", WORLD_SIZES_SHORT)
@pytest.mark.parametrize("algorithm", [algo.reduce_direct, algo.reduce_ring], ids=lambda f: f.__name__)
def test_reduce(algorithm: Callable, ws: int) -> None:
    for dtype in REDUCE_DTYPES:
        names = [n for n in op_names(dtype) if not n.startswith("PREMUL") and n != "AVG"]
        for i, n in enumerate(sizes_for(ws)):
            name = names[i % len(names)]
            for root in range(ws):
                key = f"red/{short(dtype)}/{n}/{name}/{root}"
                xs = [gen(key, r, dtype, n) for r in range(ws)]
                op = reduce_op(pyc10d, name)

                def fn(comm: Comm, xs: list = xs, op: Any = op, root: int = root) -> torch.Tensor:
                    t = xs[comm.rank].clone()
                    algorithm(comm, t, root, op)
                    return t

                got = run(ws, fn)[root]
                assert torch.equal(got, ref_reduce(xs, name)), f"{key}"


@pytest.mark.parametrize("ws", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", [algo.reduce_scatter_direct, algo.reduce_scatter_ring],
                         ids=lambda f: f.__name__)
def test_reduce_scatter(algorithm: Callable, ws: int) -> None:
    for dtype in REDUCE_DTYPES:
        names = [n for n in op_names(dtype) if not n.startswith("PREMUL") and n != "AVG"]
        for i, n in enumerate(sizes_for(ws)):
            name = names[i % len(names)]
            sizes = block_sizes(ws, n)
            key = f"rs/{short(dtype)}/{n}/{name}"
            xs = [[gen(f"{key}/{j}", r, dtype, sizes[j]) for j in range(ws)] for r in range(ws)]
            op = reduce_op(pyc10d, name)

            def fn(comm: Comm, xs: list = xs, op: Any = op, sizes: list = sizes) -> tuple:
                inputs = [x.clone() for x in xs[comm.rank]]
                out = torch.empty(sizes[comm.rank], dtype=inputs[0].dtype)
                algorithm(comm, inputs, out, op)
                return out, inputs

            for r, (out, inputs) in enumerate(run(ws, fn)):
                assert torch.equal(out, ref_reduce([xs[p][r] for p in range(ws)], name)), f"{key} rank {r}"
                for j in range(ws):
                    assert torch.equal(inputs[j], xs[r][j]), f"{key}: rank {r} input block {j} was written"


# -- data movement ----------------------------------------------------------------------------
@pytest.mark.parametrize("ws", WORLD_SIZES_SHORT)
@pytest.mark.parametrize("algorithm", [algo.broadcast_direct, algo.broadcast_scatter_allgather,
                                       algo.broadcast_chain], ids=lambda f: f.__name__)
def test_broadcast(algorithm: Callable, ws: int) -> None:
    for dtype in MOVE_DTYPES:
        for n in sizes_for(ws):
            for root in range(ws):
                key = f"bc/{short(dtype)}/{n}/{root}"

                def fn(comm: Comm, key: str = key, root: int = root, dtype: Any = dtype, n: int = n) -> torch.Tensor:
                    t = gen(key, comm.rank, dtype, n)
                    algorithm(comm, t, root)
                    return t

                want = gen(key, root, dtype, n)
                for r, got in enumerate(run(ws, fn)):
                    assert torch.equal(got, want), f"{key} rank {r}"


@pytest.mark.parametrize("ws", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", [algo.allgather_direct, algo.allgather_ring], ids=lambda f: f.__name__)
def test_allgather(algorithm: Callable, ws: int) -> None:
    for dtype in MOVE_DTYPES:
        for n in sizes_for(ws):
            sizes = block_sizes(ws, n)
            key = f"ag/{short(dtype)}/{n}"
            want = [gen(key, p, dtype, sizes[p]) for p in range(ws)]

            def fn(comm: Comm, want: list = want, sizes: list = sizes, dtype: Any = dtype) -> list:
                blocks = [want[p].clone() if p == comm.rank else torch.zeros(sizes[p], dtype=dtype)
                          for p in range(ws)]
                algorithm(comm, blocks)
                return blocks

            for r, blocks in enumerate(run(ws, fn)):
                for p in range(ws):
                    assert torch.equal(blocks[p], want[p]), f"{key} rank {r} block {p}"


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_gather_scatter(ws: int) -> None:
    for dtype in MOVE_DTYPES:
        for n in sizes_for(ws):
            for root in range(ws):
                key = f"gs/{short(dtype)}/{n}/{root}"

                def fn(comm: Comm, key: str = key, root: int = root, dtype: Any = dtype, n: int = n) -> tuple:
                    outs = [torch.zeros(n, dtype=dtype) for _ in range(ws)] if comm.rank == root else None
                    algo.gather_direct(comm, gen(key, comm.rank, dtype, n), outs, root)
                    ins = [gen(f"{key}/s", p, dtype, n) for p in range(ws)] if comm.rank == root else None
                    out = torch.zeros(n, dtype=dtype)
                    algo.scatter_direct(comm, ins, out, root)
                    return outs, out

                res = run(ws, fn)
                for p in range(ws):
                    assert torch.equal(res[root][0][p], gen(key, p, dtype, n)), f"{key} gather block {p}"
                    assert torch.equal(res[p][1], gen(f"{key}/s", p, dtype, n)), f"{key} scatter to {p}"


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_alltoall_pairwise(ws: int) -> None:
    for dtype in MOVE_DTYPES:
        for n in sizes_for(ws):
            key = f"a2a/{short(dtype)}/{n}"

            def size(src: int, dst: int, n: int = n) -> int:
                return max(0, n + (src * 3 + dst * 7) % 5 - 2)

            def fn(comm: Comm, key: str = key, dtype: Any = dtype, size: Callable = size) -> list:
                r = comm.rank
                ins = [gen(f"{key}/{r}->{d}", 0, dtype, size(r, d)) for d in range(ws)]
                outs = [torch.zeros(size(s, r), dtype=dtype) for s in range(ws)]
                algo.alltoall_pairwise(comm, ins, outs)
                return outs

            for r, outs in enumerate(run(ws, fn)):
                for s in range(ws):
                    want = gen(f"{key}/{s}->{r}", 0, dtype, size(s, r))
                    assert torch.equal(outs[s], want), f"{key}: rank {r} block from {s}"


@pytest.mark.parametrize("ws", WORLD_SIZES)
def test_barrier(ws: int) -> None:
    """Nobody leaves before the last rank (here: the late rank ws-1) arrived."""
    entered: dict[int, float] = {}

    def fn(comm: Comm) -> float:
        if comm.rank == ws - 1:
            time.sleep(0.05)
        entered[comm.rank] = time.monotonic()
        algo.barrier_direct(comm)
        return time.monotonic()

    left = run(ws, fn)
    assert min(left) >= max(entered.values())


# -- selection and segmentation ---------------------------------------------------------------
def test_select_thresholds() -> None:
    cases = [
        ("allreduce", algo.SMALL_ALLREDUCE, algo.allreduce_direct, algo.allreduce_ring),
        ("reduce_scatter", algo.SMALL_REDUCE_SCATTER, algo.reduce_scatter_direct, algo.reduce_scatter_ring),
        ("allgather", algo.SMALL_ALLGATHER, algo.allgather_direct, algo.allgather_ring),
        ("reduce", algo.SMALL_ALLREDUCE, algo.reduce_direct, algo.reduce_ring),
    ]
    for coll, limit, direct, ring in cases:
        for ws in (3, 4):  # the measured thresholds hold up to SMALL_WORLD ranks (above: ``cost``)
            assert algo.select(coll, ws, 0) is direct
            assert algo.select(coll, ws, limit) is direct, (coll, ws, limit)
            assert algo.select(coll, ws, limit + 1) is ring, (coll, ws, limit + 1)
            assert algo.select(coll, ws, 100 * limit) is ring
    # broadcast: above the small size, the chain once the message spans n-2 segments
    seg = segments.SEGMENT_BYTES
    for ws in (3, 4):
        assert algo.select("broadcast", ws, 0) is algo.broadcast_direct
        assert algo.select("broadcast", ws, algo.SMALL_BROADCAST) is algo.broadcast_direct
        big = max(algo.SMALL_BROADCAST + 1, (ws - 2) * seg)
        assert algo.select("broadcast", ws, big) is algo.broadcast_chain, ws
        assert algo.select("broadcast", ws, 100 * big) is algo.broadcast_chain
    assert algo.select("broadcast", 4, 2 * seg) is algo.broadcast_chain
    # with two ranks a ring broadcast/reduce saves nothing: always direct
    for coll, direct in (("broadcast", algo.broadcast_direct), ("reduce", algo.reduce_direct)):
        assert algo.select(coll, 2, 1 << 30) is direct
        assert algo.select(coll, 1, 1 << 30) is direct
    assert algo.select("allreduce", 2, algo.SMALL_ALLREDUCE + 1) is algo.allreduce_ring
    with pytest.raises(KeyError):
        algo.select("no_such_collective", 2, 0)


def test_select_reads_thresholds_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(algo, "SMALL_ALLREDUCE", 16)
    assert algo.select("allreduce", 4, 17) is algo.allreduce_ring
    assert algo.select("allreduce", 4, 16) is algo.allreduce_direct


def test_segments_split() -> None:
    t = torch.arange(10, dtype=torch.float32)
    assert [s.numel() for s in segments.segments(t, 12)] == [3, 3, 3, 1]
    assert [s.numel() for s in segments.segments(t, 1)] == [1] * 10  # never 0 elements per segment
    assert [s.numel() for s in segments.segments(t[:0], 12)] == [0]
    assert len(segments.segments(t)) == 1


# make test: one-element segments on 3 ranks and 24-byte ones (not a multiple of every
# dtype's 8) on 2; make test-full: the rest of the 3 x 3 grid.
@pytest.mark.parametrize(("ws", "seg_bytes"), [
    pytest.param(ws, seg, id=f"{seg}-{ws}", marks=() if (seg, ws) in {(1, 3), (24, 2)} else pytest.mark.full)
    for seg in (1, 8, 24) for ws in (2, 3, 5)])
def test_multi_segment_pipelines(monkeypatch: pytest.MonkeyPatch, ws: int, seg_bytes: int) -> None:
    """Tiny SEGMENT_BYTES: every ring algorithm pipelines many segments per block."""
    monkeypatch.setattr(segments, "SEGMENT_BYTES", seg_bytes)
    for dtype in (torch.float64, torch.int8, torch.bool):
        for n in (1, ws + 1, 97, 331):
            key = f"seg/{short(dtype)}/{n}"
            xs = [gen(key, r, dtype, n) for r in range(ws)]
            name = "MAX"
            op = reduce_op(pyc10d, name)

            def fn(comm: Comm, xs: list = xs, op: Any = op, key: str = key, dtype: Any = dtype, n: int = n) -> tuple:
                r = comm.rank
                ar = xs[r].clone()
                algo.allreduce_ring(comm, ar, op)
                red = xs[r].clone()
                algo.reduce_ring(comm, red, ws - 1, op)
                bc = gen(key + "bc", r, dtype, n)
                algo.broadcast_scatter_allgather(comm, bc, 1)
                chain = gen(key + "chain", r, dtype, n)
                algo.broadcast_chain(comm, chain, ws - 1)
                blocks = [xs[p].clone() if p == r else torch.zeros(n, dtype=dtype) for p in range(ws)]
                algo.allgather_ring(comm, blocks)
                out = torch.empty(n, dtype=dtype)
                algo.reduce_scatter_ring(comm, [gen(f"{key}rs{j}", r, dtype, n) for j in range(ws)], out, op)
                return ar, red, bc, chain, blocks, out, comm.transport.sends

            res = run(ws, fn)
            want = ref_reduce(xs, name)
            for r, (ar, red, bc, chain, blocks, out, _sends) in enumerate(res):
                assert torch.equal(ar, want), f"{key} allreduce_ring rank {r}"
                if r == ws - 1:
                    assert torch.equal(red, want), f"{key} reduce_ring"
                assert torch.equal(bc, gen(key + "bc", 1, dtype, n)), f"{key} broadcast rank {r}"
                assert torch.equal(chain, gen(key + "chain", ws - 1, dtype, n)), f"{key} chain rank {r}"
                for p in range(ws):
                    assert torch.equal(blocks[p], xs[p]), f"{key} allgather_ring rank {r} block {p}"
                want_rs = ref_reduce([gen(f"{key}rs{r}", p, dtype, n) for p in range(ws)], name)
                assert torch.equal(out, want_rs), f"{key} reduce_scatter_ring rank {r}"
            if n == 331:
                # each rank sent many more messages than the 2(n-1)-ish of an unsegmented ring
                per_seg = max(1, seg_bytes // torch.empty((), dtype=dtype).element_size())
                assert min(s for *_, s in res) >= (n // ws) // per_seg, "segments were not used"


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_ring_reuses_scratch_pool(ws: int) -> None:
    """Large ring reductions with a per-group scratch pool, run twice with different sizes."""
    comms = make_comms(ws)
    for c in comms:
        c.scratch_pool = {}
    for n in (ws * 150_001, ws * 140_000 - 1, 5):
        xs = [gen(f"pool/{n}", r, torch.float64, n) for r in range(ws)]

        def fn(comm: Comm, xs: list = xs) -> torch.Tensor:
            comm.deadline = time.monotonic() + comm.timeout
            t = xs[comm.rank].clone()
            algo.allreduce_ring(comm, t, pyc10d.ReduceOp.SUM)
            return t

        want = ref_reduce(xs, "SUM")
        for r, got in enumerate(run(ws, fn, comms=comms)):
            assert torch.equal(got, want), f"n={n} rank {r}"
    assert comms[0].scratch_pool, "large buffers should be kept in the pool"


# -- errors seen by an algorithm ------------------------------------------------------------
def test_dtype_and_size_mismatch_is_reported() -> None:
    def fn(comm: Comm) -> None:
        dtype = torch.float64 if comm.rank == 1 else torch.float32
        algo.allreduce_direct(comm, torch.ones(10, dtype=dtype), pyc10d.ReduceOp.SUM)

    res = run(3, fn, expect_errors=True)
    c = Check(0)
    for r, e in enumerate(res):
        c.true(isinstance(e, pyc10d.DistError), f"rank {r}: {e!r}")
        msg = str(e)
        c.true("float64" in msg and "float32" in msg and "rank 1" in msg, f"rank {r}: {msg}")
    c.finish()

    def fn2(comm: Comm) -> None:
        t = torch.ones(5 if comm.rank == 0 else 6, dtype=torch.int32)
        algo.allgather_direct(comm, [t if p == comm.rank else torch.empty_like(t) for p in range(2)])

    for e in run(2, fn2, expect_errors=True):
        assert isinstance(e, DistBackendError) and "20 bytes" in str(e) and "24 bytes" in str(e), e


def test_timeout_names_the_peer() -> None:
    comms = make_comms(2, timeout=0.3)

    def fn(comm: Comm) -> None:
        if comm.rank == 0:
            comm.recv(1, torch.empty(4))

    t0 = time.monotonic()
    res = run(2, fn, comms=comms, expect_errors=True)
    assert time.monotonic() - t0 < bound(3)  # at its 0.3 s, not never
    assert isinstance(res[0], DistTimeoutError) and isinstance(res[0], TimeoutError)
    assert "rank 1" in str(res[0]) and "0.3" in str(res[0]), res[0]


def test_lost_peer_fails_pending_receive() -> None:
    comms = make_comms(3)
    box0 = comms[0].transport.boxes[0]

    def fn(comm: Comm) -> None:
        if comm.rank == 0:
            pending = comm.irecv(2, torch.empty(4))
            box0.peer_lost(2, lost_error(2, "test"))
            pending.wait()

    res = run(3, fn, comms=comms, expect_errors=True)
    assert isinstance(res[0], DistNetworkError) and "rank 2" in str(res[0]), res[0]
    # later receives from the lost peer fail at once, too
    with pytest.raises(DistNetworkError, match="rank 2"):
        comms[0].recv(2, torch.empty(1))
