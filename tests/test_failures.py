"""Bad input and broken peers give a clear error, quickly, on every rank; nothing hangs.

Each multi-rank body catches the errors it provokes and checks them itself (type, what the
message names, how long it took), collecting problems in a ``Check`` so every rank reports.
"""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta

import pytest
import torch
from _clock import bound
from _multirank import BACKENDS, THREAD_BACKENDS, exited, run_ranks
from _refs import Check

import pyc10d as dist
from pyc10d.errors import (
    DistBackendError,
    DistError,
    DistNetworkError,
    DistTimeoutError,
    with_torch_phrase,
)
from pyc10d.store import FileStore, HashStore, PrefixStore, TCPStore

PROCESS_BACKENDS = [b for b in BACKENDS if b not in THREAD_BACKENDS]
#: What torch's own suite matches a timeout or a lost peer's error with (distributed_test.py).
TORCH_TIMEOUT_REGEX = " (Timed out|closed|timeout) "
RING = {  # force ring algorithms and multi-segment pipelines on small tensors
    "pyc10d.algorithms.SMALL_ALLREDUCE": 1024,
    "pyc10d.algorithms.SMALL_BROADCAST": 1024,
    "pyc10d.algorithms.SMALL_REDUCE_SCATTER": 1024,
    "pyc10d.algorithms.SMALL_ALLGATHER": 1024,
    "pyc10d.algorithms.segments.SEGMENT_BYTES": 256,
    "pyc10d.backends.shm.SLOT_BYTES": 4096,
}


def _expect_error(c: Check, what: str, call, names: list[str], within: float = 5.0,
                  types: tuple = (ValueError, RuntimeError), after: float = 0.0) -> BaseException | None:
    """Run ``call``; it must raise one of ``types`` naming all of ``names``, within ``after`` s
    (a timeout it waits out) plus ``within`` s on the 2-core VM's scale (``_clock.bound``: the
    default group timeout is 30 minutes; a slower machine gets proportionally longer)."""
    t0 = time.monotonic()
    try:
        call()
    except types as e:
        took = time.monotonic() - t0
        msg = str(e)
        missing = [n for n in names if n not in msg]
        c.true(not missing, f"{what}: message does not mention {missing}: {type(e).__name__}: {msg}")
        limit = after + bound(within)
        c.true(took < limit, f"{what}: took {took:.1f}s (limit {limit:.1f}s)")
        return e
    except BaseException as e:  # noqa: BLE001
        c.true(False, f"{what}: raised {type(e).__name__}: {e}, want one of {types}")
        return e
    c.true(False, f"{what}: no error")
    return None


# -- invalid ranks ------------------------------------------------------------------------------
def _invalid_ranks(rank: int, ws: int) -> int:
    c = Check(rank)
    t = torch.ones(4)
    outs = [torch.empty(4) for _ in range(ws)]
    cases = [
        ("broadcast src=ws", lambda: dist.broadcast(t, src=ws), str(ws)),
        ("broadcast src=-1", lambda: dist.broadcast(t, src=-1), "-1"),
        ("reduce dst=ws", lambda: dist.reduce(t, dst=ws), str(ws)),
        ("gather dst=ws+2", lambda: dist.gather(t, outs, dst=ws + 2), str(ws + 2)),
        ("scatter src=ws", lambda: dist.scatter(t, outs, src=ws), str(ws)),
        ("send dst=ws", lambda: dist.send(t, dst=ws), str(ws)),
        ("isend dst=-2", lambda: dist.isend(t, dst=-2), "-2"),
        ("recv src=ws+1", lambda: dist.recv(t, src=ws + 1), str(ws + 1)),
        ("irecv src=ws", lambda: dist.irecv(t, src=ws), str(ws)),
        ("send to self", lambda: dist.send(t, dst=rank), "rank"),
        ("irecv from self", lambda: dist.irecv(t, src=rank), "rank"),
        ("new_group with rank ws", lambda: dist.new_group([0, ws]), str(ws)),
    ]
    for what, call, name in cases:
        _expect_error(c, what, call, [name], within=1.0)
    # the group is still usable: checks ran before any byte moved
    t = torch.ones(4)
    dist.all_reduce(t)
    c.true(torch.equal(t, torch.full((4,), float(ws))), "all_reduce after the rejected calls")
    # a src/dst outside a sub-group
    g = dist.new_group([0, 1])
    if rank in (0, 1):
        _expect_error(c, "broadcast src outside the group", lambda: dist.broadcast(t, src=2, group=g),
                      ["2"], within=1.0)
        _expect_error(c, "reduce group_dst out of range", lambda: dist.reduce(t, group=g, group_dst=5),
                      ["5"], within=1.0)
        dist.barrier(group=g)
    return c.finish()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_src_dst(backend: str) -> None:
    run_ranks(backend, 3, _invalid_ranks, timeout=20)


