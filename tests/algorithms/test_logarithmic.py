"""The logarithmic algorithms (recursive doubling and halving, Rabenseifner, Bruck, binomial
trees, dissemination) against single-process references, at world sizes up to 33.

Ranks are threads over ``test_algorithms.MemTransport``. Every world size that is not a
power of two takes the fold (or Bruck's wrapped runs); ``make test`` runs a spread of sizes,
``PYC10D_ALL_WORLDS=1`` every size 1-33. Inputs are small integers (products: -1, 0, 1), so
any order of reduction is exact and results can be compared bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _refs import gen, reduce_op, ref_reduce, short
from test_algorithms import MemTransport, make_comms, run

import pyc10d
from pyc10d import algorithms as algo
from pyc10d import settings
from pyc10d.algorithms import Comm
from pyc10d.algorithms.pow2 import ceil_log2

pytestmark = pytest.mark.timeout(40)

SPREAD = [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33]
#: ``make test`` runs 1, 2, 3, 7, 8, 9 and 17 ranks (one below, at and above a power of two);
#: the rest of ``SPREAD`` (the 31-33 rank cases cost the most) is ``full`` (``make test-full``).
SHORT = {1, 2, 3, 7, 8, 9, 17}
WORLDS = [w if w in SHORT or settings.ALL_WORLDS.get() else pytest.param(w, marks=pytest.mark.full)
          for w in (range(1, 34) if settings.ALL_WORLDS.get() else SPREAD)]
CASES = [  # (dtype, op)
    (torch.float32, "SUM"), (torch.float64, "MAX"), (torch.float16, "SUM"), (torch.bfloat16, "MIN"),
    (torch.int32, "PRODUCT"), (torch.uint8, "BXOR"), (torch.bool, "SUM"), (torch.complex64, "SUM"),
    (torch.float32, "PRODUCT"),
]


def sizes(ws: int) -> list[int]:
    return sorted({0, 1, ws - 1, ws + 1, 2 * ws + 3, 1009})


def inputs(key: str, ws: int, dtype: torch.dtype, n: int, op: str) -> list[torch.Tensor]:
    xs = [gen(key, r, dtype, n) for r in range(ws)]
    if op == "PRODUCT" and dtype.is_floating_point:
        xs = [x.clamp(-1, 1) for x in xs]  # exact in any order at 33 ranks
    return xs


def pow2(ws: int) -> bool:
    return ws & (ws - 1) == 0


@pytest.mark.parametrize("ws", WORLDS)
def test_allreduce(ws: int) -> None:
    algorithms = [algo.allreduce_recursive_doubling, algo.allreduce_rabenseifner]
    cases = [(f"ar/{short(d)}/{n}/{op}", d, n, op) for d, op in CASES for n in sizes(ws)]
    data = {key: inputs(key, ws, d, n, op) for key, d, n, op in cases}

    def fn(comm: Comm) -> dict:
        got = {}
        for f in algorithms:
            for key, _d, _n, op in cases:
                t = data[key][comm.rank].clone()
                f(comm, t, reduce_op(pyc10d, op))
                got[f.__name__, key] = t
        return got

    res = run(ws, fn, timeout=35)
    for (name, key), _ in res[0].items():
        want = ref_reduce(data[key], key.rsplit("/", 1)[1])
        for r in range(ws):
            assert torch.equal(res[r][name, key], want), f"{name} {key} rank {r}"


@pytest.mark.parametrize("ws", WORLDS[1:])
def test_allreduce_bit_identical_on_every_rank(ws: int) -> None:
    """Random floats, where the order of additions shows in the last bits: every rank ends
    with exactly the same bytes."""
    xs = [torch.randn(3 * ws + 5, generator=torch.Generator().manual_seed(r)) for r in range(ws)]

    def fn(comm: Comm) -> list[torch.Tensor]:
        out = []
        for f in (algo.allreduce_recursive_doubling, algo.allreduce_rabenseifner):
            t = xs[comm.rank].clone()
            f(comm, t, pyc10d.ReduceOp.SUM)
            out.append(t)
        return out

    res = run(ws, fn)
    for k in range(2):
        for r in range(1, ws):
            assert torch.equal(res[r][k], res[0][k]), f"algorithm {k}: rank {r} differs from rank 0"
        torch.testing.assert_close(res[0][k], torch.stack(xs).sum(0))


@pytest.mark.parametrize("ws", WORLDS)
def test_reduce_scatter_halving(ws: int) -> None:
    cases = []
    for i, (d, op) in enumerate(CASES):
        for n in sizes(ws)[:4]:
            blocks = [max(0, n + (p * 5 + i) % 3 - 1) for p in range(ws)]  # uneven, some empty
            key = f"rs/{short(d)}/{n}/{op}"
            cases.append((key, op, [inputs(f"{key}/{j}", ws, d, blocks[j], op) for j in range(ws)]))

    def fn(comm: Comm) -> list:
        got = []
        for _key, op, xs in cases:
            ins = [xs[j][comm.rank].clone() for j in range(ws)]
            out = torch.empty_like(xs[comm.rank][0])
            algo.reduce_scatter_halving(comm, ins, out, reduce_op(pyc10d, op))
            got.append((out, ins))
        return got

    res = run(ws, fn, timeout=35)
    for c, (key, op, xs) in enumerate(cases):
        for r in range(ws):
            out, ins = res[r][c]
            assert torch.equal(out, ref_reduce(xs[r], op)), f"{key} rank {r}"
            for j in range(ws):
                assert torch.equal(ins[j], xs[j][r]), f"{key}: rank {r} input block {j} was written"


@pytest.mark.parametrize("ws", WORLDS)
def test_reduce_scatter_halving_contiguous_blocks(ws: int) -> None:
    """The backends' shape: blocks are views of one tensor (no packing copy is made)."""
    k = 3
    xs = [gen(f"rsc/{ws}", r, torch.float64, ws * k) for r in range(ws)]

    def fn(comm: Comm) -> torch.Tensor:
        out = torch.empty(k, dtype=torch.float64)
        algo.reduce_scatter_halving(comm, list(xs[comm.rank].clone().split(k)), out, pyc10d.ReduceOp.SUM)
        return out

    for r, out in enumerate(run(ws, fn)):
        assert torch.equal(out, torch.stack(xs).sum(0)[r * k:(r + 1) * k]), f"rank {r}"


