"""``CompilerTest`` bodies (async work, then ``wait``), after torch's test_c10d_common.

Split from :mod:`pyc10d.testing.c10d_common`, which re-exports it. As upstream, each body
traces its function with ``make_fx``, checks that every multiplication in the graph reads
a collective's result through its wait, and compares the traced run with the eager run
(equal for the same input, different for another input). pyc10d traces in-place
collectives as its functional ops (``pyc10d_functional.*`` and ``wait_tensor``); upstream
wraps the input in a ``CommTensor`` to get the same effect from torch's ops.

The bodies live in :class:`CompilerTestBodies`, so a thread-based case can run them too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.func import functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from pyc10d.testing._dist import dist
from pyc10d.testing.multiprocess import MultiProcessTestCase

__all__ = ["CompilerTest", "CompilerTestBodies"]

_COMM_NAMES = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast",
               "all_to_all", "alltoall", "scatter")


def _is_comm(node: Any) -> bool:
    name = str(node.target)
    return node.op == "call_function" and "wait" not in name and any(c in name for c in _COMM_NAMES)


def _is_wait(node: Any) -> bool:
    return node.op == "call_function" and "wait" in str(node.target)


def _ancestors(node: Any) -> list[Any]:
    seen, todo, out = set(), list(node.all_input_nodes), []
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        out.append(n)
        todo.extend(n.all_input_nodes)
    return out


# ------------------------------------------------------------------ work/wait
class CompilerTestBodies:
    """Async collectives traced by ``make_fx``: the wait orders the use after the collective."""

    def _get_default_group(self) -> Any:
        raise NotImplementedError("To be implemented by subclass")

    def _test_work_wait(self, x: torch.Tensor, comm_fn: Callable[..., Any]) -> None:
        pg = self._get_default_group()

        def fn(x: torch.Tensor) -> Any:
            work, z = comm_fn(x + x, group=pg)
            work.wait()
            if isinstance(z, list):
                return [zz * 2 for zz in z]
            if isinstance(z, torch.Tensor):
                return z * 2
            raise RuntimeError("Unexpected return type")

        xx = x.clone()
        # Functionalized, a collective written into a view of a tensor shows up as a new
        # value the later reads depend on (plain make_fx records a copy_ the graph's data
        # flow does not show).
        traced_fn = make_fx(functionalize(fn, remove="mutations_and_views"))(xx)
        traced_fn.graph.lint()
        traced_fn.graph.eliminate_dead_code()

        # every multiplication reads a collective's result through its wait
        muls = [n for n in traced_fn.graph.nodes if n.op == "call_function" and "mul.Tensor" in str(n.target)]
        self.assertTrue(muls, f"no multiplication in the traced graph:\n{traced_fn.graph}")
        for node in muls:
            before = _ancestors(node)
            self.assertTrue(any(_is_wait(n) for n in before), f"{node} reads no wait:\n{traced_fn.graph}")
            self.assertTrue(any(_is_comm(n) for n in before), f"{node} reads no collective:\n{traced_fn.graph}")

        # Update input to make sure we are not recording it as constant during tracing.
        x += 1
        xx += 1
        y = fn(x)
        yy = traced_fn(xx)
        self.assertEqual(y, yy)
        xx += 1
        yy = traced_fn(xx)
        self.assertNotEqual(y, yy)

    def _test_allreduce_work_wait(self, tensor: torch.Tensor) -> None:
        def comm_fn(tensor: torch.Tensor, group: Any = None) -> Any:
            return dist.all_reduce(tensor, group=group, async_op=True), tensor

        self._test_work_wait(tensor, comm_fn=comm_fn)

    def _test_allgather_work_wait(self, tensor: torch.Tensor) -> None:
        def comm_fn(tensor: torch.Tensor, group: Any = None) -> Any:
            out_tensors = [torch.zeros_like(tensor) for _ in range(group.size())]
            work = dist.all_gather(out_tensors, tensor, group=group, async_op=True)
            work.wait()
            return work, sum(out_tensors)

        self._test_work_wait(tensor, comm_fn=comm_fn)

    def _test_allgather_into_tensor_work_wait(self, tensor: torch.Tensor) -> None:
        def comm_fn(tensor: torch.Tensor, group: Any = None) -> Any:
            output = torch.cat([torch.zeros_like(tensor) for _ in range(group.size())], dim=0)
            work = dist.all_gather_into_tensor(output, tensor, group=group, async_op=True)
            work.wait()
            return work, output

        self._test_work_wait(tensor, comm_fn=comm_fn)

    def _test_reduce_scatter_work_wait(self, tensor: torch.Tensor) -> None:
        def comm_fn(tensor: torch.Tensor, group: Any = None) -> Any:
            in_tensors = [tensor.clone() + i for i in range(group.size())]
            out_tensor = torch.zeros_like(tensor)
            work = dist.reduce_scatter(out_tensor, in_tensors, group=group, async_op=True)
            return work, out_tensor

        self._test_work_wait(tensor, comm_fn=comm_fn)

    def _test_reduce_scatter_tensor_work_wait(self, tensor: torch.Tensor) -> None:
        def comm_fn(tensor: torch.Tensor, group: Any = None) -> Any:
            out_tensor = torch.zeros_like(tensor).chunk(group.size(), dim=0)[self.rank]
            work = dist.reduce_scatter_tensor(out_tensor, tensor, group=group, async_op=True)
            return work, out_tensor

        self._test_work_wait(tensor, comm_fn=comm_fn)

    def _test_broadcast_work_wait(self, tensor: torch.Tensor) -> None:
        def comm_fn(tensor: torch.Tensor, group: Any = None) -> Any:
            return dist.broadcast(tensor, src=0, group=group, async_op=True), tensor

        self._test_work_wait(tensor, comm_fn=comm_fn)

    def _test_scatter_work_wait(self, tensor: torch.Tensor) -> None:
        def comm_fn(tensor: torch.Tensor, group: Any = None) -> Any:
            in_tensors = [tensor + i for i in range(group.size())] if self.rank == 0 else None
            out_tensor = torch.zeros_like(tensor)
            work = dist.scatter(out_tensor, in_tensors, src=0, group=group, async_op=True)
            return work, out_tensor

        self._test_work_wait(tensor, comm_fn=comm_fn)

    def _test_alltoall_work_wait(self, tensor: torch.Tensor) -> None:
        def comm_fn(tensor: torch.Tensor, group: Any = None) -> Any:
            out_tensors = [torch.zeros_like(tensor) for _ in range(group.size())]
            in_tensors = [tensor for _ in range(group.size())]
            work = dist.all_to_all(out_tensors, in_tensors, group=group, async_op=True)
            return work, out_tensors

        self._test_work_wait(tensor, comm_fn=comm_fn)

    def _test_nested_comm_tensor_wrapping(self, tensor: torch.Tensor) -> None:
        # Upstream wraps an already wrapped CommTensor; eagerly that is a plain
        # all_reduce on a fresh view of the tensor.
        def comm_fn(tensor: torch.Tensor, group: Any = None) -> Any:
            work = dist.all_reduce(tensor.view_as(tensor), group=group, async_op=True)
            return work, tensor

        self._test_work_wait(tensor, comm_fn=comm_fn)

    def _test_consecutive_comm_work_wait(self, tensor: torch.Tensor) -> None:
        def comm_fn(tensor: torch.Tensor, group: Any = None) -> Any:
            work1 = dist.all_reduce(tensor, group=group, async_op=True)
            work1.wait()
            work2 = dist.all_reduce(tensor, group=group, async_op=True)
            return work2, tensor

        self._test_work_wait(tensor, comm_fn=comm_fn)


class CompilerTest(CompilerTestBodies, MultiProcessTestCase):
    """The bodies on one process per rank (upstream's class of the same name)."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
