"""Symmetric memory across ranks: signals and barriers in random orders, put/get at random
offsets, persistent allocations, subgroups, and every backend (symmetric memory needs only
the store and a host in common, not the shm backend)."""

from __future__ import annotations

import os
import random
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _multirank import run_ranks

import pyc10d as dist
import pyc10d.symmetric_memory as symm

pytestmark = pytest.mark.timeout(45)


def _alloc(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, group: str = "0",
           alloc_id: int | None = None) -> torch.Tensor:
    stride = torch.empty(shape).stride()
    return symm.empty_strided_p2p(shape, stride, dtype, "cpu", group, alloc_id)


def _signals_in_random_order(rank: int, ws: int, seed: int) -> int:
    """A random schedule of (src, dst, channel) signals, the same on every rank; each carries a
    value put into dst's buffer just before it, which dst checks after its wait returns."""
    symm.enable_symm_mem_for_group("0")
    t = _alloc((ws, 64), torch.int64)
    h = symm.rendezvous(t)
    rng = random.Random(seed)
    jitter = random.Random(seed * 100 + rank)  # each rank runs at its own pace
    events = 0
    for step in range(300):
        src, dst = rng.randrange(ws), rng.randrange(ws)
        channel = rng.randrange(4)
        if src == dst:
            if rng.random() < 0.3:  # now and then, a barrier reached in a random order
                if jitter.random() < 0.2:
                    time.sleep(jitter.random() * 0.003)
                t[rank, 0] = step
                h.barrier()
                for p in range(ws):
                    assert h.get_buffer(p, (ws, 64), torch.int64)[p, 0].item() == step
                h.barrier()  # nobody writes the next step's value before all have read this one
            continue
        if jitter.random() < 0.1:
            time.sleep(jitter.random() * 0.002)
        if rank == src:
            h.put(torch.full((64,), step, dtype=torch.int64), dst, offset=src * 64,
                  signal=True, channel=channel)
            events += 1
        elif rank == dst:
            h.wait_signal(src, channel=channel)
            assert t[src, 0].item() == step, (step, t[src, 0].item())
            events += 1
            h.put_signal(src, channel=15)  # read: src may overwrite its row again
        if rank == src:
            h.wait_signal(dst, channel=15)
    h.barrier()
    return events


@pytest.mark.parametrize("backend", ["shm", "tcp", "threaded"])
def test_signals_and_barriers_in_random_order(backend: str) -> None:
    res = run_ranks(backend, 4, _signals_in_random_order, 11, timeout=40)
    assert sum(res) > 300, res


