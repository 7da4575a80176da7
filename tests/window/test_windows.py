"""One-sided windows (torch 2.14's ``dist._new_window``, ``pyc10d/window/``): put, signal,
wait_signal and map_remote_tensor on shared memory (mapped) and over tcp and threads
(messages), on pyc10d's API and through the plugin; wrong use refused with the group still
usable; a peer's death ends a wait at once, naming it.

Every check compares with values the ranks computed independently (each rank knows what every
peer wrote); a window that dropped, misplaced or reordered a put fails them.
"""

from __future__ import annotations

import importlib
import os
import time
import types
from datetime import timedelta
from typing import Any

import pytest
import torch
from _multirank import exited, failure_after, run_ranks

from pyc10d.torch_version import AT_LEAST_2_14

pytestmark = pytest.mark.timeout(45)
needs_2_14 = pytest.mark.skipif(not AT_LEAST_2_14, reason="torch 2.13 has no dist._new_window")
NATIVE = ["shm", "tcp", "threaded"]
PLUGIN = [pytest.param(b, marks=needs_2_14) for b in ("pyc10d_shm", "pyc10d_tcp")]
MAPS = {"shm", "pyc10d_shm"}  # the backends whose windows map a peer's tensor


def _short(seconds: float) -> Any:
    """Options with a timeout, torch's own type where the module is torch's."""
    try:
        from torch._C._distributed_c10d import WaitSignalOptions  # (torch 2.14)
    except ImportError:
        return types.SimpleNamespace(timeout=timedelta(seconds=seconds))
    opts = WaitSignalOptions()
    opts.timeout = timedelta(seconds=seconds)
    return opts


def _error(call: Any) -> str:
    try:
        call()
    except (RuntimeError, ValueError) as e:
        return f"{type(e).__name__}|{isinstance(e, RuntimeError)}|{e}"
    return "no error"


def _one_sided(rank: int, ws: int, module: str, backend: str) -> dict[str, Any]:
    d = importlib.import_module(module)
    out: dict[str, Any] = {"supports": d._supports_window()}
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    # A ring: each rank writes 2 elements into the next rank's tensor at an offset of its own.
    t = torch.arange(8.0) + 100 * rank
    win = d._new_window(t)
    win.put(torch.full((2,), 10.0 * rank + 1), nxt, 2 * rank)
    win.signal(nxt)
    win.wait_signal(prv)
    out["ring"] = t.tolist()
    d.barrier()  # (before the next puts into this tensor)
    # Issue order: 40 puts to one place, then one signal: the last one is what stays.
    for k in range(40):
        win.put(torch.tensor([1000.0 * rank + k]), nxt, 7)
    win.signal(nxt)
    win.wait_signal(prv)
    out["last"] = t[7].item()
    # Counting: three signals before any wait release exactly three waits.
    for _ in range(3):
        win.signal(nxt)
    d.barrier()
    for _ in range(3):
        win.wait_signal(prv)
    t0 = time.monotonic()
    try:
        win.wait_signal(prv, opts=_short(0.3))
        out["fourth"] = "no error"
    except RuntimeError as e:
        out["fourth"] = failure_after(t0, e)
    # An asynchronous wait: not complete before the signal, complete after it.
    work = win.wait_signal(prv, async_op=True)
    out["early"] = work.is_completed()
    d.barrier()
    win.signal(nxt)
    out["async"] = work.wait()
    # Wrong use, on every rank at once: refused here, nothing sent.
    errors = {
        "offset": _error(lambda: win.put(torch.ones(3), nxt, 7)),
        "negative": _error(lambda: win.put(torch.ones(1), nxt, -1)),
        "rank": _error(lambda: win.put(torch.ones(1), ws, 0)),
        "rank_wait": _error(lambda: win.wait_signal(-1)),
        "dtype": _error(lambda: win.put(torch.ones(1, dtype=torch.float64), nxt, 0)),
        "layout": _error(lambda: win.put(torch.ones(4, 2).t(), nxt, 0)),
    }
    blank = d._new_window()
    errors["unregistered"] = _error(lambda: blank.put(torch.ones(1), nxt, 0))
    errors["unregistered_signal"] = _error(lambda: blank.signal(nxt))
    out["errors"] = errors
    # The group and the window still work.
    x = torch.tensor([float(rank)])
    d.all_reduce(x)
    out["after"] = x.item()
    # A second window, sizes and dtypes of each rank's own, 1 MiB and more crossing the wire,
    # and puts that land while the target runs collectives (tcp: read by the caller's lane).
    big = torch.full((300_000 + 1000 * rank,), -1, dtype=torch.int32)
    blank.tensor_register(big)
    payload = torch.arange(300_000, dtype=torch.int32) * (rank + 1)
    blank.put(payload[:262_144], nxt, 1000 * nxt + 5)
    for _ in range(10):
        d.all_reduce(torch.ones(4))
    blank.signal(nxt)
    blank.wait_signal(prv)
    lo = 1000 * rank + 5
    out["big_ok"] = (torch.equal(big[lo:lo + 262_144], torch.arange(262_144, dtype=torch.int32) * (prv + 1))
                     and bool((big[:lo] == -1).all()) and bool((big[lo + 262_144:] == -1).all()))
    # map_remote_tensor: a peer's tensor itself where the memory maps, else refused.
    if backend in MAPS:
        peer = win.map_remote_tensor(nxt)
        out["mapped"] = peer.tolist()
        d.barrier()
        peer[0] = -7.0 - rank  # a plain write into the peer's memory
        win.signal(nxt)
        win.wait_signal(prv)
        out["written"] = t[0].item()
    else:
        out["mapped"] = _error(lambda: win.map_remote_tensor(nxt))
        out["own"] = win.map_remote_tensor(rank) is t
    # Deregister: the tensor keeps its contents; the window refuses puts until a new register.
    d.barrier()
    before = t.clone()
    win.tensor_deregister()
    out["kept"] = torch.equal(t, before)
    out["after_deregister"] = _error(lambda: win.put(torch.ones(1), nxt, 0))
    again = torch.zeros(4)
    win.tensor_register(again)
    win.put(torch.tensor([rank + 0.5]), nxt, 3)
    win.signal(nxt)
    win.wait_signal(prv)
    out["again"] = again.tolist()
    t[1] = 555.0  # the old tensor is private again: no peer sees this
    d.barrier()
    return out


