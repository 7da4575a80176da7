"""pyc10d against torch.distributed's Gloo on the same random inputs.

A seeded list of cases (collective, dtype, shape, reduce op, root, world size 2-4) runs once
under ``torch.distributed`` + gloo and once under ``pyc10d`` (with the ring thresholds
patched small, so ring paths are compared too); every rank returns its outputs and the parent
compares them: exactly for integers and bool, ``allclose`` for floating types (the two
implementations sum in different orders). All cases of one world size share one launch.
"""

from __future__ import annotations

import importlib
import random
import zlib
from typing import Any

import pytest
import torch
from _multirank import BACKENDS, run_ranks
from _refs import DTYPES, PATCHED, short

pytestmark = pytest.mark.timeout(60)

SEED = 20240611
N_CASES = 21
OPS = ["all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
       "reduce_scatter_tensor", "gather", "scatter", "all_to_all_single", "all_to_all"]
TOL = {
    torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 5e-2), torch.complex64: (1e-5, 1e-5),
}


def _red_ops(dtype: torch.dtype) -> list[str]:
    if dtype.is_complex:
        return ["SUM", "AVG"]
    if dtype.is_floating_point:
        return ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
    return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def make_cases() -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    cases = []
    for i in range(N_CASES):
        ws, op = 2 + i % 3, OPS[i % len(OPS)]
        dtype = rng.choice(DTYPES)
        while op == "gather" and dtype.is_complex:  # Gloo: "Invalid scalar type"
            dtype = rng.choice(DTYPES)
        prime = rng.choice([3, 13, 1009, 2053, 4099])
        shape = rng.choice([(0,), (1,), (prime,), (prime,), (rng.randrange(1, 200), rng.randrange(1, 9))])
        cases.append({"id": f"{i}-{op}-{short(dtype)}-{'x'.join(map(str, shape))}", "ws": ws, "op": op,
                      "dtype": dtype, "shape": shape, "red": rng.choice(_red_ops(dtype)),
                      "root": rng.randrange(ws), "split_seed": rng.randrange(1 << 30)})
    return cases


CASES = make_cases()


def rand_input(key: str, rank: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Random values over the dtype's range (integers wrap on overflow, floats are not exact)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}|{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) if not dtype.is_complex \
            else torch.randn(shape, generator=g, dtype=torch.complex128).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(1 << 40)), min(info.max, 1 << 40)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def _splits(seed: int, ws: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.choice([0, 1, 2, 5, 17]) for _ in range(ws)] for _ in range(ws)]


def run_case(dist: Any, rank: int, ws: int, case: dict[str, Any]) -> list[torch.Tensor]:
    op, dtype, shape, root = case["op"], case["dtype"], tuple(case["shape"]), case["root"]
    red = getattr(dist.ReduceOp, case["red"])
    rows, rest = shape[0], shape[1:]

    def x(tag: str, shp: tuple[int, ...] = shape, r: int = rank) -> torch.Tensor:
        return rand_input(f"{case['id']}/{tag}", r, dtype, shp)

    def empty(shp: tuple[int, ...] = shape) -> torch.Tensor:
        return torch.empty(shp, dtype=dtype)

    if op == "all_reduce":
        t = x("in")
        dist.all_reduce(t, op=red)
        return [t]
    if op == "reduce":
        t = x("in")
        dist.reduce(t, dst=root, op=red)
        return [t] if rank == root else []
    if op == "broadcast":
        t = x("in")
        dist.broadcast(t, src=root)
        return [t]
    if op == "all_gather":
        outs = [empty() for _ in range(ws)]
        dist.all_gather(outs, x("in"))
        return outs
    if op == "all_gather_into_tensor":
        out = empty((ws * rows, *rest))
        dist.all_gather_into_tensor(out, x("in"))
        return [out]
    if op == "reduce_scatter":
        out = empty()
        dist.reduce_scatter(out, [x(f"in{j}") for j in range(ws)], op=red)
        return [out]
    if op == "reduce_scatter_tensor":
        out = empty()
        dist.reduce_scatter_tensor(out, x("in", (ws * rows, *rest)), op=red)
        return [out]
    if op == "gather":
        outs = [empty() for _ in range(ws)] if rank == root else None
        dist.gather(x("in"), outs, dst=root)
        return outs or []
    if op == "scatter":
        out = empty()
        dist.scatter(out, [x(f"in{j}", r=root) for j in range(ws)] if rank == root else None, src=root)
        return [out]
    splits = _splits(case["split_seed"], ws)  # splits[src][dst] rows
    if op == "all_to_all_single":
        in_splits, out_splits = splits[rank], [splits[s][rank] for s in range(ws)]
        out = empty((sum(out_splits), *rest))
        dist.all_to_all_single(out, x("in", (sum(in_splits), *rest)), out_splits, in_splits)
        return [out]
    if op == "all_to_all":  # Gloo wants equal sizes here (uneven: tests/test_conformance.py)
        outs = [empty() for _ in range(ws)]
        dist.all_to_all(outs, [x(f"in{d}") for d in range(ws)])
        return outs
    raise AssertionError(op)


def run_cases(rank: int, ws: int, dist_module: str, cases: list[dict[str, Any]]) -> dict[str, list]:
    dist = importlib.import_module(dist_module)
    return {case["id"]: [t.clone() for t in run_case(dist, rank, ws, case)] for case in cases}


def _compare(case: dict[str, Any], rank: int, got: list[torch.Tensor], want: list[torch.Tensor]) -> list[str]:
    where = f"case {case['id']} (red {case['red']}, root {case['root']}) rank {rank}"
    if len(got) != len(want):
        return [f"{where}: {len(got)} outputs, gloo has {len(want)}"]
    bad = []
    for i, (g, w) in enumerate(zip(got, want)):
        if g.dtype != w.dtype or g.shape != w.shape:
            bad.append(f"{where} output {i}: {g.dtype}{list(g.shape)} vs gloo {w.dtype}{list(w.shape)}")
        elif w.dtype in TOL:
            rtol, atol = TOL[w.dtype]
            if not torch.allclose(g, w, rtol=rtol, atol=atol):
                bad.append(f"{where} output {i}: max |diff| {(g - w).abs().max().item():.3g}")
        elif not torch.equal(g, w):
            n = int((g != w).sum())
            bad.append(f"{where} output {i}: {n} of {g.numel()} elements differ")
    return bad


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3, 4], ids=lambda w: f"ws{w}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_gloo(backend: str, world_size: int) -> None:
    cases = [c for c in CASES if c["ws"] == world_size]
    assert cases
    want = run_ranks("gloo", world_size, run_cases, "torch.distributed", cases,
                     dist_module="torch.distributed")
    got = run_ranks(backend, world_size, run_cases, "pyc10d", cases, patches=PATCHED)
    bad = []
    for rank in range(world_size):
        for case in cases:
            bad += _compare(case, rank, got[rank][case["id"]], want[rank][case["id"]])
    assert not bad, "pyc10d differs from torch.distributed (gloo):\n" + "\n".join(bad)


def test_cases_cover_every_op_and_world_size() -> None:
    assert {c["op"] for c in CASES} == set(OPS)
    assert {c["ws"] for c in CASES} == {2, 3, 4}
    assert len(CASES) == N_CASES
