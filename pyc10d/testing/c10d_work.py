"""``CompilerTest`` bodies (async work, then ``wait``), after torch's test_c10d_common.

Split from :mod:`pyc10d.testing.c10d_common`, which re-exports it. Upstream traces these
functions with ``make_fx``; here they run eagerly (see that module's docstring).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pyc10d.testing._dist import dist
from pyc10d.testing.multiprocess import MultiProcessTestCase

__all__ = ["CompilerTest"]


# ------------------------------------------------------------------ work/wait
class CompilerTest(MultiProcessTestCase):
    """Async collectives: ``work.wait()`` makes the result visible (eager only)."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

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
        x += 1
        xx += 1
        # Same input on every rank, same result; a changed input changes it.
        y = fn(x)
        yy = fn(xx)
        self.assertEqual(y, yy)

        xx += 1
        yy = fn(xx)
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
