"""Asynchronous calls on the lean lane (``LaneOps._start_step``, ``StartedWork``).

An ``async_op=True`` call of a key the lane serves posts this rank's part on the issuing
thread and returns a ``StartedWork``; what remains (waiting for the peers' posts, writing
the output) runs when it is needed: in ``wait``, at the group's next operation, in
``is_completed`` once it needs no wait, or on the progress thread (a future, a bounded
wait, a peer that is late at the next issue). These tests check the results on every such
path, that issuing never waits for a late peer (nor deadlocks a program whose peer needs
this rank's next step first), and that failures are still named at ``wait``.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
from datetime import timedelta
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _clock import bound
from _multirank import exited, failure_after, run_ranks

pytestmark = pytest.mark.timeout(45)


def _started(work) -> bool:
    """Whether ``work`` (pyc10d's, or the plugin's ``TorchWork``) was started on the lane."""
    from pyc10d.backends.work import StartedWork

    return isinstance(getattr(work, "_work", work), StartedWork)


def _backend(module: str) -> str:
    return "shm" if module == "pyc10d" else "pyc10d_shm"


def _every_op(rank: int, ws: int, module: str) -> dict:
    """Rounds of five async calls (all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
    broadcast, barrier) issued back to back from poisoned outputs, then every Work waited."""
    dist = importlib.import_module(module)
    k = 5
    bad, kinds = [], []
    dist.barrier()  # the group's first operation opens its arena; the lane builds steps after
    for i in range(6):
        ar = torch.full((k,), float(rank + 1 + i))
        ag = torch.full((ws * k,), -7.0)
        rs_in = torch.arange(ws * k, dtype=torch.float64) * (rank + 1) + i
        rs = torch.full((k,), -7.0, dtype=torch.float64)
        bc = torch.full((3,), float(rank + 10 * i)) if rank == i % ws else torch.full((3,), -7.0)
        works = [dist.all_reduce(ar, async_op=True),
                 dist.all_gather_into_tensor(ag, torch.full((k,), float(rank + i)), async_op=True),
                 dist.reduce_scatter_tensor(rs, rs_in, async_op=True),
                 dist.broadcast(bc, src=i % ws, async_op=True),
                 dist.barrier(async_op=True)]
        kinds.append([_started(w) for w in works])
        for w in works:
            assert w.wait()
        total = ws * (ws + 1) / 2
        if not torch.equal(ar, torch.full((k,), total + ws * i)):
            bad.append(f"{i} all_reduce {ar.tolist()}")
        if not torch.equal(ag, torch.cat([torch.full((k,), float(r + i)) for r in range(ws)])):
            bad.append(f"{i} all_gather {ag.tolist()}")
        want = sum((torch.arange(ws * k, dtype=torch.float64) * (r + 1) + i)[rank * k:(rank + 1) * k]
                   for r in range(ws))
        if not torch.equal(rs, want):
            bad.append(f"{i} reduce_scatter {rs.tolist()}")
        if not torch.equal(bc, torch.full((3,), float(i % ws + 10 * i))):
            bad.append(f"{i} broadcast {bc.tolist()}")
    return {"bad": bad, "kinds": kinds}


@pytest.mark.parametrize("module,world_size", [("pyc10d", 2), ("pyc10d", 3), ("torch.distributed", 2)])
def test_async_calls_of_every_lane_op_are_started_and_right(module: str, world_size: int) -> None:
    res = run_ranks(_backend(module), world_size, _every_op, module, dist_module=module)
    for r in res:
        assert r["bad"] == []
        # the group is idle at each round's first call (the last round's Works were waited):
        # it is started on the lane; the rest may be too, or queue if a peer lagged (under
        # load, beyond the spin: ``test_a_second_call_finishes_the_first_whose_peers_posted``)
        assert all(kinds[0] for kinds in r["kinds"]), r["kinds"]


def _second_started(rank: int, ws: int) -> list:
    """Every rank issues one async all_reduce, waits 0.5 s (every peer has posted it by then),
    issues another: that issue finishes the first here and starts the second on the lane."""
    import pyc10d as dist

    dist.barrier()
    a, b = torch.full((3,), rank + 1.0), torch.full((5,), rank + 2.0)
    first = dist.all_reduce(a, async_op=True)
    time.sleep(0.5)
    second = dist.all_reduce(b, async_op=True)
    done = first.is_completed()
    kinds = [_started(first), _started(second)]
    first.wait()
    second.wait()
    return [kinds, done, a.tolist(), b.tolist()]


def test_a_second_call_finishes_the_first_whose_peers_posted() -> None:
    for r in run_ranks("shm", 2, _second_started):
        assert r == [[True, True], True, [3.0] * 3, [5.0] * 5]


def _late_peer(rank: int, ws: int, module: str) -> dict:
    """Rank 1 arrives 1 s late: rank 0's issue returns at once, its ``wait`` waits."""
    dist = importlib.import_module(module)
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.barrier()
    if rank == 1:
        time.sleep(1.0)
    t.fill_(rank + 1.0)
    t0 = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    issued = time.monotonic() - t0
    done_early = work.is_completed()
    work.wait()
    return {"issued": issued, "waited": time.monotonic() - t0, "done_early": done_early,
            "started": _started(work), "t": t.tolist()}


