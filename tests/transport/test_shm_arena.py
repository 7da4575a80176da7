"""How a rank waits in the shm arena: the spin policy, and a blocked caller's longer spin.

A caller blocked in a lean-lane step (``close_phase``) spins up to ``caller_spin`` before it
sleeps on the futex; a progress thread keeps the ordinary spin. Measured in the docstring of
``caller_spin``: the sleep and wake-up cost tens of microseconds at every skew between ranks.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from pyc10d.transport.shm import arena as shm_arena
from pyc10d.transport.shm.arena import Arena, caller_spin, default_spin
from pyc10d.transport.shm.segment import PeerWatch, Segment, new_name

pytestmark = pytest.mark.timeout(30)


def test_spin_policy_follows_the_cpus_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for var in ("PYC10D_SHM_SPIN_US", "PYC10D_SHM_YIELD", "PYC10D_SHM_CALLER_SPIN_US"):
        monkeypatch.delenv(var, raising=False)
    assert default_spin(2) == (pytest.approx(50e-6), False) and caller_spin(2) == pytest.approx(1e-3)
    # more ranks than CPUs: the caller spins no longer than anyone (its core is wanted)
    assert default_spin(4) == (pytest.approx(200e-6), True) and caller_spin(4) == pytest.approx(200e-6)
    monkeypatch.setenv("PYC10D_SHM_CALLER_SPIN_US", "300")
    assert caller_spin(2) == pytest.approx(300e-6)
    monkeypatch.setenv("PYC10D_SHM_YIELD", "1")
    assert caller_spin(2) == default_spin(2)[0]


def _arena_pair() -> tuple[Segment, Arena]:
    """Rank 0's handle on a 2-rank arena whose rank 1 is a forked child of this process."""
    seg = Segment(new_name("t"), Arena.nbytes(2, 4096), create=True)
    watch = PeerWatch([os.getpid(), os.getpid()], 0)
    return seg, Arena(seg, 0, 2, 4096, watch, [0, 1])


@pytest.mark.parametrize("caller", [True, False], ids=["caller-spin", "ordinary-spin"])
def test_a_blocked_caller_spins_through_a_short_skew(caller: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 posts each phase some 0.3 ms after rank 0 starts waiting: a caller's wait spins
    its whole 1 ms before it sleeps on the futex (so it sleeps only where the child was
    descheduled past that); the ordinary 50 us spin sleeps in most rounds.

    Timed, not counted, for the caller: a loaded machine deschedules the child past 1 ms in a
    varying share of rounds (CI saw 6 of 20), and each such round sleeps in 1 ms slices. What
    cannot vary is that no sleep starts before the caller's spin is spent."""
    seg, arena = _arena_pair()
    sleeps: list[tuple[int, float]] = []  # (round, seconds since its wait began)
    began = [0, 0.0]
    real_wait = shm_arena.futex.wait

    me = threading.get_ident()

    def recording_wait(*a: object) -> object:
        if threading.get_ident() == me:  # (the patch is the module's: other threads' sleeps too)
            sleeps.append((began[0], time.perf_counter() - began[1]))
        return real_wait(*a)

    monkeypatch.setattr(shm_arena.futex, "wait", recording_wait)
    arena.spin_s, arena.caller_spin_s, arena.yield_spin = 50e-6, 1e-3, False
    try:
        rounds = 20
        pid = os.fork()
        if pid == 0:  # rank 1: post phases 1..rounds, each ~0.3 ms after rank 0 posted its own
            try:
                peer = Arena(seg, 1, 2, 4096, PeerWatch([os.getppid(), os.getpid()], 1), [0, 1])
                for c in range(1, rounds + 1):
                    peer.wait(0, c, time.monotonic() + 10, "test")
                    end = time.perf_counter() + 300e-6
                    while time.perf_counter() < end:
                        pass
                    peer.post(c)
            finally:
                os._exit(0)
        for c in range(1, rounds + 1):
            arena.post(c)
            began[:] = [c, time.perf_counter()]
            arena.wait_all(c, time.monotonic() + 10, "test", arena.caller_spin_s if caller else None)
        _, status = os.waitpid(pid, 0)
        assert status == 0
    finally:
        arena.close()
        seg.unlink()
    if caller:
        early = [(c, round(t * 1e6)) for c, t in sleeps if t < 0.95e-3]
        assert not early, f"sleeps (round, us into its wait) before the 1 ms spin was spent: {early}"
    else:
        slept = {c for c, _ in sleeps}
        assert len(slept) >= rounds // 2, f"only {len(slept)} of {rounds} 0.3 ms waits slept"


def test_a_missed_wake_up_costs_at_most_the_first_slice() -> None:
    """A poster stores its counter without a barrier, so a rank going to sleep in the same
    nanoseconds may miss its wake-up (x86 lets the poster's read of the sleeping-on words pass
    its store). Such a rank's naps start at the first slice (1 ms) and double, so the miss
    costs at most the nap under way. Made certain here: rank 1 stores its counter and never
    wakes anyone. Rank 0, asleep on rank 1's counter, must still see each post within about
    as long as it had slept, not the 100 ms of a full slice."""
    seg, arena = _arena_pair()
    arena.spin_s = arena.caller_spin_s = 0.0  # sleep at once
    late = []
    try:
        pid = os.fork()
        if pid == 0:  # rank 1: never wakes anyone, posts phase c 20 ms after rank 0 posted it
            try:
                peer = Arena(seg, 1, 2, 4096, PeerWatch([os.getppid(), os.getpid()], 1), [0, 1])
                for c in range(1, 6):
                    peer.wait(0, c, time.monotonic() + 10, "test")
                    time.sleep(0.02)
                    peer.words[peer._ctr[1]] = c  # post's store, without its look for sleepers
                    peer.phase = c
                    peer._meta_words[peer._desc[0][1]] = time.monotonic_ns()
            finally:
                os._exit(0)
        for c in range(1, 6):
            arena.post(c)
            began = time.monotonic_ns()
            arena.wait(1, c, time.monotonic() + 10, "test")
            posted = arena._meta_words[arena._desc[0][1]]
            late.append(((time.monotonic_ns() - posted) / 1e9, (posted - began) / 1e9))
        _, status = os.waitpid(pid, 0)
        assert status == 0
    finally:
        arena.close()
        seg.unlink()
    # asleep ~20 ms, its naps doubling from 1 ms: the nap under way when the post lands is at
    # most as long as the sleep so far (+1 ms), so it looks again within that of the post,
    # never a full 100 ms slice later (the old slices: ~80 ms). The bound grows with the
    # time asleep: on a loaded machine rank 1's 20 ms sleep may overrun.
    assert all(seen < asleep + 0.03 for seen, asleep in late), late
