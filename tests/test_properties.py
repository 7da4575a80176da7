"""Property: any collective call either returns what a float64/int64 reference computes, or
raises a clear error on every rank, after which the same group still works.

Hypothesis draws the examples — collective, dtype, reduce op, shape, root, all_to_all splits,
device, backend — in the parent (derandomized: the same examples every run); each backend's
examples then run in one set of rank processes (starting ranks per example would cost more
than the examples), on the native API (shm, tcp, threaded) and through the torch.distributed
plugin (pyc10d_shm, pyc10d_tcp). An example that the table (``pyc10d.backends.accepts``) says
is accepted must succeed; one it refuses must raise. ``PYC10D_PROPERTY_EXAMPLES`` sets the
number of examples per test (``make fuzz`` runs thousands; ``make test`` a bounded few).
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
from _multirank import run_ranks
from _reduce_ref import inputs, reference, same
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import pyc10d.torch_backend  # noqa: F401 - registers pyc10d_shm / pyc10d_tcp with torch
from pyc10d.backends import accepts
from pyc10d.settings import PROPERTY_EXAMPLES
from pyc10d.types import RedOpType

EXAMPLES = PROPERTY_EXAMPLES.get()
WS = 2
COLLECTIVES = ["all_reduce", "reduce", "broadcast", "reduce_scatter_tensor", "all_gather_into_tensor",
               "all_to_all_single"]
REDUCING = {"all_reduce", "reduce", "reduce_scatter_tensor"}
DTYPES = ["float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "complex64",
          "complex128", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
          "bits8", "bits16", "int4"]
OPS = [o.name for o in accepts.OPS]

EXAMPLE = st.fixed_dictionaries({
    "collective": st.sampled_from(COLLECTIVES),
    "dtype": st.sampled_from(DTYPES),
    "op": st.sampled_from(OPS),
    "shape": st.lists(st.integers(0, 5), max_size=3).map(tuple),
    # Mostly valid; -1 and WS (out of range) one time in four.
    "root": st.integers(0, 7).map(lambda i: i % WS if i < 6 else (-1 if i == 6 else WS)),
    # None (even split), one split per rank, or a list of any length (the wrong one refused).
    "splits": st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=WS, max_size=WS),
                        st.lists(st.integers(0, 3), min_size=1, max_size=3)),
    "corrupt_splits": st.integers(0, 5).map(lambda i: i == 0),  # one in six: sums do not add up
    "device": st.integers(0, 9).map(lambda i: "meta" if i == 0 else "cpu"),
    "seed": st.integers(0, 1 << 16),
})


def _draw(backends: list[str]) -> dict[str, list[dict]]:
    """``EXAMPLES`` examples, each with a backend, grouped by backend."""
    drawn: list[dict] = []

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, phases=[Phase.generate],
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(EXAMPLE, st.sampled_from(backends))
    def collect(example: dict, backend: str) -> None:
        drawn.append({**example, "backend": backend})

    collect()
    return {b: [e for e in drawn if e["backend"] == b] for b in backends}


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _accepted(ex: dict) -> bool:
    """What the table (and the arguments' validity) promise for ``ex``."""
    dtype, coll = _dtype(ex["dtype"]), ex["collective"]
    if ex["device"] != "cpu" or dtype not in accepts.MOVABLE:
        return False
    if coll in REDUCING and accepts.support(dtype, RedOpType[ex["op"]]) is False:
        return False
    if coll in ("reduce", "broadcast") and not 0 <= ex["root"] < WS:
        return False
    if coll == "all_to_all_single" and (ex["corrupt_splits"] or (ex["splits"] is not None and len(ex["splits"]) != WS)):
        return False
    return True


def _matrix(ex: dict) -> list[list[int]]:
    """Rows each rank sends each peer: ``S[r][p]`` (the same on every rank)."""
    splits = ex["splits"]
    if splits is None or len(splits) != WS:
        n = max(1, len(splits or [])) * 2
        return [[n] * WS for _ in range(WS)]
    return [[splits[(r + p) % WS] for p in range(WS)] for r in range(WS)]


def _run_one(dist: Any, rank: int, ex: dict) -> tuple[Any, Any]:
    """Run ``ex`` on this rank: (what it produced, what it should have)."""
    dtype, coll, op_name = _dtype(ex["dtype"]), ex["collective"], ex["op"]
    op = (dist._make_nccl_premul_sum(2.0) if hasattr(dist, "_make_nccl_premul_sum") else dist._make_premul_sum(2.0)) \
        if op_name == "PREMUL_SUM" else getattr(dist.ReduceOp, op_name)
    red = RedOpType[op_name]
    shape = ex["shape"]
    numel = 1
    for s in shape:
        numel *= s
    dev = ex["device"]

    def on(t: torch.Tensor) -> torch.Tensor:
        return t if dev == "cpu" else torch.empty_like(t, device=dev)

    if coll in ("all_reduce", "reduce", "broadcast"):
        xs = inputs(dtype, WS, shape, ex["seed"])
        t = on(xs[rank].clone())
        if coll == "all_reduce":
            dist.all_reduce(t, op=op)
            return t, reference(xs, red)
        if coll == "reduce":
            dist.reduce(t, dst=ex["root"], op=op)
            return (t, reference(xs, red)) if rank == ex["root"] else (None, None)
        dist.broadcast(t, src=ex["root"])
        return t, xs[ex["root"]]
    if coll == "reduce_scatter_tensor":
        xs = inputs(dtype, WS, numel * WS, ex["seed"])
        out = on(torch.empty(numel, dtype=dtype))
        dist.reduce_scatter_tensor(out, on(xs[rank].clone()), op=op)
        return out, reference(xs, red)[rank * numel:(rank + 1) * numel]
    if coll == "all_gather_into_tensor":
        xs = inputs(dtype, WS, numel, ex["seed"])
        out = on(torch.empty(numel * WS, dtype=dtype))
        dist.all_gather_into_tensor(out, on(xs[rank].clone()))
        return out, torch.cat(xs)
    S = _matrix(ex)  # all_to_all_single
    xs = [inputs(dtype, 1, sum(S[r]), ex["seed"] + r)[0] for r in range(WS)]
    in_splits = list(S[rank]) if ex["splits"] is not None else None
    out_splits = [S[p][rank] for p in range(WS)] if ex["splits"] is not None else None
    if ex["corrupt_splits"]:
        in_splits = [s + 1 for s in (in_splits or S[rank])]
    if ex["splits"] is not None and len(ex["splits"]) != WS:  # a split list of the wrong length
        in_splits = out_splits = list(ex["splits"])
    out = on(torch.empty(sum(S[p][rank] for p in range(WS)), dtype=dtype))
    dist.all_to_all_single(out, on(xs[rank].clone()), out_splits, in_splits)
    want = torch.cat([xs[p][sum(S[p][:rank]):sum(S[p][:rank + 1])] for p in range(WS)])
    return out, want


def _examples(rank: int, ws: int, module: str, examples: list[dict]) -> list[str]:
    """Every example, then a float32 all_reduce; one line per problem."""
    dist = importlib.import_module(module)
    problems = []
    for i, ex in enumerate(examples):
        what = f"example {i} {ex}"
        try:
            got, want = _run_one(dist, rank, ex)
            if not _accepted(ex):
                problems.append(f"rank {rank}: {what}: the table refuses it, yet it ran")
            elif got is not None and not same(got, want):
                problems.append(f"rank {rank}: {what}: got {got.reshape(-1)[:6]}, want {want.reshape(-1)[:6]}")
        except Exception as e:  # noqa: BLE001 - the error is what is checked
            if _accepted(ex):
                problems.append(f"rank {rank}: {what}: accepted by the table, yet {type(e).__name__}: {e}")
            elif not isinstance(e, (RuntimeError, ValueError, TypeError)) or len(str(e)) < 15:
                problems.append(f"rank {rank}: {what}: unclear error {type(e).__name__}: {e}")
        probe = torch.full((3,), float(rank + 1))
        try:
            dist.all_reduce(probe)
            if probe.tolist() != [3.0] * 3:
                problems.append(f"rank {rank}: after {what}: the next all_reduce gave {probe.tolist()}")
        except Exception as e:  # noqa: BLE001
            problems.append(f"rank {rank}: after {what}: the group is broken: {type(e).__name__}: {e}")
            break
    return problems


def _check(backend: str, module: str, examples: list[dict]) -> None:
    if not examples:
        return
    results = run_ranks(backend, WS, _examples, module, examples, dist_module=module, pg_timeout=15,
                        timeout=30 + 0.5 * len(examples))
    problems = [p for r in results for p in r]
    assert not problems, "\n".join(problems[:20])


_TIMEOUT = 55 + EXAMPLES // 2


@pytest.mark.timeout(_TIMEOUT)
def test_native_api_matches_the_reference_or_refuses_cleanly() -> None:
    drawn = _draw(["shm", "tcp", "threaded"])
    assert sum(map(len, drawn.values())) >= EXAMPLES * 0.8
    for backend, examples in drawn.items():
        _check(backend, "pyc10d", examples)


@pytest.mark.timeout(_TIMEOUT)
def test_plugin_matches_the_reference_or_refuses_cleanly() -> None:
    drawn = _draw(["pyc10d_shm", "pyc10d_tcp"])
    for backend, examples in drawn.items():
        _check(backend, "torch.distributed", examples)
