"""The tensor-parallel decoding benchmark (``python -m pyc10d.bench --tp``): it runs end to end
on every implementation, and its check fails when the all_reduce does nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pyc10d.bench import tp
from pyc10d.bench.launch import free_port

pytestmark = pytest.mark.timeout(150)


class _Silent:
    """A ``dist`` whose all_reduce does nothing: each rank keeps only its own partial sum."""

    @staticmethod
    def all_reduce(t: torch.Tensor) -> None:
        return None


class _Pair:
    """A ``dist`` for rank 0 of 2 that adds rank 1's partial sums (computed here) as an
    all_reduce would: the sharded stack must then match the one-process one."""

    def __init__(self, other: tp._ByHand) -> None:
        self.other, self.x = other, None

    def all_reduce(self, t: torch.Tensor) -> None:
        w1, w2 = self.other.layers[self.layer]  # (out, in) shards, as nn.Linear keeps them
        t += _apply(self.x, w1, w2)


def _apply(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    linear = torch.nn.functional.linear
    return linear(torch.nn.functional.gelu(linear(x, w1)), w2)


def _run_pair(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Rank 0's shards with an all_reduce made of rank 1's shards, layer by layer."""
    one = tp._ByHand(model, None, 1, 2)
    zero = tp._ByHand(model, None, 0, 2)
    pair = _Pair(one)
    for i, (w1, w2) in enumerate(zero.layers):
        pair.layer, pair.x = i, x
        part = _apply(x, w1, w2)
        pair.all_reduce(part)
        x = x + part
    return x


def test_the_check_passes_sharded_and_fails_without_all_reduce() -> None:
    model = tp._stack(64, 3)
    xs = tp._inputs(64, 4)
    with torch.no_grad():
        want = torch.stack([model(x) for x in xs])
        sharded = torch.stack([_run_pair(model, x) for x in xs])
        silent = tp._ByHand(model, _Silent(), 0, 2)
        broken = torch.stack([silent(x) for x in xs])
    assert tp.relative_error(sharded, want) <= tp.TOLERANCE
    assert tp.relative_error(broken, want) > 5 * tp.TOLERANCE
    assert not tp.relative_error(torch.full_like(want, float("nan")), want) <= tp.TOLERANCE


#: One of each code path (one process, shards by hand, DTensor); the plugin and Gloo run the
#: by-hand and DTensor code of these with another backend name (``make bench``'s full run).
IMPLS = ["single", "pyc10d-shm", "dtensor-pyc10d_shm"]


# make test: DTensor's, the path nothing else in make test runs over real ranks (the by-hand
# shards run in the test above and, over two ranks, in test_the_example_decodes_right);
# make test-full: all three in one driver call.
@pytest.mark.interpreters
@pytest.mark.parametrize("impls", [pytest.param(["dtensor-pyc10d_shm"], id="dtensor"),
                                   pytest.param(IMPLS, id="all", marks=pytest.mark.full)])
def test_each_kind_of_implementation_decodes_and_is_checked(tmp_path: Path, impls: list[str]) -> None:
    cmd = [sys.executable, "-m", "pyc10d.bench", "--tp", "--dim", "64", "--layers", "2", "--tokens", "4",
           "--blocks", "1", "--rounds", "1", "--timeout", "120", "--impls", ",".join(impls), "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=140)
    assert res.returncode == 0, res.stdout + res.stderr
    (path,) = tmp_path.glob("tp-*.json")
    recs = json.loads(path.read_text())["records"]
    assert sorted(r["impl"] for r in recs) == sorted(impls)
    for r in recs:
        assert r["checked"] and r["ms_per_token"] > 0 and r["max_rel_err"] <= tp.TOLERANCE, r


@pytest.mark.interpreters
def test_the_example_decodes_right() -> None:
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "pyc10d.run", "--nproc-per-node", "2", "--start-method", "fork",
           "--master-port", str(free_port()),
           str(root / "examples" / "tp_inference.py"),
           "--dim", "128", "--layers", "2", "--tokens", "4"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=100, cwd=root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 tokens, 2 layers, d=128, 2 ranks" in res.stdout and "ms/token" in res.stdout, res.stdout