def _check(results: list[dict[str, Any]], ws: int, backend: str) -> None:
    for rank, r in enumerate(results):
        prv = (rank - 1) % ws
        ring = [100.0 * rank + k for k in range(8)]
        ring[2 * prv:2 * prv + 2] = [10.0 * prv + 1] * 2
        assert r["supports"] is True
        assert r["ring"] == ring, (rank, r["ring"])
        assert r["last"] == 1000.0 * prv + 39
        assert "Timed out after 0.3s waiting for a signal from rank" in r["fourth"], r["fourth"]
        assert float(r["fourth"].split()[0]) < 5
        assert r["early"] is False and r["async"] is True
        e = r["errors"]
        assert "do not fit in rank" in e["offset"] and "7" in e["offset"], e
        assert "do not fit" in e["negative"], e
        assert f"rank {ws} is not in group" in e["rank"], e
        assert "rank -1 is not in group" in e["rank_wait"], e
        assert "float64" in e["dtype"] and "float32" in e["dtype"], e
        assert "contiguous" in e["layout"], e
        assert "no tensor is registered" in e["unregistered"], e
        assert "no tensor is registered" in e["unregistered_signal"], e
        assert all(v.split("|")[1] == "True" for v in e.values()), e  # RuntimeErrors, as torch's checks
        assert r["after"] == sum(range(ws))
        assert r["big_ok"] is True, rank
        nxt = (rank + 1) % ws
        if backend in MAPS:
            peer = results[nxt]["ring"][:]
            peer[7] = 1000.0 * rank + 39
            assert r["mapped"] == peer, (rank, r["mapped"])
            assert r["written"] == -7.0 - prv
        else:
            assert "cannot map rank" in r["mapped"] and "put and signal" in r["mapped"], r["mapped"]
            assert r["own"] is True
        assert r["kept"] is True
        assert "no tensor is registered" in r["after_deregister"]
        assert r["again"] == [0.0, 0.0, 0.0, prv + 0.5]


@pytest.mark.parametrize("backend", NATIVE)
def test_one_sided(backend: str) -> None:
    _check(run_ranks(backend, 3, _one_sided, "pyc10d", backend, timeout=40), 3, backend)


@pytest.mark.parametrize("backend", PLUGIN)
def test_one_sided_plugin(backend: str) -> None:
    results = run_ranks(backend, 3, _one_sided, "torch.distributed", backend, timeout=40,
                        dist_module="torch.distributed")
    _check(results, 3, backend)
    assert " torch DistTimeoutError" in results[0]["fourth"]  # torch's type through the plugin


def _unsupported(rank: int, ws: int, module: str) -> dict[str, Any]:
    d = importlib.import_module(module)
    return {"supports": d._supports_window(), "new": _error(lambda: d._new_window(torch.zeros(2)))}


def test_fake_has_none() -> None:
    for r in run_ranks("fake", 2, _unsupported, "pyc10d"):
        assert r["supports"] is False and "does not support new_window" in r["new"], r


def _death(rank: int, ws: int, module: str) -> str:
    d = importlib.import_module(module)
    win = d._new_window(torch.zeros(4))
    d.barrier()
    if rank == 1:
        time.sleep(0.5)
        os._exit(0)
    t0 = time.monotonic()
    try:
        win.wait_signal(1)
        return "no error"
    except RuntimeError as e:
        return failure_after(t0, e)


@pytest.mark.parametrize("backend", ["shm", "tcp", pytest.param("pyc10d_shm", marks=needs_2_14)])
def test_peer_death_ends_the_wait(backend: str) -> None:
    module = "torch.distributed" if backend.startswith("pyc10d") else "pyc10d"
    results = run_ranks(backend, 2, _death, module, timeout=40, pg_timeout=20, may_exit=(1,), dist_module=module)
    assert exited(results[1])
    seconds, *_ = results[0].split()
    assert "rank 1" in results[0] and "Window.wait_signal" in results[0], results[0]
    assert float(seconds) < 5, results[0]  # not the 20 s timeout