# -- mismatches between ranks -----------------------------------------------------------------
def _mismatch(rank: int, ws: int, kind: str) -> int:
    """Each case on a fresh group (a failure breaks the group it happened in)."""
    c = Check(rank)
    odd = rank == 1
    if kind == "dtype":
        mine, other = (torch.float64, torch.float32) if odd else (torch.float32, torch.float64)

        def make(n: int) -> torch.Tensor:
            return torch.ones(n, dtype=mine)

        names = ["float32", "float64"]
    else:
        def make(n: int) -> torch.Tensor:  # rank 1: 2*ws more elements (still valid locally)
            return torch.ones(n + 2 * ws if odd else n)

        names = ["rank 1"]

    def like(t: torch.Tensor, factor: int) -> torch.Tensor:
        return torch.ones(factor * t.numel(), dtype=t.dtype)

    cases = {
        "all_reduce small": lambda g: dist.all_reduce(make(10), group=g),
        "all_reduce ring": lambda g: dist.all_reduce(make(1009), group=g),
        "all_gather": lambda g, x=make(6): dist.all_gather([torch.empty_like(x) for _ in range(ws)], x, group=g),
        "all_gather_into_tensor ring": lambda g, x=make(1009): dist.all_gather_into_tensor(like(x, ws), x, group=g),
        "reduce_scatter_tensor": lambda g, out=make(5): dist.reduce_scatter_tensor(out, like(out, ws), group=g),
        "all_to_all_single": lambda g, x=make(ws * 3): dist.all_to_all_single(torch.empty_like(x), x, group=g),
        "all_to_all": lambda g, x=make(4): dist.all_to_all([torch.empty_like(x) for _ in range(ws)],
                                                           [x.clone() for _ in range(ws)], group=g),
        "reduce_scatter": lambda g, x=make(5): dist.reduce_scatter(torch.empty_like(x), [x.clone() for _ in range(ws)],
                                                                    group=g),
    }
    for what, call in cases.items():
        g = dist.new_group(list(range(ws)))
        _expect_error(c, f"{kind} mismatch in {what}", lambda call=call, g=g: call(g), names)
    # reduce / broadcast: only the receivers can tell; the others learn it at their next call
    # on the group (here a barrier), which fails instead of hanging
    for what, call in {
        "reduce": lambda g: dist.reduce(make(7), dst=0, group=g),
        "broadcast": lambda g: dist.broadcast(make(9), src=0, group=g),
        "gather": lambda g, x=make(6): dist.gather(x, [torch.empty_like(x) for _ in range(ws)] if rank == 0 else None,
                                                   dst=0, group=g),
        "scatter": lambda g, x=make(6): dist.scatter(x, [torch.ones_like(x) for _ in range(ws)] if rank == 0 else None,
                                                     src=0, group=g),
    }.items():
        g = dist.new_group(list(range(ws)))

        def then_barrier(call=call, g=g) -> None:
            call(g)
            dist.barrier(group=g)

        _expect_error(c, f"{kind} mismatch in {what} (+barrier)", then_barrier, names)
    # the world group was not involved and still works
    t = torch.ones(3)
    dist.all_reduce(t)
    c.true(torch.equal(t, torch.full((3,), float(ws))), "world all_reduce after the failures")
    return c.finish()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["dtype", "shape"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatch_between_ranks(backend: str, kind: str) -> None:
    run_ranks(backend, 3, _mismatch, kind, timeout=30, patches=RING)


# -- a rank that dies ---------------------------------------------------------------------------
def _rank_exits(rank: int, ws: int, when: str) -> float | None:
    victim = ws - 1
    c = Check(rank)
    if rank == victim:
        if when == "before":
            os._exit(17)
        if when == "during" and dist.get_backend() == "shm":
            # shm collectives post to the shared arena instead of sending messages
            from pyc10d.transport.shm import arena as shm_arena

            post, posts = shm_arena.Arena.post, [0]

            def dying_post(self, c):
                posts[0] += 1
                if posts[0] > 3:
                    os._exit(17)
                return post(self, c)

            shm_arena.Arena.post = dying_post
        elif when == "during":
            transport = dist.group.WORLD._get_backend().transport
            send, sent = transport.send, [0]

            def dying_send(*args, **kwargs):
                sent[0] += 1
                if sent[0] > 3:
                    os._exit(17)
                return send(*args, **kwargs)

            transport.send = dying_send
            # tcp's lane writes through the caller's ``DirectIO`` (``transport/tcp/direct``)
            from pyc10d.transport.tcp.direct import DirectIO

            direct_send = DirectIO.send

            def dying_direct_send(self, *args, **kwargs):
                sent[0] += 1
                if sent[0] > 3:
                    os._exit(17)
                return direct_send(self, *args, **kwargs)

            DirectIO.send = dying_direct_send
        else:  # "p2p": die while the others wait to receive from us
            time.sleep(0.3)
            os._exit(17)
    t0 = time.monotonic()
    if when == "p2p":
        call = lambda: dist.recv(torch.empty(5), src=victim)  # noqa: E731
    else:
        call = lambda: dist.all_reduce(torch.ones(20_011))  # noqa: E731 - ring, many segments
    e = _expect_error(c, f"rank {victim} exits {when} the collective", call, [f"rank {victim}"])
    c.true(isinstance(e, DistError), f"not a DistError: {e!r}")
    # later calls on the broken group fail at once instead of hanging
    if when != "p2p":
        _expect_error(c, "barrier after the failure", dist.barrier, [f"rank {victim}"], within=1.0)
    c.finish()
    return time.monotonic() - t0


@pytest.mark.timeout(40)
@pytest.mark.parametrize("when", ["before", "during", "p2p"])
@pytest.mark.parametrize("backend", PROCESS_BACKENDS)
def test_rank_exits_mid_collective(backend: str, when: str) -> None:
    res = run_ranks(backend, 3, _rank_exits, when, timeout=25, patches=RING, may_exit=(2,))
    assert exited(res[2])
    assert all(isinstance(s, float) and s < bound(5) for s in res[:2]), res


def _any_source_peer_exits(rank: int, ws: int) -> float:
    if rank == 1:
        time.sleep(0.3)
        os._exit(17)
    c = Check(rank)
    t0 = time.monotonic()
    _expect_error(c, "recv(src=None) while the only peer exits",
                  lambda: dist.recv(torch.empty(5)), ["rank 1"])
    c.finish()
    return time.monotonic() - t0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", PROCESS_BACKENDS)
def test_any_source_recv_fails_when_every_peer_is_gone(backend: str) -> None:
    res = run_ranks(backend, 2, _any_source_peer_exits, timeout=20, may_exit=(1,))
    assert exited(res[1])
    assert isinstance(res[0], float) and res[0] < bound(5), res


# -- timeouts -------------------------------------------------------------------------------------
#: How long an absent rank waits, at most, for the others to report that they gave up on it.
ABSENT_MAX_S = 15.0


def _stay_absent(store, ws: int, absent: int) -> None:  # any pyc10d Store
    """The absent rank stays alive (and connected) until every other rank has given up on it,
    and no longer: it waits for their ``gave_up/<rank>`` keys rather than sleeping a fixed
    time longer than the timeout under test (which made every such test wait it out)."""
    others = [f"gave_up/{r}" for r in range(ws) if r != absent]
    store.wait(others, timedelta(seconds=ABSENT_MAX_S))


def _skip_collective(rank: int, ws: int, where: str) -> str:
    c = Check(rank)
    g = dist.new_group(list(range(ws)), timeout=timedelta(seconds=2)) if where == "new_group" else None
    store = dist._get_default_store()
    if rank == 1:  # never joins; stays alive (and connected) until the others have given up
        _stay_absent(store, ws, 1)
        return "skipped"
    try:
        e = _expect_error(c, f"all_reduce with rank 1 missing ({where} timeout 2s)",
                          lambda: dist.all_reduce(torch.ones(1009), group=g), ["timed out", "rank 1"],
                          after=2.0, within=2.5)
    finally:
        store.set(f"gave_up/{rank}", "1")
    c.true(e is None or "2.0s" in str(e) or "2s" in str(e), f"timeout not stated: {e}")
    # torch's tests (and users' code) match torch's backends' words for a timeout or a lost peer
    c.true(e is None or re.search(TORCH_TIMEOUT_REGEX, str(e)) is not None,
           f"no match for torch's {TORCH_TIMEOUT_REGEX!r}: {e}")
    c.true(e is None or "allreduce #" in str(e), f"op and sequence number not named: {e}")
    c.finish()
    return type(e).__name__


@pytest.mark.timeout(40)
@pytest.mark.parametrize("where", ["init", "new_group"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_collective_timeout(backend: str, where: str) -> None:
    res = run_ranks(backend, 3, _skip_collective, where, timeout=25,
                    pg_timeout=2.0 if where == "init" else None)
    # whoever waited on rank 1 directly raises the timeout error itself
    assert "DistTimeoutError" in res, res


def test_torch_phrases_lead_pyc10d_detail() -> None:
    """Timeouts and lost peers carry torch's words once; other errors keep their text."""
    detail = "rank 0 timed out after 1.0s waiting for rank 1"
    timed = with_torch_phrase(DistTimeoutError(detail), detail)
    assert timed == f"Timed out ({detail})" and re.search(TORCH_TIMEOUT_REGEX, f"x: {timed}")
    assert with_torch_phrase(DistTimeoutError(timed), timed) == timed
    lost = with_torch_phrase(DistNetworkError("x"), "rank 1 closed its connection (its process died)")
    assert lost == "Connection closed by peer (rank 1 closed its connection (its process died))"
    assert with_torch_phrase(DistBackendError("x"), "desync: ...") == "desync: ..."


def _monitored_barrier_missing_rank(rank: int, ws: int) -> str:
    """Rank 2 never comes: rank 0 names it in Gloo's words, rank 1 says it reached the barrier."""
    if rank == 2:
        time.sleep(2.5)  # alive, just late
        return "late"
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=1))
    except RuntimeError as e:
        return str(e)
    return "passed"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", PROCESS_BACKENDS)
def test_monitored_barrier_wording(backend: str) -> None:
    res = run_ranks(backend, 3, _monitored_barrier_missing_rank, timeout=20)
    assert "Rank 2 failed to pass monitoredBarrier in 1000 ms" in res[0], res
    assert "monitored_barrier #" in res[0] and "timed out" in res[0], res  # pyc10d's detail
    assert "Rank 1 successfully reached monitoredBarrier, but received errors" in res[1], res


def _monitored_barrier_zero_timeout(rank: int, ws: int) -> str:
    if rank == 1:
        return "absent"
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=0))
    except RuntimeError as e:
        return str(e)
    return "passed"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", PROCESS_BACKENDS)