@pytest.mark.parametrize("ws", WORLDS)
def test_allgather(ws: int) -> None:
    algorithms = [algo.allgather_bruck] + ([algo.allgather_recursive_doubling] if pow2(ws) else [])
    for f in algorithms:
        for n in sizes(ws)[:4]:
            for layout in ("list", "contiguous"):
                key = f"ag/{n}/{layout}"
                sz = [max(0, n + (p * 5) % 3 - 1) for p in range(ws)] if layout == "list" else [n] * ws
                want = [gen(f"{key}/{p}", p, torch.int16, sz[p]) for p in range(ws)]

                def fn(comm: Comm, want: list = want, sz: list = sz, layout: str = layout,
                       f: Callable = f) -> list:
                    if layout == "list":
                        blocks = [torch.zeros(sz[p], dtype=torch.int16) for p in range(ws)]
                    else:
                        blocks = list(torch.zeros(ws * sz[0], dtype=torch.int16).split(sz[0])) if sz[0] \
                            else [torch.zeros(0, dtype=torch.int16)] * ws
                    blocks[comm.rank].copy_(want[comm.rank])
                    f(comm, blocks)
                    return blocks

                for r, blocks in enumerate(run(ws, fn)):
                    for p in range(ws):
                        assert torch.equal(blocks[p], want[p]), f"{f.__name__} {key} rank {r} block {p}"