@pytest.mark.parametrize("module", ["pyc10d", "torch.distributed"])
def test_issuing_never_waits_for_a_late_peer(module: str) -> None:
    res = run_ranks(_backend(module), 2, _late_peer, module, dist_module=module)
    r = res[0]
    assert r["started"] and r["t"] == [3.0] * 4 and res[1]["t"] == [3.0] * 4
    assert r["issued"] < 0.3, r
    assert not r["done_early"]
    assert r["waited"] > 0.6, r


def _send_first(rank: int, ws: int, module: str) -> list:
    """Rank 0 issues two async all_reduces and then sends; rank 1 receives first and only then
    all-reduces. Were the second issue to wait for rank 1's post of the first, both would hang."""
    dist = importlib.import_module(module)
    t = torch.ones(2)
    dist.all_reduce(t)
    a, b, x = torch.full((2,), rank + 1.0), torch.full((3,), rank + 2.0), torch.zeros(1)
    if rank == 0:
        works = [dist.all_reduce(a, async_op=True), dist.all_reduce(b, async_op=True)]
        dist.send(torch.ones(1) * 42, 1)
        kinds = [_started(w) for w in works]
        for w in works:
            w.wait()
    else:
        dist.recv(x, 0)
        time.sleep(0.2)
        kinds = []
        dist.all_reduce(a)
        dist.all_reduce(b)
    return [a.tolist(), b.tolist(), x.item(), kinds]


@pytest.mark.parametrize("module", ["pyc10d", "torch.distributed"])
def test_a_started_call_never_holds_up_a_send_the_peer_needs_first(module: str) -> None:
    res = run_ranks(_backend(module), 2, _send_first, module, dist_module=module, timeout=30)
    for r in res:
        assert r[:2] == [[3.0, 3.0], [5.0] * 3]
    assert res[1][2] == 42.0
    # the first was started on the lane, the second queued behind it (its peer was not there)
    assert res[0][3] == [True, False]


def _finished_elsewhere(rank: int, ws: int) -> dict:
    """The other ways a started call completes: polled, by a future (progress thread), by a
    bounded wait, by the group's next synchronous call."""
    import pyc10d as dist

    dist.all_reduce(torch.ones(3))
    out = {}
    a = torch.full((3,), rank + 1.0)
    w = dist.all_reduce(a, async_op=True)
    deadline = time.monotonic() + 10
    while not w.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    out["polled"] = (w.is_completed(), a.tolist(), w.is_success())
    b = torch.full((3,), rank + 2.0)
    w = dist.all_reduce(b, async_op=True)
    fut = w.get_future()
    chained = fut.then(lambda f: f.value()[0] * 10)
    out["future"] = (fut.wait()[0].tolist(), chained.wait().tolist(), w.is_completed())
    c = torch.full((3,), rank + 3.0)
    w = dist.all_reduce(c, async_op=True)
    out["bounded"] = (w.wait(timeout=timedelta(seconds=10)), c.tolist())
    d, e = torch.full((3,), rank + 4.0), torch.full((3,), rank + 5.0)
    w = dist.all_reduce(d, async_op=True)
    dist.all_reduce(e)  # finishes d's first: the group's order
    out["next_sync"] = (w.is_completed(), d.tolist(), e.tolist())
    out["waited"] = w.wait()
    return out


def test_a_started_call_completes_however_it_is_awaited() -> None:
    for r in run_ranks("shm", 2, _finished_elsewhere):
        assert r["polled"] == (True, [3.0] * 3, True)
        assert r["future"] == ([5.0] * 3, [50.0] * 3, True)
        assert r["bounded"] == (True, [7.0] * 3)
        assert r["next_sync"] == (True, [9.0] * 3, [11.0] * 3)
        assert r["waited"] is True


