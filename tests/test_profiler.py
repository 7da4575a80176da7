"""Collectives in torch.profiler traces: every native and plugin call shows as ``pyc10d:<op>``
with bytes, dtype, group and sequence number, its algorithm and its waits for peers nested in
it, in the Chrome trace torch exports."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest
import torch
from torch.profiler import profile

from tests._multirank import run_ranks

pytestmark = pytest.mark.timeout(45)


def _events(prof: Any) -> list[dict[str, Any]]:
    """The pyc10d events of ``prof``'s exported Chrome trace (the file a user would open)."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return [e for e in trace["traceEvents"] if e.get("name", "").startswith("pyc10d:") and e.get("ph") == "X"]


def _native(rank: int, world_size: int) -> list[dict[str, Any]]:
    import pyc10d as dist

    t = torch.ones(1000)  # 4000 B: the direct all-reduce on tcp, the flat one on shm
    big = torch.ones(300_000)  # 1.2 MB: the ring on tcp
    outs = [torch.empty(4) for _ in range(world_size)]
    with profile(record_shapes=True) as prof:
        dist.all_reduce(t)
        dist.broadcast(big, src=0)
        dist.all_gather(outs, torch.full((4,), float(rank)))
        if rank == 0:
            dist.send(torch.ones(3, 5), dst=1)
        else:
            dist.recv(torch.empty(3, 5), src=0)
        dist.barrier()
    assert outs[1][0].item() == 1.0
    return _events(prof)


def _by_name(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["name"] == name]


def _inside(child: dict[str, Any], parent: dict[str, Any]) -> bool:
    return (child["tid"] == parent["tid"] and parent["ts"] <= child["ts"]
            and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"] + 1)


@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_native_calls_show_in_trace(backend: str) -> None:
    results = run_ranks(backend, 2, _native)
    for rank, events in enumerate(results):
        want = {"pyc10d:allreduce": 4000, "pyc10d:broadcast": 1_200_000, "pyc10d:allgather": 32,
                "pyc10d:barrier": 0, "pyc10d:send" if rank == 0 else "pyc10d:recv": 60}
        seqs = []
        for name, nbytes in want.items():
            found = _by_name(events, name)
            assert len(found) == 1, f"rank {rank}: {name}: {len(found)} events in {[e['name'] for e in events]}"
            args = found[0]["args"]
            assert args["bytes"] == nbytes, (rank, name, args)
            assert args["group"] and args["backend"] == backend, (rank, name, args)
            if nbytes:
                assert args["dtype"] == "float32" and args["Input Dims"], (rank, name, args)
            assert isinstance(args["seq"], int) and args["seq"] > 0, (rank, name, args)
            if name not in ("pyc10d:send", "pyc10d:recv"):
                seqs.append(args["seq"])
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), (rank, seqs)  # issue order
        # the algorithm and the waits for the peer nest inside their operation
        op = _by_name(events, "pyc10d:allreduce")[0]
        algos = [e for e in events if e["args"].get("algorithm") and _inside(e, op)]
        assert algos, f"rank {rank}: no algorithm range inside allreduce"
        waits = [e for e in _by_name(events, "pyc10d:wait") if _inside(e, op)]
        assert waits, f"rank {rank}: no wait range inside allreduce"
        if backend == "tcp":
            bcast = _by_name(events, "pyc10d:broadcast")[0]
            assert [e for e in events if e["args"].get("algorithm") and _inside(e, bcast)]


def _plugin(rank: int, world_size: int) -> list[dict[str, Any]]:
    import torch.distributed as dist

    import pyc10d.torch_backend  # noqa: F401 - the plugin

    t = torch.ones(2, 8)
    with profile(record_shapes=True) as prof:
        dist.all_reduce(t)
        dist.all_reduce(t)
        dist.broadcast(t, src=1)
    assert t[0, 0].item() == 4.0
    return _events(prof)


def test_plugin_calls_show_in_trace() -> None:
    results = run_ranks("pyc10d_shm", 2, _plugin, dist_module="torch.distributed")
    for rank, events in enumerate(results):
        ops = [e for e in events if e["name"] in ("pyc10d:allreduce", "pyc10d:broadcast")]
        assert [e["name"] for e in sorted(ops, key=lambda e: e["ts"])] == [
            "pyc10d:allreduce", "pyc10d:allreduce", "pyc10d:broadcast"], (rank, events)
        assert all(e["args"]["bytes"] == 64 and e["args"]["backend"] == "shm" for e in ops), (rank, ops)
        seqs = [e["args"]["seq"] for e in sorted(ops, key=lambda e: e["ts"])]
        assert seqs == list(range(seqs[0], seqs[0] + 3)), (rank, seqs)
        assert any(e["name"] == "pyc10d:wait" and _inside(e, ops[0]) for e in events), rank


def test_no_profiler_no_range() -> None:
    """Off: the hook is one flag, and torch's flag is what it reads."""
    from torch.autograd import profiler as torch_profiler

    from pyc10d.algorithms import profiling

    assert not profiling.on()
    with profile():
        assert profiling.on() and torch_profiler._is_profiler_enabled
    assert not profiling.on()


def _async(rank: int, world_size: int) -> list[dict[str, Any]]:
    import time

    import pyc10d as dist

    ts = [torch.ones(4) for _ in range(3)]
    with profile(record_shapes=True) as prof:
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        time.sleep(0.3)  # the progress thread runs them, off the profiled thread
        for w in works:
            w.wait()
    assert all(t[0].item() == 2.0 for t in ts)
    return _events(prof)


def test_async_ops_are_marked_where_they_were_issued() -> None:
    for rank, events in enumerate(run_ranks("tcp", 2, _async)):
        queued = _by_name(events, "pyc10d:allreduce (queued)")
        ran = _by_name(events, "pyc10d:allreduce")  # those a waiter ran itself, if any
        assert len(queued) == 3, (rank, [e["name"] for e in events])
        assert [e["args"]["seq"] for e in queued] == [1, 2, 3] and all(e["args"]["bytes"] == 16 for e in queued)
        assert {e["args"]["seq"] for e in ran} <= {1, 2, 3}
