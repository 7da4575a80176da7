"""Functional collectives beyond the seed: gradients, AsyncCollectiveTensor, groups, tracing."""

import threading
import time

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import pyc10d as dist
import pyc10d.functional as ft_c
from pyc10d.functional import _eager
from pyc10d.testing import FakeStore, MultiThreadedTestCase
from pyc10d.testing.c10d_work import CompilerTestBodies

pytestmark = pytest.mark.timeout(60)


def _shadowed(fn, k):
    """On rank k: ``fn``. Elsewhere: ``fn`` on a constant, times 0, so the other ranks join every
    collective of gradcheck's forward and backward passes but add nothing to rank k's result or
    gradient: rank k's check sees the op's own Jacobian at rank k."""

    def run(x):
        if dist.get_rank() == k:
            return fn(x)
        return fn(torch.full_like(x, 0.5) + 0 * x) * 0

    return run


class _GradcheckChecks:
    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def _gradcheck_every_rank(self, fn, shape):
        name = dist.group.WORLD.group_name
        for k in range(self.world_size):
            torch.manual_seed(1000 * k + dist.get_rank())
            x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
            self.assertTrue(torch.autograd.gradcheck(_shadowed(lambda t: fn(t, name), k), (x,)))

    def test_all_gather_tensor_autograd(self):
        for dim in (0, 1):
            self._gradcheck_every_rank(lambda t, g, d=dim: ft_c.all_gather_tensor_autograd(t * 1.0, d, g), (2, 3))

    def test_reduce_scatter_tensor_autograd(self):
        n = self.world_size
        for dim in (0, 1):
            shape = (n, 2) if dim == 0 else (2, n)
            self._gradcheck_every_rank(
                lambda t, g, d=dim: ft_c.reduce_scatter_tensor_autograd(t * 1.0, "sum", d, g), shape)

    def test_all_to_all_single_autograd(self):
        n, me = self.world_size, dist.get_rank()
        splits = [1 + (me + j) % 2 for j in range(n)]  # uneven; symmetric, so sends match receives

        def a2a(t, g):
            return ft_c.all_to_all_single_autograd(t * 1.0, splits, splits, g)

        self._gradcheck_every_rank(a2a, (sum(splits), 2))

    def test_single_names(self):
        """torch 2.13's ``*_single`` names: the ``*_tensor`` operations, gradients included."""
        n, me, g = self.world_size, dist.get_rank(), dist.group.WORLD
        x = torch.arange(3.0) + 10 * me
        every = torch.cat([torch.arange(3.0) + 10 * r for r in range(n)])
        self.assertEqual(ft_c.all_gather_single(x, 0, g), every)
        self.assertEqual(ft_c.reduce_scatter_single(every, "sum", 0, g), n * (torch.arange(3.0) + 10 * me))
        gathered = ft_c.all_gather_single_coalesced([x, x * 2], g)
        self.assertEqual(gathered, [every, every * 2])
        scattered = ft_c.reduce_scatter_single_coalesced([every, every * 2], "sum", [0, 0], g)
        self.assertEqual(scattered, [n * (torch.arange(3.0) + 10 * me), 2 * n * (torch.arange(3.0) + 10 * me)])
        self._gradcheck_every_rank(lambda t, name: ft_c.all_gather_single_autograd(t * 1.0, 0, name), (2, 3))
        self._gradcheck_every_rank(
            lambda t, name: ft_c.reduce_scatter_single_autograd(t * 1.0, "sum", 0, name), (n, 2))

    def test_non_autograd_ops_give_no_gradient(self):
        x = torch.ones(4, requires_grad=True)
        out = ft_c.all_gather_tensor(x, 0, dist.group.WORLD)
        self.assertFalse(out.requires_grad)
        self.assertEqual(out, torch.ones(4 * self.world_size))