def _put_get_random_offsets(rank: int, ws: int, seed: int) -> None:
    symm.enable_symm_mem_for_group("0")
    n = 4096
    t = _alloc((n,), torch.float64)
    h = symm.rendezvous(t)
    region = n // ws  # rank s writes only into [s * region, (s + 1) * region) of any buffer
    rng = random.Random(seed)
    for rnd in range(40):
        plan = [(rng.randrange(ws), rng.randrange(1, region // 2)) for _ in range(ws)]
        plan = [(dst, length, s * region + rng.randrange(region - length)) for s, (dst, length) in enumerate(plan)]
        dst, length, off = plan[rank]
        h.put(torch.arange(length, dtype=torch.float64) + 1000 * rank + rnd, dst, off, signal=True)
        for s, (d, length_s, off_s) in enumerate(plan):
            if d == rank:
                h.wait_signal(s)
                want = torch.arange(length_s, dtype=torch.float64) + 1000 * s + rnd
                assert torch.equal(t[off_s:off_s + length_s], want), (rnd, s)
        # one-sided reads: fill the own buffer, then read random pieces of the others'
        h.barrier()
        t.copy_(torch.arange(n, dtype=torch.float64) * (rank + 1) + rnd)
        h.barrier()
        for _ in range(5):
            src = rng.randrange(ws)
            length = rng.randrange(1, 200)
            off = rng.randrange(n - length)
            out = torch.empty(length, dtype=torch.float64)
            assert h.get(src, off, out) is out
            want = torch.arange(off, off + length, dtype=torch.float64) * (src + 1) + rnd
            assert torch.equal(out, want), (rnd, src, off)
        h.barrier()


@pytest.mark.parametrize("world_size", [2, 4])
def test_put_get_at_random_offsets(world_size: int) -> None:
    run_ranks("shm", world_size, _put_get_random_offsets, 5)


def _lifetimes(rank: int, ws: int) -> None:
    symm.enable_symm_mem_for_group("0")
    with pytest.raises(RuntimeError, match="not in symmetric memory"):
        symm.rendezvous(torch.ones(4))
    t = _alloc((10, 3))
    assert t.shape == (10, 3) and t.stride() == (3, 1) and t.data_ptr() % 4096 == 0
    view = t[2:]
    h = symm.rendezvous(view)  # any view of the allocation finds it
    assert symm.get_symmetric_memory(t) is h and symm.rendezvous(t, "0") is h
    with pytest.raises(RuntimeError):
        symm.rendezvous(t, "other")
    with pytest.raises(RuntimeError, match="out of|needs bytes"):
        h.get_buffer(0, (h.buffer_size,), torch.float32)
    # persistent: freed and allocated again locally, same address; signal counts carry over
    p = _alloc((16,), alloc_id=7)
    ptr = p.data_ptr()
    hp = symm.rendezvous(p)
    hp.put_signal((rank + 1) % ws)
    del p, hp
    p = _alloc((8,), alloc_id=7)  # smaller fits: same memory
    assert p.data_ptr() == ptr
    hp = symm.rendezvous(p)
    hp.wait_signal((rank - 1) % ws)
    with pytest.raises(RuntimeError, match="still in use"):
        _alloc((8,), alloc_id=7)
    # a subgroup of the odd ranks: group ranks, not global ones
    odd = dist.new_group([r for r in range(ws) if r % 2 == 1])
    if rank % 2 == 1:
        with pytest.raises(RuntimeError, match="not enabled"):
            symm.empty_strided_p2p((4,), (1,), torch.float32, "cpu", odd.group_name)
        symm.enable_symm_mem_for_group(odd.group_name)
        s = _alloc((4,), group=odd.group_name)
        hs = symm.rendezvous(s)
        assert hs.world_size == ws // 2 and hs.rank == rank // 2
        s.fill_(rank)
        hs.barrier()
        assert [hs.get_buffer(q, (4,), torch.float32)[0].item() for q in range(hs.world_size)] == \
            [float(r) for r in range(ws) if r % 2 == 1]
        hs.barrier()
    h.barrier()


@pytest.mark.parametrize("backend", ["shm", "threaded"])
def test_lifetimes_views_persistent_and_subgroups(backend: str) -> None:
    run_ranks(backend, 4, _lifetimes)


def _fused_repeatedly(rank: int, ws: int) -> None:
    """Back-to-back fused ops of growing sizes reuse (and grow) one workspace safely."""
    symm.enable_symm_mem_for_group("0")
    for i, m in enumerate([8, 8, 64, 8, 256, 256]):
        torch.manual_seed(i * 10 + rank)
        a = torch.rand(m, 16)
        b = torch.rand(16, 8)
        ag0, (mm0,) = symm._fused_all_gather_matmul_fallback(a, [b], 0, "0")
        ag1, (mm1,) = symm.fused_all_gather_matmul(a, [b], 0, "0")
        assert torch.equal(ag0, ag1) and torch.allclose(mm0, mm1)
        big = torch.rand(m * ws, 16)
        rs0 = symm._fused_matmul_reduce_scatter_fallback(big, b, "sum", 0, "0")
        rs1 = symm.fused_matmul_reduce_scatter(big, b, "sum", 0, "0")
        assert torch.allclose(rs0, rs1, atol=1e-4), (rs0 - rs1).abs().max()


@pytest.mark.parametrize("world_size", [3, 4])
def test_fused_ops_back_to_back(world_size: int) -> None:
    run_ranks("shm", world_size, _fused_repeatedly)


def _traced(rank: int, ws: int) -> list[str]:
    """The ops trace under make_fx with fake tensors (their fake kernels give the eager
    results' shapes and strides) and show up in the graph by pyc10d's names."""
    from torch.fx.experimental.proxy_tensor import make_fx

    symm.enable_symm_mem_for_group("0")

    def fn(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        ag, (mm,) = symm.ops.fused_all_gather_matmul(a, [b], 1, "0")
        rs = symm.ops.fused_matmul_reduce_scatter(ag, b, "sum", 1, "0")
        return [ag, mm, rs]

    a, b = torch.rand(2, 4, 8), torch.rand(8, 4 * ws)
    gm = make_fx(fn, tracing_mode="fake")(a, b)
    eager = fn(a, b)
    for node, t in zip([n for n in gm.graph.nodes if n.op == "call_function" and "symm_mem" in str(n.target)],
                       [eager[0], eager[2]]):
        val = node.meta["val"]
        val = val[0] if isinstance(val, (tuple, list)) else val
        assert val.shape == t.shape and val.stride() == t.stride(), (node, val.stride(), t.stride())
    return sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})


def test_ops_trace_with_fake_tensors() -> None:
    targets = run_ranks("shm", 2, _traced)[0]
    assert "pyc10d_symm_mem.fused_all_gather_matmul.default" in targets, targets
    assert "pyc10d_symm_mem.fused_matmul_reduce_scatter.default" in targets, targets


def _all_reduce_in_symmetric_memory(rank: int, ws: int) -> None:
    symm.enable_symm_mem_for_group("0")
    buf = _alloc((5000,), torch.float64)
    for step, (numel, op) in enumerate([(1, "sum"), (3, "max"), (4990, "sum"), (1000, "avg"),
                                        (17, "min"), (257, "product"), (0, "sum")]):
        g = torch.Generator().manual_seed(step)
        xs = [torch.randint(1, 4, (numel,), generator=g).double() for _ in range(ws)]
        want = {"sum": sum(xs) if numel else torch.zeros(0, dtype=torch.float64),
                "avg": sum(xs) / ws, "max": torch.stack(xs).amax(0), "min": torch.stack(xs).amin(0),
                "product": torch.stack(xs).prod(0)}[op]
        t = buf[step:step + numel]  # a view at an offset: peers use the same offset
        t.copy_(xs[rank])
        once = symm.one_shot_all_reduce(t, op)
        assert torch.equal(once, want) and torch.equal(t, xs[rank]), (op, numel)
        assert symm.ops.two_shot_all_reduce_(t, op, "0") is not None
        assert torch.equal(t, want), (op, numel, t, want)
    with pytest.raises(RuntimeError, match="not in symmetric memory"):
        symm.two_shot_all_reduce_(torch.ones(3))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_all_reduce_in_symmetric_memory(world_size: int) -> None:
    run_ranks("shm", world_size, _all_reduce_in_symmetric_memory)


def _all_reduce_with_a_slow_rank(rank: int, ws: int) -> None:
    """The last rank reduces each chunk late, so the others find none of its slices ready
    while they reduce theirs and must wait for them at the end, while the slow rank finds
    all of theirs ready at once: both orders of the polling copy."""
    from pyc10d.symmetric_memory import collectives

    symm.enable_symm_mem_for_group("0")
    if rank == ws - 1:
        fast = collectives._COMBINE["sum"]
        collectives._COMBINE["sum"] = lambda a, b: (time.sleep(0.005), fast(a, b))[1]
    t = _alloc((4099,), torch.float64)
    for step in range(2):  # the second call starts from the signal counts the first left
        xs = [torch.randint(0, 100, (4099,), generator=torch.Generator().manual_seed(10 * step + r)).double()
              for r in range(ws)]
        t.copy_(xs[rank])
        symm.two_shot_all_reduce_(t, "sum", "0")
        assert torch.equal(t, sum(xs)), (step, (t != sum(xs)).nonzero()[:5])


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_reduce_with_a_slow_rank(world_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYC10D_SYMM_CHUNK_BYTES", "1024")  # many chunks (read at each call)
    run_ranks("shm", world_size, _all_reduce_with_a_slow_rank)
