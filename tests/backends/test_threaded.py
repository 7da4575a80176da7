"""The threaded backend and its harness: ranks as threads, random collective runs, failures.

The collective semantics themselves are checked against TCP's by the conformance suite
(``tests/test_conformance.py`` runs every family on "threaded" too); here: a long random mix
of collectives on 8 threads, per-thread worlds, and how failures and hangs end a test.
"""

from __future__ import annotations

import functools
import operator
import random
import threading
import time
import unittest

import pytest
import torch
from _clock import bound

import pyc10d as dist
from pyc10d.errors import DistBackendError
from pyc10d.testing import MultiThreadedTestCase, TestCase, spawn_threads_and_init_comms
from pyc10d.testing.threaded import ThreadedRun

pytestmark = pytest.mark.timeout(40)

SIZES = [0, 1, 7, 1000, 70_000]  # 70k float64: above every ring threshold
FLOAT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
INT_OPS = ["SUM", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def inp(step: int, rank: int, n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Rank ``rank``'s input at ``step``: small integers, so every reduction is exact."""
    return ((torch.arange(n, dtype=torch.int64) * (rank + 3) + step) % 5 + 1).to(dtype)


def ref(xs: list[torch.Tensor], op: str) -> torch.Tensor:
    if op == "SUM":
        return functools.reduce(operator.add, xs)
    if op == "AVG":
        return functools.reduce(operator.add, xs) / len(xs)
    if op == "PRODUCT":
        return functools.reduce(operator.mul, xs)
    if op == "MIN":
        return functools.reduce(torch.minimum, xs)
    if op == "MAX":
        return functools.reduce(torch.maximum, xs)
    fn = {"BAND": operator.and_, "BOR": operator.or_, "BXOR": operator.xor}[op]
    return functools.reduce(fn, xs)


def random_collectives(steps: int, seed: int) -> dict[str, int]:
    """Run ``steps`` collectives drawn from one seeded sequence (the same on every rank)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    rng = random.Random(seed)
    evens = dist.new_group(list(range(0, n, 2)))
    odds = dist.new_group(list(range(1, n, 2)))
    mine, my_ranks = (evens, list(range(0, n, 2))) if rank % 2 == 0 else (odds, list(range(1, n, 2)))
    kinds = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
             "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "gather", "scatter",
             "barrier", "p2p_ring", "subgroup_all_reduce", "async", "broadcast_object_list"]
    done: dict[str, int] = {}
    for step in range(steps):
        kind = rng.choice(kinds)
        size = rng.choice(SIZES)
        root = rng.randrange(n)
        if kind == "all_reduce":
            integer = rng.random() < 0.3
            op = rng.choice(INT_OPS if integer else FLOAT_OPS)
            dtype = torch.int64 if integer else torch.float64
            t = inp(step, rank, size, dtype)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            want = ref([inp(step, r, size, dtype) for r in range(n)], op)
            assert torch.allclose(t, want.to(dtype)), (step, kind, op, size)
        elif kind == "broadcast":
            t = inp(step, rank, size)
            dist.broadcast(t, src=root)
            assert torch.equal(t, inp(step, root, size)), (step, kind)
        elif kind == "reduce":
            t = inp(step, rank, size)
            dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
            if rank == root:
                assert torch.equal(t, ref([inp(step, r, size) for r in range(n)], "MAX")), (step, kind)
        elif kind == "all_gather":
            out = [torch.empty(size, dtype=torch.float64) for _ in range(n)]
            dist.all_gather(out, inp(step, rank, size))
            assert all(torch.equal(o, inp(step, r, size)) for r, o in enumerate(out)), (step, kind)
        elif kind == "all_gather_into_tensor":
            out = torch.empty(n * size, dtype=torch.float64)
            dist.all_gather_into_tensor(out, inp(step, rank, size))
            assert torch.equal(out, torch.cat([inp(step, r, size) for r in range(n)])), (step, kind)
        elif kind == "reduce_scatter_tensor":
            out = torch.empty(size, dtype=torch.float64)
            dist.reduce_scatter_tensor(out, inp(step, rank, n * size))
            want = ref([inp(step, r, n * size).view(n, size)[rank] for r in range(n)], "SUM")
            assert torch.equal(out, want), (step, kind)
        elif kind == "all_to_all_single":
            out = torch.empty(n * size, dtype=torch.float64)
            dist.all_to_all_single(out, inp(step, rank, n * size))
            want = torch.cat([inp(step, r, n * size).view(n, size)[rank] for r in range(n)])
            assert torch.equal(out, want), (step, kind)
        elif kind == "all_to_all":
            ins = list(inp(step, rank, n * size).view(n, size).unbind())
            out = [torch.empty(size, dtype=torch.float64) for _ in range(n)]
            dist.all_to_all(out, ins)
            assert all(torch.equal(o, inp(step, r, n * size).view(n, size)[rank])
                       for r, o in enumerate(out)), (step, kind)
        elif kind == "gather":
            out = [torch.empty(size, dtype=torch.float64) for _ in range(n)] if rank == root else None
            dist.gather(inp(step, rank, size), out, dst=root)
            if rank == root:
                assert all(torch.equal(o, inp(step, r, size)) for r, o in enumerate(out)), (step, kind)
        elif kind == "scatter":
            ins = [inp(step, r, size) for r in range(n)] if rank == root else None
            out = torch.empty(size, dtype=torch.float64)
            dist.scatter(out, ins, src=root)
            assert torch.equal(out, inp(step, rank, size)), (step, kind)
        elif kind == "barrier":
            dist.barrier()
        elif kind == "p2p_ring":
            out = torch.empty(size, dtype=torch.float64)
            work = dist.isend(inp(step, rank, size), (rank + 1) % n)
            dist.recv(out, (rank - 1) % n)
            work.wait()
            assert torch.equal(out, inp(step, (rank - 1) % n, size)), (step, kind)
        elif kind == "subgroup_all_reduce":
            t = inp(step, rank, size)
            dist.all_reduce(t, group=mine)
            assert torch.equal(t, ref([inp(step, r, size) for r in my_ranks], "SUM")), (step, kind)
        elif kind == "async":
            ts = [inp(step + i, rank, size) for i in range(3)]
            works = [dist.all_reduce(t, async_op=True) for t in ts]
            for w in works:
                w.wait()
            for i, t in enumerate(ts):
                assert torch.equal(t, ref([inp(step + i, r, size) for r in range(n)], "SUM")), (step, kind)
        elif kind == "broadcast_object_list":
            objs = [{"step": step, "from": rank}, size] if rank == root else [None, None]
            dist.broadcast_object_list(objs, src=root)
            assert objs == [{"step": step, "from": root}, size], (step, kind)
        done[kind] = done.get(kind, 0) + 1
    return done


# make test: 60 collectives, the first 60 of seed 2024's sequence, in which every one of the 15
# kinds comes up; make test-full: the 200 of the soak.
@pytest.mark.parametrize("steps", [60, pytest.param(200, marks=pytest.mark.full)])
def test_random_collectives_on_8_threads(steps: int) -> None:
    counts: dict[int, dict[str, int]] = {}

    @spawn_threads_and_init_comms(world_size=8, timeout=30)
    def run(self: object) -> None:
        counts[dist.get_rank()] = random_collectives(steps, seed=2024)

    run(None)
    assert sorted(counts) == list(range(8))
    assert sum(counts[0].values()) == steps
    assert all(c == counts[0] for c in counts.values())
    assert len(counts[0]) >= 12  # nearly every kind came up


class FailureTest(TestCase):
    # The harness's timeout for the two tests below: the others are released at once, well
    # before it (a third of it, far above a 3x slower machine's few seconds).
    TIMEOUT_S = 60

    def test_raise_while_peers_are_in_a_collective_names_the_rank(self) -> None:
        @spawn_threads_and_init_comms(world_size=8, timeout=self.TIMEOUT_S)
        def run(self: TestCase) -> None:
            t = torch.ones(10)
            dist.all_reduce(t)
            if dist.get_rank() == 5:
                raise ValueError("boom on rank 5")
            dist.all_reduce(t)  # the others wait for rank 5 here

        t0 = time.monotonic()
        with self.assertRaises(RuntimeError) as ctx:
            run(self)
        self.assertLess(time.monotonic() - t0, self.TIMEOUT_S / 3)
        msg = str(ctx.exception)
        self.assertTrue(msg.startswith("Thread 5 (rank 5) exited with exception (likely cause)"), msg[:300])
        self.assertIn("ValueError: boom on rank 5", msg)
        self.assertIn("rank 5 failed", msg)  # why the other ranks were released

    def test_raise_inside_a_collective_names_the_rank(self) -> None:
        @spawn_threads_and_init_comms(world_size=8, timeout=self.TIMEOUT_S)
        def run(self: TestCase) -> None:
            if dist.get_rank() == 3:
                transport = dist.group.WORLD._get_backend().transport
                real_send, calls = transport.send, []

                def flaky_send(*args: object, **kwargs: object) -> None:
                    calls.append(1)
                    if len(calls) == 3:
                        raise OSError("rank 3 lost its link mid-collective")
                    real_send(*args, **kwargs)

                transport.send = flaky_send
            t = torch.ones(1 << 18)  # 1 MiB: the ring, several messages per rank
            dist.all_reduce(t)

        t0 = time.monotonic()
        with self.assertRaises(RuntimeError) as ctx:
            run(self)
        self.assertLess(time.monotonic() - t0, self.TIMEOUT_S / 3)
        msg = str(ctx.exception)
        self.assertTrue(msg.startswith("Thread 3 (rank 3)"), msg[:300])
        self.assertIn("rank 3 lost its link mid-collective", msg)

    def test_hang_ends_at_the_timeout_naming_the_stuck_rank(self) -> None:
        run = ThreadedRun(world_size=3, timeout=1.5)

        def body(rank: int) -> None:
            dist.init_process_group("threaded", rank=rank, world_size=3, store=run.store)
            if rank > 0:  # ranks 1 and 2 wait for each other: neither ever sends
                dist.recv(torch.empty(1), src=3 - rank)

        run.start(body)
        t0 = time.monotonic()
        with self.assertRaises(RuntimeError) as ctx:
            run.join()
        self.assertLess(time.monotonic() - t0, 1.5 + bound(6.5))  # at its 1.5 s, not later
        msg = str(ctx.exception)
        self.assertIn("Test timed out after 1.5 s: ranks [1, 2] had not finished", msg)
        self.assertIn("Stack of rank 1 at the timeout", msg)
        self.assertIn("in body", msg)
        self.assertFalse(run.threads[1].is_alive())  # terminating the world released them
        self.assertFalse(run.threads[2].is_alive())

    def test_skip_on_every_rank_is_a_skip(self) -> None:
        @spawn_threads_and_init_comms(world_size=3)
        def run(self: TestCase) -> None:
            raise unittest.SkipTest("not today")

        with self.assertRaisesRegex(unittest.SkipTest, "not today"):
            run(self)

    def test_skip_on_one_rank_releases_the_others_and_is_a_skip(self) -> None:
        @spawn_threads_and_init_comms(world_size=3)
        def run(self: TestCase) -> None:
            if dist.get_rank() == 2:
                raise unittest.SkipTest("rank 2 cannot")
            dist.all_reduce(torch.ones(2))  # fails once rank 2 has left: not a failure

        with self.assertRaisesRegex(unittest.SkipTest, "rank 2 cannot"):
            run(self)

    def test_autograd_runs_backward_on_the_rank_thread(self) -> None:
        before = torch._C._is_multithreading_enabled()

        @spawn_threads_and_init_comms(world_size=2)
        def run(self: TestCase) -> None:
            assert not torch._C._is_multithreading_enabled()

        run(self)
        self.assertEqual(torch._C._is_multithreading_enabled(), before)


class _Case(MultiThreadedTestCase):
    """Driven by HarnessTest through unittest, so its outcomes can be inspected."""

    seen: dict[int, tuple[int, int, bool]] = {}

    @property
    def world_size(self) -> int:
        return 3

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def perThreadSetUp(self) -> None:  # noqa: N802 - the seed's hook name
        self.set_up_here = True

    def test_ranks(self) -> None:
        _Case.seen[self.rank] = (dist.get_rank(), dist.get_world_size(), self.set_up_here)

    def test_fails_on_rank_2(self) -> None:
        dist.barrier()
        self.assertEqual(self.rank, 0, "only rank 0 passes")

    def test_skipped(self) -> None:
        self.skipTest("skipped in a rank")


_Case.__test__ = False  # type: ignore[attr-defined] # run through HarnessTest only


class HarnessTest(TestCase):
    def _run(self, name: str) -> unittest.TestResult:
        result = unittest.TestResult()
        _Case(name).run(result)
        return result

    def test_each_rank_has_its_own_world(self) -> None:
        _Case.seen.clear()
        result = self._run("test_ranks")
        self.assertTrue(result.wasSuccessful(), result.errors + result.failures)
        self.assertEqual(_Case.seen, {r: (r, 3, True) for r in range(3)})
        self.assertFalse(dist.is_initialized())  # the main thread's world was never touched

    def test_failures_name_each_failed_rank(self) -> None:
        result = self._run("test_fails_on_rank_2")
        self.assertEqual(len(result.errors), 1)
        text = result.errors[0][1]
        self.assertIn("Thread 1 (rank 1) exited with exception", text)
        self.assertIn("Thread 2 (rank 2) exited with exception", text)
        self.assertNotIn("Thread 0", text)
        self.assertIn("only rank 0 passes", text)

    def test_skip_in_ranks_is_a_skip(self) -> None:
        result = self._run("test_skipped")
        self.assertEqual([r for _, r in result.skipped], ["skipped in a rank"])


class InitTest(TestCase):
    def test_plain_threads_get_their_own_world(self) -> None:
        store, ranks = dist.HashStore(), {}

        def rank_main(r: int) -> None:
            dist.init_process_group("threaded", rank=r, world_size=4, store=store)
            t = torch.tensor([float(r)])
            dist.all_reduce(t)
            ranks[r] = (dist.get_rank(), dist.get_backend(), t.item())
            dist.destroy_process_group()
            # a second world on the same store, same threads
            dist.init_process_group("threaded", rank=r, world_size=4, store=store)
            dist.barrier()
            dist.destroy_process_group()

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        self.assertEqual(ranks, {r: (r, "threaded", 6.0) for r in range(4)})
        self.assertFalse(dist.is_initialized())

    def test_errors_are_dist_errors(self) -> None:
        @spawn_threads_and_init_comms(world_size=2)
        def run(self: TestCase) -> None:
            t = torch.ones(3 if dist.get_rank() == 0 else 4)
            with self.assertRaises(DistBackendError):
                dist.all_reduce(t)

        run(self)


class QueuedInputTest(TestCase):
    def test_queued_allreduce_reduces_the_tensors_of_the_list_given_at_issue(self) -> None:
        """``ProcessGroup.allreduce(list)`` queued behind another operation: replacing an
        entry of the caller's list afterwards must not change what it reduces (the engine
        keeps its own copy of the list, as torch copies the vector)."""
        issued = threading.Event()

        @spawn_threads_and_init_comms(world_size=2, timeout=20)
        def run(self: TestCase) -> None:
            pg = dist.group.WORLD
            rank = dist.get_rank()
            first, given, other = torch.ones(4), torch.full((4,), rank + 1.0), torch.zeros(4)
            if rank == 1:
                assert issued.wait(10), "rank 0 never issued"
            ahead = pg.allreduce([first])  # rank 0: waits for rank 1, holding up the next one
            ts = [given]
            queued = pg.allreduce(ts)
            if rank == 0:
                ts[0] = other
                issued.set()
            ahead.wait()
            queued.wait()
            self.assertEqual(given.tolist(), [3.0] * 4)
            self.assertEqual(other.tolist(), [0.0] * 4)

        run(self)