def test_monitored_barrier_no_time_left(backend: str) -> None:
    res = run_ranks(backend, 2, _monitored_barrier_zero_timeout, timeout=20)
    assert re.search(r"Rank 0 timed out in monitoredBarrier after 0 ms.*not yet checked in: 1",
                     res[0]), res
    assert re.search(TORCH_TIMEOUT_REGEX, res[0]), res


def _idle_then_collective(rank: int, ws: int) -> list:
    t = torch.ones(3)
    dist.all_reduce(t)
    time.sleep(1.6)  # idle for longer than the group timeout: not a failure
    t = torch.ones(3)
    dist.all_reduce(t)
    return t.tolist()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("backend", BACKENDS)
def test_idle_longer_than_timeout_is_not_a_failure(backend: str) -> None:
    """Regression: dialled TCP sockets kept their connect timeout, so a connection idle for
    longer than the group timeout was reported as "rank N closed its connection (timed out)"."""
    res = run_ranks(backend, 3, _idle_then_collective, timeout=20, pg_timeout=1.0)
    assert res == [[3.0] * 3] * 3


def _missing_peer_at_init(rank: int, ws: int, path: str) -> str:
    signals = dist.FileStore(path + ".signals", ws)  # not the store under test
    if rank == 0:  # never shows up (exits later, after rank 1 gave up)
        _stay_absent(signals, ws, 0)
        return "absent"
    c = Check(rank)
    store = dist.FileStore(path, ws)  # keeps FileStore's own 300 s timeout
    try:
        _expect_error(c, "init_process_group without rank 0",
                      lambda: dist.init_process_group("tcp", store=store, rank=rank, world_size=ws,
                                                      timeout=timedelta(seconds=1.5)),
                      ["rank 0", "to admit it", "attempt/admit/1/"], after=1.5, within=2.5)
    finally:
        signals.set(f"gave_up/{rank}", "1")
    return str(c.finish())