def _roots(ws: int) -> list[int]:
    return sorted({0, ws // 2, ws - 1})


@pytest.mark.parametrize("ws", WORLDS)
def test_broadcast(ws: int) -> None:
    algorithms = [algo.broadcast_binomial, algo.broadcast_scatter_doubling]
    cases = [(f"bc/{short(d)}/{n}/{root}", d, n, root) for d in (torch.float32, torch.bool, torch.complex64)
             for n in sizes(ws) for root in _roots(ws)]

    def fn(comm: Comm) -> dict:
        got = {}
        for f in algorithms:
            for key, d, n, root in cases:
                t = gen(key, comm.rank, d, n)
                f(comm, t, root)
                got[f.__name__, key] = t
        return got

    res = run(ws, fn, timeout=35)
    for (name, key) in res[0]:
        _, _, _, root = next(c for c in cases if c[0] == key)
        d, n = next((c[1], c[2]) for c in cases if c[0] == key)
        for r in range(ws):
            assert torch.equal(res[r][name, key], gen(key, root, d, n)), f"{name} {key} rank {r}"


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("algorithm", [algo.reduce_binomial, algo.reduce_rabenseifner], ids=lambda f: f.__name__)
def test_reduce(algorithm: Callable, ws: int) -> None:
    cases = [(f"red/{short(d)}/{n}/{op}/{root}", d, n, op, root) for d, op in CASES
             for n in sizes(ws)[2:5] for root in _roots(ws)]
    data = {c[0]: inputs(c[0], ws, c[1], c[2], c[3]) for c in cases}

    def fn(comm: Comm) -> list:
        got = []
        for key, _d, _n, op, root in cases:
            t = data[key][comm.rank].clone()
            algorithm(comm, t, root, reduce_op(pyc10d, op))
            got.append(t)
        return got

    res = run(ws, fn, timeout=35)
    for i, (key, _d, _n, op, root) in enumerate(cases):
        assert torch.equal(res[root][i], ref_reduce(data[key], op)), key
        for r in range(ws):
            if r != root:
                assert torch.equal(res[r][i], data[key][r]), f"{key}: rank {r}'s tensor was written"


@pytest.mark.parametrize("ws", WORLDS)
def test_barrier_dissemination(ws: int) -> None:
    """Nobody leaves before the last rank to arrive (each rank in turn is the late one)."""
    late_ranks = _roots(ws)

    def fn(comm: Comm) -> list[tuple[float, float]]:
        out = []
        for late in late_ranks:
            if comm.rank == late:
                time.sleep(0.03)
            entered = time.monotonic()
            algo.barrier_dissemination(comm)
            out.append((entered, time.monotonic()))
        return out

    res = run(ws, fn)
    for i, late in enumerate(late_ranks):
        assert min(r[i][1] for r in res) >= max(r[i][0] for r in res), f"late rank {late}"


class PeerCounting(MemTransport):
    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.peers: set[int] = set()

    def send(self, peer: int, channel: int, data: memoryview, meta: int = 0) -> None:
        self.peers.add(peer)
        super().send(peer, channel, data, meta)

    def irecv(self, peer: int, channel: int, buf: memoryview) -> Any:
        self.peers.add(peer)
        return super().irecv(peer, channel, buf)


@pytest.mark.parametrize("ws", [13, 16, 33])
def test_peers_per_rank_are_logarithmic(ws: int) -> None:
    """Each algorithm alone talks to at most 2·ceil(log2 n) peers per rank (the flat ones
    to n-1), which is what lets a tcp rank open that few connections."""
    cases: list[tuple[str, Callable[[Comm], None]]] = [
        ("allreduce_recursive_doubling", lambda c: algo.allreduce_recursive_doubling(c, torch.ones(3), pyc10d.ReduceOp.SUM)),
        ("allreduce_rabenseifner", lambda c: algo.allreduce_rabenseifner(c, torch.ones(99), pyc10d.ReduceOp.SUM)),
        ("broadcast_binomial", lambda c: algo.broadcast_binomial(c, torch.ones(3), 1)),
        ("broadcast_scatter_doubling", lambda c: algo.broadcast_scatter_doubling(c, torch.ones(99), 1)),
        ("reduce_binomial", lambda c: algo.reduce_binomial(c, torch.ones(3), 2, pyc10d.ReduceOp.SUM)),
        ("reduce_rabenseifner", lambda c: algo.reduce_rabenseifner(c, torch.ones(99), 2, pyc10d.ReduceOp.SUM)),
        ("barrier_dissemination", algo.barrier_dissemination),
        ("allgather_bruck", lambda c: algo.allgather_bruck(c, list(torch.ones(2 * ws).split(2)))),
        ("reduce_scatter_halving",
         lambda c: algo.reduce_scatter_halving(c, list(torch.ones(2 * ws).split(2)), torch.empty(2), pyc10d.ReduceOp.SUM)),
        ("allreduce_direct (flat)", lambda c: algo.allreduce_direct(c, torch.ones(3), pyc10d.ReduceOp.SUM)),
    ]
    bound = 2 * ceil_log2(ws)
    for name, body in cases:
        boxes = [pyc10d.transport.base.Mailbox(ws) for _ in range(ws)]
        comms = [Comm(PeerCounting(r, boxes), list(range(ws)), r, 1 << 32, 10.0, "test") for r in range(ws)]
        run(ws, body, comms=comms)
        most = max(len(c.transport.peers) for c in comms)
        if "flat" in name:
            assert most == ws - 1, name
        else:
            assert most <= bound, f"{name}: a rank talked to {most} peers (bound {bound})"


def test_make_comms_is_shared() -> None:  # keeps the helper import honest for linters
    assert len(make_comms(2)) == 2


# -- selection by the cost model ------------------------------------------------------------
def test_select_by_cost_model_above_small_world() -> None:
    """Above SMALL_WORLD: logarithmic latency-bound algorithms for small messages,
    bandwidth-optimal logarithmic ones for large, never one whose ranks talk to more than
    2·ceil(log2 n) peers; at n <= SMALL_WORLD today's measured choices."""
    from pyc10d.algorithms import cost

    colls = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "barrier")
    for n in (8, 16, 33, 256, 1024, 4096):
        for s in (0, 8, 4096, 1 << 16, 1 << 20, 1 << 26):
            for c in colls:
                name = algo.select(c, n, s).__name__
                assert cost.peers(name, n) <= 2 * ceil_log2(n), (c, n, s, name)
    for n in (16, 1024):
        assert algo.select("allreduce", n, 8) is algo.allreduce_recursive_doubling
        assert algo.select("allreduce", n, 1 << 24) is algo.allreduce_rabenseifner
        assert algo.select("broadcast", n, 8) is algo.broadcast_binomial
        assert algo.select("reduce", n, 8) is algo.reduce_binomial
        assert algo.select("reduce", n, 1 << 24) is algo.reduce_rabenseifner
        assert algo.select("barrier", n, 0) is algo.barrier_dissemination
        assert algo.select("reduce_scatter", n, 8) is algo.reduce_scatter_halving
    assert algo.select("allgather", 1024, 8) is algo.allgather_recursive_doubling
    assert algo.select("allgather", 1000, 8) is algo.allgather_bruck
    assert algo.select("broadcast", 1024, 1 << 24) is algo.broadcast_scatter_doubling
    for n in (2, 3, 4):  # unchanged where measured
        assert algo.select("allreduce", n, 8) is algo.allreduce_direct
        assert algo.select("allreduce", n, 1 << 20) is algo.allreduce_ring
        assert algo.select("barrier", n, 0) is algo.barrier_direct


def test_model_prefers_what_costs_less(monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice follows the model's parameters: with free latency and costly bytes the
    ring (fewest bytes, 2 peers) beats recursive doubling even for small messages."""
    from pyc10d.algorithms import cost

    monkeypatch.setattr(algo, "MODEL", cost.Model(alpha=0.0, o=0.0, beta=1e-9, gamma=1e-9))
    monkeypatch.setattr(algo, "_CHOSEN", {})
    assert algo.select("allreduce", 24, 4096) in (algo.allreduce_ring, algo.allreduce_rabenseifner)
    monkeypatch.setattr(algo, "MODEL", cost.Model(alpha=1.0, o=0.0, beta=0.0, gamma=0.0))
    monkeypatch.setattr(algo, "_CHOSEN", {})
    assert algo.select("allreduce", 24, 1 << 24) is algo.allreduce_recursive_doubling


def test_new_model_or_segment_size_replaces_cached_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    """``select`` caches its choice per (collective, n, size): patching MODEL (as the docs and
    the conformance suite do) or SEGMENT_BYTES must not leave the old model's choice in force."""
    from pyc10d.algorithms import cost, segments

    monkeypatch.setattr(algo, "MODEL", cost.Model(alpha=1.0, o=0.0, beta=0.0, gamma=0.0))
    assert algo.select("allreduce", 24, 4096) is algo.allreduce_recursive_doubling
    monkeypatch.setattr(algo, "MODEL", cost.Model(alpha=0.0, o=0.0, beta=1e-9, gamma=1e-9))
    assert algo.select("allreduce", 24, 4096) is algo.allreduce_ring
    # the chain's cost depends on the segment size: 8 B segments make it the cheapest
    monkeypatch.setattr(algo, "MODEL", cost.Model(alpha=1e-12, o=1e-12, beta=1e-6, gamma=1e-6))
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 1 << 20)
    first = algo.select("broadcast", 12, 404)
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 8)
    assert algo.select("broadcast", 12, 404) is algo.broadcast_chain is not first