class TestGradcheckWorld2(_GradcheckChecks, MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2


class TestGradcheckWorld4(_GradcheckChecks, MultiThreadedTestCase):
    @property
    def world_size(self):
        return 4


class TestAsyncCollectiveTensor(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_waits_once_from_many_threads(self):
        big = torch.ones(1 << 16) * (dist.get_rank() + 1)  # above the inline size: asynchronous
        if dist.get_rank() == 1:
            time.sleep(0.3)  # rank 0's result stays pending meanwhile
            out = ft_c.all_reduce(big, "sum", dist.group.WORLD)
            self.assertEqual(out, torch.full_like(big, 3.0))
            return
        out = ft_c.all_reduce(big, "sum", dist.group.WORLD)
        self.assertIsInstance(out, ft_c.AsyncCollectiveTensor)
        self.assertEqual(out.shape, big.shape)  # metadata needs no wait
        calls = []
        real_wait = _eager.wait

        def counting_wait(t):
            if t is out.elem:
                calls.append(threading.get_ident())
            return real_wait(t)

        _eager.wait = counting_wait
        try:
            results = [None] * 4
            barrier = threading.Barrier(4)

            def use(i):
                barrier.wait()
                results[i] = (out + 0).sum().item()

            threads = [threading.Thread(target=use, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(out.sum().item(), 3.0 * big.numel())
        finally:
            _eager.wait = real_wait
        self.assertEqual(results, [3.0 * big.numel()] * 4)
        self.assertEqual(len(calls), 1, f"waited {len(calls)} times")
        self.assertFalse(_eager.is_pending(out.elem))

    def test_small_messages_complete_inline(self):
        out = ft_c.all_reduce(torch.ones(2), "sum", dist.group.WORLD)
        self.assertIs(type(out), torch.Tensor)  # finished: no wrapper to dispatch through
        self.assertEqual(out, torch.full((2,), 2.0))

    def test_wait_tensor_returns_plain_tensor(self):
        out = ft_c.all_gather_tensor(torch.ones(3), 0, [0, 1])
        plain = ft_c.wait_tensor(out)
        self.assertIs(type(plain), torch.Tensor)
        self.assertEqual(plain, torch.ones(6))


class TestGroupsAndOps(MultiThreadedTestCase):
    @property
    def world_size(self):
        return 4

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_every_group_spelling(self):
        rank = dist.get_rank()
        mesh = dist.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        x = torch.ones(2) * (rank + 1)
        row = [0, 1] if rank < 2 else [2, 3]
        expected_row = torch.full((2,), float(sum(r + 1 for r in row)))
        self.assertEqual(ft_c.all_reduce(x, "sum", (mesh, "tp")), expected_row)
        self.assertEqual(ft_c.all_reduce(x, "sum", mesh["tp"]), expected_row)
        self.assertEqual(ft_c.all_reduce(x, "sum", [[0, 1], [2, 3]]), expected_row)
        self.assertEqual(ft_c.all_reduce(x, "sum", mesh.get_group("tp").group_name), expected_row)
        self.assertEqual(ft_c.all_reduce(x, dist.ReduceOp.MAX, dist.group.WORLD), torch.full((2,), 4.0))

    def test_broadcast_src_is_group_rank(self):
        rank = dist.get_rank()
        mesh = dist.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        out = ft_c.broadcast(torch.ones(3) * rank, 1, mesh["tp"])
        self.assertEqual(out, torch.full((3,), float(1 if rank < 2 else 3)))

    def test_permute_and_coalesced(self):
        rank = dist.get_rank()
        out = ft_c.permute_tensor(torch.ones(2) * rank, [1, 2, 3, 0], dist.group.WORLD)
        self.assertEqual(out, torch.full((2,), float((rank - 1) % 4)))
        outs = ft_c.all_reduce_coalesced([torch.ones(2), torch.ones(3, dtype=torch.int64)], "sum", dist.group.WORLD)
        self.assertEqual(outs[0], torch.full((2,), 4.0))
        self.assertEqual(outs[1], torch.full((3,), 4, dtype=torch.int64))

    def test_bad_inputs(self):
        with self.assertRaisesRegex(ValueError, "group sizes must be identical"):
            ft_c.all_reduce(torch.ones(1), "sum", [[0], [1, 2, 3]])
        with self.assertRaisesRegex(ValueError, "multiple of group_size"):
            ft_c.reduce_scatter_tensor(torch.ones(3), "sum", 0, dist.group.WORLD)
        with self.assertRaisesRegex(ValueError, "no process group named"):
            ft_c.all_reduce(torch.ones(1), "sum", "no-such-group")


class TestTracingInPlace(MultiThreadedTestCase):
    """The in-place API under make_fx and torch.compile records its collectives."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    @staticmethod
    def _step(t):
        dist.all_reduce(t)
        outs = [torch.empty(2) for _ in range(2)]
        dist.all_gather(outs, t[:2].contiguous())
        dist.broadcast(t, src=1)
        scattered = torch.empty(2)
        dist.reduce_scatter_tensor(scattered, t)
        return t * 2 + outs[1].sum() + scattered.sum()

    def test_make_fx_records_collectives(self):
        x = torch.arange(4.0) + dist.get_rank()
        gm = make_fx(self._step)(x.clone())
        graph = str(gm.graph)
        for op in ("all_reduce", "all_gather_into_tensor", "broadcast", "reduce_scatter_tensor", "wait_tensor"):
            self.assertIn(f"pyc10d_functional.{op}", graph)
        self.assertEqual(gm(x.clone()), self._step(x.clone()))

    def test_compile_records_collectives(self):
        x = torch.arange(4.0) + dist.get_rank()
        compiled = torch.compile(self._step, backend="aot_eager", fullgraph=True)
        self.assertEqual(compiled(x.clone()), self._step(x.clone()))

    def test_untraceable_op_names_itself(self):
        with self.assertRaisesRegex(RuntimeError, "barrier"):
            make_fx(lambda t: dist.barrier() or t)(torch.ones(1))


class TestCompilerBodiesCatchNoop(CompilerTestBodies, MultiThreadedTestCase):
    """The CompilerTest bodies fail when the collective does nothing."""

    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def _get_default_group(self):
        return dist.group.WORLD

    def test_real_collective_passes(self):
        self._test_allreduce_work_wait(torch.ones(2, 2) * dist.get_rank())

    def test_noop_collective_fails(self):
        def noop(tensor, group=None):
            return dist.Work("noop") if False else _Done(), tensor

        with self.assertRaisesRegex(AssertionError, "reads no"):
            self._test_work_wait(torch.ones(2, 2) * dist.get_rank(), comm_fn=noop)


class _Done:
    def wait(self):
        return True


def test_fake_group_keeps_collectives_in_graph():
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        def fn(t):
            dist.all_reduce(t)
            return ft_c.all_gather_tensor(t, 0, dist.group.WORLD) + 1

        graph = str(make_fx(fn)(torch.ones(3)).graph)
        for op in ("all_reduce", "all_gather_into_tensor", "wait_tensor"):
            assert f"pyc10d_functional.{op}" in graph, graph
        with pytest.raises(RuntimeError, match="send"):
            make_fx(lambda t: dist.send(t, 1) or t)(torch.ones(1))
    finally:
        dist.destroy_process_group()


def test_meta_tensors_need_no_group():
    x = torch.empty(2, 3, device="meta")
    assert ft_c.all_reduce(x, "sum", "no-group-needed").shape == (2, 3)
    assert ft_c.all_to_all_single(x, [1, 1], [1, 1], "no-group-needed").shape == (2, 3)