def _missing_peer_listening(rank: int, ws: int, path: str) -> str:
    signals = dist.FileStore(path + ".signals", ws)
    if rank == 1:
        _stay_absent(signals, ws, 1)
        return "absent"
    c = Check(rank)
    store = dist.FileStore(path, ws)
    try:
        _expect_error(c, "init_process_group without rank 1",
                      lambda: dist.init_process_group("tcp", store=store, rank=rank, world_size=ws,
                                                      timeout=timedelta(seconds=1.5)),
                      ["1"], after=1.5, within=2.5)
    finally:
        signals.set(f"gave_up/{rank}", "1")
    return str(c.finish())


@pytest.mark.timeout(30)
@pytest.mark.parametrize("missing", [0, 1])
def test_init_with_missing_rank_times_out(tmp_path, missing: int) -> None:
    body = _missing_peer_at_init if missing == 0 else _missing_peer_listening
    run_ranks("tcp", 2, body, str(tmp_path / "store"), init=False, timeout=20)


# -- stores ---------------------------------------------------------------------------------------
@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["tcp", "file", "hash", "prefix"])
def test_store_key_never_comes(tmp_path, kind: str) -> None:
    one_s = timedelta(seconds=1)
    if kind == "tcp":
        store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=one_s)
    elif kind == "file":
        store = FileStore(str(tmp_path / "fs"), 1)
    elif kind == "hash":
        store = HashStore()
    else:
        store = PrefixStore("pre", FileStore(str(tmp_path / "fs2"), 1))
    store.set_timeout(one_s)
    store.set("present", "1")
    c = Check(0)
    for what, call, names, after, within in [  # after: the timeout waited out
        ("get", lambda: store.get("never_set_key"), ["never_set_key"], 1.0, 2.0),
        ("wait (one key present)", lambda: store.wait(["present", "other_missing"]), ["other_missing"], 1.0, 2.0),
        ("wait with per-call timeout", lambda: store.wait(["k3"], timedelta(seconds=0.3)), ["k3"], 0.3, 1.2),
    ]:
        e = _expect_error(c, f"{kind} store {what}", call, names, after=after, within=within,
                          types=(RuntimeError,))
        c.true(isinstance(e, TimeoutError) and isinstance(e, DistTimeoutError),
               f"{kind} {what}: {type(e).__name__} is not a timeout error")
    c.finish()