def _mismatch(rank: int, ws: int) -> dict:
    import pyc10d as dist

    for n in (2, 3):
        dist.all_reduce(torch.ones(n))
    work = dist.all_reduce(torch.ones(2 if rank == 0 else 3), async_op=True)
    try:
        work.wait()
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
    else:
        error = "no error"
    return {"started": _started(work), "error": error, "success": work.is_success()}


def test_started_calls_that_disagree_fail_at_wait_naming_both() -> None:
    for rank, r in enumerate(run_ranks("shm", 2, _mismatch)):
        other = 1 - rank
        assert r["started"] and not r["success"]
        assert re.search(rf"DistBackendError: allreduce #\d+ in group '0': rank {other} called allreduce SUM "
                         rf"with {8 + 4 * other} bytes of float32, rank {rank} called", r["error"]), r["error"]


def _started_after_peer_exit(dist: Any, rank: int) -> tuple[Any, float]:
    """One all_reduce on the lane, then rank 1 exits and rank 0 starts a second one: its
    Work and when it started."""
    t = torch.ones(2)
    dist.all_reduce(t)
    if rank == 1:
        os._exit(0)
    return dist.all_reduce(t, async_op=True), time.monotonic()


def _dead_peer(rank: int, ws: int, module: str) -> str:
    work, t0 = _started_after_peer_exit(importlib.import_module(module), rank)
    try:
        work.wait()
    except Exception as e:  # noqa: BLE001
        return failure_after(t0, e)
    return "no error"


@pytest.mark.parametrize("module", ["pyc10d", "torch.distributed"])
def test_a_dead_peer_is_named_at_wait(module: str) -> None:
    res = run_ranks(_backend(module), 2, _dead_peer, module, dist_module=module, pg_timeout=20, may_exit=(1,))
    assert exited(res[1])
    took, kind, text = res[0].split(" ", 2)
    assert float(took) < bound(1.5), res[0]  # within a second, on this machine's scale
    assert text.startswith("DistNetworkError: allreduce #2 in group") and "rank 1" in text, text
    assert kind == ("torch" if module == "torch.distributed" else "pyc10d")


def _destroyed(rank: int, ws: int) -> dict:
    """Rank 0 destroys the group with a started call its peer never joins."""
    import pyc10d as dist

    dist.all_reduce(torch.ones(2))
    if rank == 1:
        time.sleep(1.0)
        return {}
    work = dist.all_reduce(torch.ones(2), async_op=True)
    t0 = time.monotonic()
    dist.destroy_process_group()
    took = time.monotonic() - t0
    try:
        work.wait()
    except Exception as e:  # noqa: BLE001
        return {"took": took, "error": f"{type(e).__name__}: {e}"}
    return {"took": took, "error": "no error"}


def test_destroying_a_group_with_a_started_call_does_not_hang() -> None:
    r = run_ranks("shm", 2, _destroyed)[0]
    assert r["took"] < bound(3.0), r  # (the group timeout is 30 minutes)
    assert "was destroyed with operations pending" in r["error"], r


def _general_between(rank: int, ws: int) -> list:
    """A started all_reduce, then calls the lane does not take (strided, gather) and lane calls
    reusing its slot parity, then its ``wait``: it must have been finished before them (this
    rank posts nothing more until then), or a peer running ahead overwrites the rows it reads."""
    import pyc10d as dist

    dist.all_reduce(torch.ones(4))
    results = []
    for i in range(20):
        a = torch.full((4,), rank + 1.0 + i)
        w = dist.all_reduce(a, async_op=True)
        s = torch.full((8,), rank + 1.0)[::2]  # strided: the general path
        dist.all_reduce(s)
        g = [torch.zeros(1) for _ in range(ws)] if rank == 0 else None
        dist.gather(torch.full((1,), rank + 1.0), g, dst=0)
        for _ in range(2):  # both parities of the slots, on the lane
            dist.all_reduce(torch.full((4,), 100.0 * (rank + 1)))
        w.wait()
        results.append((a.tolist(), s.tolist(), None if g is None else [x.item() for x in g]))
    return results


def test_calls_on_the_general_path_wait_for_a_started_one() -> None:
    for rank, r in enumerate(run_ranks("shm", 2, _general_between)):
        for i, (a, s, g) in enumerate(r):
            assert a == [3.0 + 2 * i] * 4 and s == [3.0] * 4, (i, a, s)
            assert g == ([1.0, 2.0] if rank == 0 else None)


