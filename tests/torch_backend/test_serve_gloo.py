"""pyc10d serving torch's name ``"gloo"`` (``serve_gloo()`` / ``PYC10D_SERVE_GLOO``), and only then.

Frameworks that hard-code ``init_process_group("gloo")`` (accelerate on CPU) get pyc10d's engine
when the user asks: the groups torch builds for the name are pyc10d's, their results are Gloo's;
without the request Gloo is Gloo; a request that cannot act warns; a group pyc10d cannot serve
is refused, naming the setting.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _multirank import run_ranks

import pyc10d.torch_backend as tb
from pyc10d import info
from pyc10d.torch_backend import gloo_name

pytestmark = pytest.mark.timeout(40)


@pytest.fixture
def served() -> Iterator[None]:
    """The name served by pyc10d in this process (and the ranks it forks), then Gloo again."""
    tb.serve_gloo()
    try:
        yield
    finally:
        tb.stop_serving_gloo()


def _what_serves(rank: int, ws: int, sub_backend: str | None) -> dict[str, Any]:
    """Which object serves the default group and a subgroup, and a few collectives' results."""
    world = dist.group.WORLD
    sub = dist.new_group(backend=sub_backend)
    x = torch.arange(4, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(x)
    out = [torch.zeros(2) for _ in range(ws)]
    dist.all_gather(out, torch.full((2,), float(rank)), group=sub)
    b = torch.tensor([rank + 10])
    dist.broadcast(b, src=1, group=sub)
    return {"world": type(world).__name__, "sub": type(sub).__name__, "name": dist.get_backend(),
            "sub_name": dist.get_backend(sub), "repr": repr(world), "engine": type(getattr(world, "engine", None)).__name__,
            "sum": x.tolist(), "gathered": [t.tolist() for t in out], "bcast": b.item()}


@pytest.mark.parametrize("sub_backend", ["gloo", pytest.param(None, marks=pytest.mark.full)])
def test_gloo_runs_on_pyc10d_when_served(served: None, sub_backend: str | None) -> None:
    ours = run_ranks("gloo", 2, _what_serves, sub_backend, dist_module="torch.distributed")
    for r in ours:
        assert (r["world"], r["sub"]) == ("GlooServedGroup", "GlooServedGroup")
        assert r["engine"] in ("ShmBackend", "TCPBackend") and "serving 'gloo'" in r["repr"]
        assert (r["name"], r["sub_name"]) == ("gloo", "gloo")  # torch keeps the name it was asked
    tb.stop_serving_gloo()
    ref = run_ranks("gloo", 2, _what_serves, sub_backend, dist_module="torch.distributed")
    for a, b in zip(ours, ref):
        assert (a["sum"], a["gathered"], a["bcast"]) == (b["sum"], b["gathered"], b["bcast"])


def test_without_the_request_gloo_is_gloo() -> None:
    assert tb.gloo_served_by() is None
    ref = run_ranks("gloo", 2, _what_serves, "gloo", dist_module="torch.distributed")
    for r in ref:
        assert (r["world"], r["sub"], r["engine"]) == ("ProcessGroup", "ProcessGroup", "NoneType")


def _mixed(rank: int, ws: int) -> str:
    try:
        dist.new_group(backend="cpu:gloo,cuda:nccl")
    except RuntimeError as e:
        return str(e)
    return "built"


def test_a_group_pyc10d_cannot_serve_is_refused_naming_the_setting(served: None) -> None:
    # "cpu:gloo,cuda:nccl" (torch's default on a CUDA machine): a pyc10d group would serve both
    # devices and drop NCCL without a word
    for msg in run_ranks("gloo", 2, _mixed, dist_module="torch.distributed"):
        assert "PYC10D_SERVE_GLOO" in msg and "cpu:gloo,cuda:nccl" in msg


def _refused_tensor(rank: int, ws: int) -> list[str]:
    try:
        dist.all_reduce(torch.ones(2, device="meta"))
    except ValueError as e:  # pyc10d's DistInputError
        return list(getattr(e, "__notes__", []))
    return []


def test_a_refused_argument_names_the_setting(served: None) -> None:
    for notes in run_ranks("gloo", 2, _refused_tensor, dist_module="torch.distributed"):
        assert any("PYC10D_SERVE_GLOO" in n for n in notes), notes


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-W", "always::RuntimeWarning", "-c", code], capture_output=True,
                          text=True, timeout=35, env={**os.environ, **env}, cwd="/")


PROBE = ("import torch, torch.distributed as d; d.init_process_group('gloo', store=d.HashStore(), rank=0, "
         "world_size=1); x = torch.ones(2); d.all_reduce(x); print(type(d.group.WORLD).__name__, x.tolist())")


@pytest.mark.interpreters
def test_the_setting_acts_at_import_torch() -> None:
    out = _python(PROBE, PYC10D_SERVE_GLOO="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "GlooServedGroup"


@pytest.mark.interpreters
def test_the_setting_where_it_cannot_act_warns() -> None:
    out = _python("import pyc10d.torch_backend\n" + PROBE.replace("; ", "\n"),
                  PYC10D_SERVE_GLOO="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "ProcessGroup"  # Gloo, as the warning says
    assert "PYC10D_SERVE_GLOO=1 is set but does not act" in out.stderr


def test_setting_values() -> None:
    assert [gloo_name.engine_from(v) for v in (None, "", "0", "off", "1", "yes", "shm", "TCP")] == \
        [None, None, None, None, "auto", "auto", "shm", "tcp"]
    with pytest.raises(ValueError, match="PYC10D_SERVE_GLOO='nccl'"):
        gloo_name.engine_from("nccl")


def test_info_says_who_serves_gloo(served: None) -> None:
    assert info.gloo_name()["served_by"] == "auto"
    assert "gloo        served by pyc10d's auto engine" in info.render(info.collect())
    tb.stop_serving_gloo()
    assert info.gloo_name()["served_by"] is None


def _serve_after_init(rank: int, ws: int) -> list[str]:
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tb.serve_gloo()
    tb.stop_serving_gloo()
    return [str(w.message) for w in seen]


def test_serving_after_the_default_group_was_built_on_gloo_warns() -> None:
    for said in run_ranks("gloo", 2, _serve_after_init, dist_module="torch.distributed"):
        assert any("default group was built before and stays torch's Gloo" in m for m in said), said