def _polled_dead_peer(rank: int, ws: int, pg_timeout: float) -> dict:
    """Rank 0 polls a started call whose peer died: it must complete (failed), not stay
    pending for ever; ``wait`` then raises the dead peer's error."""
    import pyc10d as dist

    work, t0 = _started_after_peer_exit(dist, rank)
    while not work.is_completed() and time.monotonic() - t0 < pg_timeout:
        time.sleep(0.01)
    took = time.monotonic() - t0
    try:
        work.wait()
    except Exception as e:  # noqa: BLE001
        return {"took": took, "started": _started(work), "error": f"{type(e).__name__}: {e}"}
    return {"took": took, "started": _started(work), "error": "no error"}


def test_polling_a_started_call_whose_peer_died_ends_in_its_error() -> None:
    pg_timeout = 20
    r = run_ranks("shm", 2, _polled_dead_peer, pg_timeout, pg_timeout=pg_timeout, may_exit=(1,))[0]
    assert r["started"]
    # completed by the death, not by the timeout: a third of it (a 3x slower machine: seconds)
    assert r["took"] < pg_timeout / 3, r
    assert r["error"].startswith("DistNetworkError: allreduce #2 in group") and "rank 1" in r["error"], r


def _never_joined(rank: int, ws: int, module: str) -> dict:
    """Rank 1 never joins rank 0's started all_reduce: its ``wait`` times out at the group's
    timeout, naming rank 1, and the flight recorder marks it failed."""
    dist = importlib.import_module(module)
    t = torch.ones(2)
    dist.all_reduce(t)
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:  # stays (alive and connected) until rank 0 has timed out
        store.wait(["timed_out"], timedelta(seconds=20))
        return {}
    t0 = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    try:
        work.wait()
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
        torch_type = isinstance(e, torch.distributed.DistBackendError)
    else:
        error, torch_type = "no error", False
    store.set("timed_out", "1")
    pg = dist.group.WORLD
    engine = pg.engine if hasattr(pg, "engine") else pg._get_backend()
    return {"error": error, "took": time.monotonic() - t0, "started": _started(work), "torch_type": torch_type,
            "last": engine.recorder.entries()[-1]}


@pytest.mark.parametrize("module", ["pyc10d", "torch.distributed"])
def test_a_started_call_times_out_at_wait_naming_the_absent_rank(module: str) -> None:
    r = run_ranks(_backend(module), 2, _never_joined, module, dist_module=module, pg_timeout=1.5)[0]
    assert r["started"]
    assert r["torch_type"] == (module == "torch.distributed")
    assert r["error"].startswith("DistTimeoutError: allreduce #2 in group"), r["error"]
    assert "Timed out" in r["error"] and "rank 1" in r["error"], r["error"]
    assert 1.2 < r["took"] < 1.5 + bound(2.5), r  # at the 1.5 s timeout, not later
    assert r["last"]["seq"] == 2 and r["last"]["op"] == "allreduce" and r["last"]["state"] == "failed", r["last"]


def _unattended(rank: int, ws: int, peer: str) -> dict:
    """Rank 0 starts a call and then leaves the group alone (no wait, poll or call), 3 s at most;
    its peer arrives 1 s late (``late``) or has died (``dead``). The watchdog (a 0.2 s period
    here) hands the call to the progress thread, which completes it, or fails it naming the
    dead peer, in the background: the first look after the pause finds it done."""
    os.environ["PYC10D_STUCK_WARN_S"] = "0.8"  # the watchdog's period: 0.2 s
    import pyc10d as dist

    t = torch.ones(2)
    dist.all_reduce(t)
    if rank == 1:
        if peer == "dead":
            os._exit(0)
        time.sleep(1.0)
        dist.all_reduce(t)
        return {}
    t.fill_(5.0)
    work = dist.all_reduce(t, async_op=True)
    started = _started(work)
    # done in the background within 3 s (on this machine's scale); ``_finished``, not
    # ``is_completed``: a poll would finish or hand it off itself
    deadline = time.monotonic() + bound(3.0)
    while not work._finished and time.monotonic() < deadline:
        time.sleep(0.05)
    done = work._finished
    error = work.exception()
    return {"started": started, "done": done, "t": t.tolist(),
            "error": None if error is None else f"{type(error).__name__}: {error}"}


@pytest.mark.parametrize("peer", ["late", "dead"])
def test_a_started_call_left_alone_completes_in_the_background(peer: str) -> None:
    r = run_ranks("shm", 2, _unattended, peer, pg_timeout=20, may_exit=(1,) if peer == "dead" else ())[0]
    assert r["started"] and r["done"], r
    if peer == "late":
        assert r["error"] is None and r["t"] == [7.0, 7.0], r
    else:
        assert r["error"].startswith("DistNetworkError: allreduce #2 in group") and "rank 1" in r["error"], r
