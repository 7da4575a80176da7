"""Shared test bodies, after torch's ``test/distributed/test_c10d_common.py``.

Ported backend tests import this module as ``test_c10d_common`` and mix the
abstract classes into their own, exactly like torch's suite does. The bodies
check what the upstream ones check (same assertions, same error regexes as
PyTorch 2.13's behaviour), written against the ``torch.distributed`` API of the
module selected in :mod:`pyc10d.testing._dist` (pyc10d by default).

Differences from upstream, by necessity:

* ``CompilerTest`` traces in-place collectives as pyc10d's functional ops (see
  :mod:`pyc10d.testing.c10d_work`) instead of through a ``CommTensor``; the rest
  of each body is upstream's: make_fx, a graph check, traced vs eager.
* ``ProcessGroupWithDispatchedCollectivesTests`` keeps the helpers and the
  backend-agnostic ``test_init_process_group_optional_backend``; the tests that
  enumerate every torch backend or start a torch subprocess are left out.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - conventional name

from pyc10d.testing._dist import c10d, dist
from pyc10d.testing.data import gpus_for_rank
from pyc10d.testing.multiprocess import MultiProcessTestCase
from pyc10d.testing.net import LOOPBACK, find_free_port

__all__ = [
    "LOOPBACK",
    "AbstractCommTest",
    "AbstractLargeCommTest",
    "AbstractTimeoutTest",
    "CompilerTest",
    "ModuleForDdpCommHook",
    "ProcessGroupWithDispatchedCollectivesTests",
    "SparseGradientModule",
    "Task",
    "dummy_process_group",
    "gpus_for_rank",
]


# --------------------------------------------------------------------------- models
class Task(nn.Module):
    """A single 2x2 parameter added to the input (DDP tests use it)."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(2, 2))

    def forward(self, x: Any) -> torch.Tensor:
        return self.p + x


class ModuleForDdpCommHook(nn.Module):
    """``Task`` applied to ``x + rank``: gradients differ per rank unless hooked."""

    def __init__(self) -> None:
        super().__init__()
        self.t0 = Task()

    def forward(self, x: Any, rank: int) -> torch.Tensor:
        return self.t0(x + rank)


class SparseGradientModule(nn.Module):
    """An ``EmbeddingBag`` with sparse gradients followed by a softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(10, 10, sparse=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.embedding(x), dim=1)


_dummy_pg_classes: dict[type, type] = {}


def dummy_process_group(rank: int, size: int) -> Any:
    """A ``dist.ProcessGroup`` that was never registered with ``new_group``."""
    base = dist.ProcessGroup
    cls = _dummy_pg_classes.get(base)
    if cls is None:

        class DummyProcessGroup(base):  # type: ignore[misc, valid-type]
            def __init__(self, rank: int, size: int) -> None:
                super().__init__(rank, size)
                self._dummy_rank, self._dummy_size = rank, size

            def rank(self) -> int:
                return self._dummy_rank

            def size(self) -> int:
                return self._dummy_size

            def getBackendName(self) -> str:  # noqa: N802 - torch API name
                return "Dummy"

        cls = _dummy_pg_classes[base] = DummyProcessGroup
    return cls(rank, size)


def _init_default_group(test: Any, backend: str) -> None:
    """``init_process_group`` over a ``FileStore`` on the test's ``file_name``."""
    store = dist.FileStore(test.file_name, test.world_size)
    dist.init_process_group(backend, world_size=test.world_size, rank=test.rank, store=store)


# ------------------------------------------------------------------ timeouts
class AbstractTimeoutTest:
    """A store behind a 1 s default timeout gives up on a missing key quickly."""

    def _test_store_timeout(self, backend: str, init_method: str, c2p: list[Any]) -> None:
        try:
            dist.init_process_group(
                backend=backend,
                init_method=init_method,
                world_size=1,
                rank=0,
                timeout=timedelta(seconds=1),
            )
            store = c10d._get_default_store()
            started = time.time()
            with self.assertRaisesRegex(RuntimeError, "(?i)timeout"):  # type: ignore[attr-defined]
                store.get("nonexistent key")
            waited = time.time() - started
            dist.destroy_process_group()
            c2p.append(float(waited))
        except RuntimeError as exc:
            # e.g. "Address already in use": hand it to the main thread so that
            # @retry_on_connect_failures can retry the test.
            c2p.append(exc)

    def _init_methods(self) -> Iterator[str]:
        fd, name = tempfile.mkstemp(prefix="pyc10d_timeout_")
        os.close(fd)
        try:
            if sys.platform == "win32":
                yield "file:///{}".format(name.replace("\\", "/"))
            else:
                yield f"file://{name}"
                yield f"tcp://127.0.0.1:{find_free_port():d}"
        finally:
            try:
                os.remove(name)
            except OSError:
                pass

    def _test_default_store_timeout(self, backend: str) -> None:
        for init_method in self._init_methods():
            c2p: list[Any] = []
            worker = threading.Thread(
                target=self._test_store_timeout, args=(backend, init_method, c2p), daemon=True
            )
            worker.start()
            worker.join(5)

            self.assertEqual(1, len(c2p))  # type: ignore[attr-defined]
            outcome = c2p[0]
            if isinstance(outcome, float):
                # The wait should take about 1 s; 3 s leaves room for a slow machine.
                self.assertGreater(3, outcome)  # type: ignore[attr-defined]
            elif isinstance(outcome, RuntimeError):
                raise outcome
            else:
                raise RuntimeError(f"Unexpected type {type(outcome)}")


# -------------------------------------------------------------- communicators
class AbstractCommTest:
    """Group bookkeeping every backend must get right (world size 2)."""

    @property
    def op_timeout_sec(self) -> int:
        return 1

    @property
    def world_size(self) -> int:
        return 2

    @property
    def device(self) -> Any:
        self.fail("test subclass didn't override device")  # type: ignore[attr-defined]

    def _verify_sequence_number_across_pg(self, pg: Any, verify_pg: Any) -> int:
        """All members of ``pg`` agree on its sequence number (checked over ``verify_pg``)."""
        seq_num = pg._get_sequence_number_for_group()
        gathered: list[Any] = [None] * dist.get_world_size(verify_pg)
        # A separate group carries the check so it does not bump pg's counter.
        dist.all_gather_object(gathered, seq_num, group=verify_pg)
        self.assertEqual(len(set(gathered)), 1)  # type: ignore[attr-defined]
        return gathered[0]

    def _test_sequence_num_incremented(self, process_group: Any, ranks: list[int]) -> None:
        verify_pg = dist.new_group(ranks=ranks, backend="gloo")
        if dist.get_world_size(process_group) != dist.get_world_size(verify_pg):
            raise AssertionError(
                f"World sizes mismatch: {dist.get_world_size(process_group)} "
                f"vs {dist.get_world_size(verify_pg)}"
            )
        member = not c10d._rank_not_in_group(process_group)
        initial = self._verify_sequence_number_across_pg(process_group, verify_pg) if member else -1

        for i in range(10):
            t = torch.ones(1, device=torch.cuda.current_device())
            dist.all_reduce(t, group=process_group)
            if member:
                seq_num = self._verify_sequence_number_across_pg(process_group, verify_pg)
                self.assertEqual(initial + i + 1, seq_num)  # type: ignore[attr-defined]

        if dist.get_world_size(process_group) <= 2:
            return
        # Ranks 0 and 2 skip one collective, so they end up one behind the others.
        if dist.get_rank(process_group) not in (0, 2):
            dist.all_reduce(t, group=process_group, async_op=True)
        if not member:
            return
        seq_num = process_group._get_sequence_number_for_group()
        rank = dist.get_rank(process_group)
        gathered: list[Any] = [None] * dist.get_world_size(verify_pg)
        dist.all_gather_object(gathered, (rank, seq_num), group=verify_pg)
        by_rank = dict(gathered)
        self.assertEqual(len(set(by_rank.values())), 2)  # type: ignore[attr-defined]
        self.assertEqual(by_rank[0], by_rank[2])  # type: ignore[attr-defined]
        others = {seq for r, seq in by_rank.items() if r not in (0, 2)}
        self.assertEqual(len(others), 1)  # type: ignore[attr-defined]
        self.assertEqual(by_rank[0] + 1, by_rank[1])  # type: ignore[attr-defined]

    def _test_sequence_num_incremented_default_group(self, backend_name: str) -> None:
        torch.cuda.set_device(self.rank)  # type: ignore[attr-defined]
        _init_default_group(self, backend_name)
        self._test_sequence_num_incremented(
            c10d._get_default_group(), ranks=list(range(dist.get_world_size()))
        )

    def _test_sequence_num_incremented_subgroup(self, backend_name: str) -> None:
        torch.cuda.set_device(self.rank)  # type: ignore[attr-defined]
        _init_default_group(self, backend_name)
        subgroup_ranks = [0, 1, 2]
        subgroup = dist.new_group(subgroup_ranks)
        self._test_sequence_num_incremented(subgroup, subgroup_ranks)

    def _test_sequence_num_set_default_pg(self, backend: str) -> None:
        _init_default_group(self, backend)
        seq_num = c10d._get_default_group()._get_sequence_number_for_group()
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, seq_num)
        self.assertEqual(len(set(gathered)), 1)  # type: ignore[attr-defined]

    def _test_sequence_num_set_new_group(self, backend: str) -> None:
        _init_default_group(self, backend)
        subgroup = dist.new_group([0, 1])
        if c10d._rank_not_in_group(subgroup):
            return
        seq_num = subgroup._get_sequence_number_for_group()
        gathered: list[Any] = [None] * dist.get_world_size(subgroup)
        dist.all_gather_object(gathered, seq_num, group=subgroup)
        self.assertEqual(len(set(gathered)), 1)  # type: ignore[attr-defined]

    def _test_warn_not_in_group(self, backend: str) -> None:
        _init_default_group(self, backend)
        in_group_ranks = [r for r in range(self.world_size) if r % 2 == 0]
        group = dist.new_group(in_group_ranks)

        x = torch.zeros(2, 2).to(self.rank)  # type: ignore[attr-defined]
        xs = [torch.zeros(2, 2).to(self.rank) for _ in in_group_ranks]  # type: ignore[attr-defined]
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("all_gather", lambda: dist.all_gather(xs, x, group=group)),
            ("all_reduce", lambda: dist.all_reduce(x, group=group)),
            ("barrier", lambda: dist.barrier(group=group)),
            ("broadcast", lambda: dist.broadcast(x, src=0, group=group)),
        ]
        for name, call in calls:
            if self.rank in in_group_ranks:  # type: ignore[attr-defined]
                call()
            else:
                with self.assertWarnsOnceRegex(  # type: ignore[attr-defined]
                    UserWarning, f".*{name}.*does not belong to.*"
                ):
                    call()

    def _test_rank_membership(self, backend: str) -> None:
        _init_default_group(self, backend)
        self.assertTrue(self.world_size > 1)  # type: ignore[attr-defined]

        group = dist.new_group(ranks=[1])
        unregistered = dummy_process_group(self.rank, self.world_size)  # type: ignore[attr-defined]
        self.assertEqual(dist.get_group_rank(group, 1), 0)  # type: ignore[attr-defined]
        with self.assertRaisesRegex(ValueError, "not part of group"):  # type: ignore[attr-defined]
            dist.get_group_rank(group, 0)
        with self.assertRaisesRegex(ValueError, "not registered"):  # type: ignore[attr-defined]
            dist.get_group_rank(unregistered, 0)

        self.assertEqual(dist.get_global_rank(group, 0), 1)  # type: ignore[attr-defined]
        with self.assertRaisesRegex(ValueError, "not part of group"):  # type: ignore[attr-defined]
            dist.get_global_rank(group, 1)
        with self.assertRaisesRegex(ValueError, "not registered"):  # type: ignore[attr-defined]
            dist.get_global_rank(unregistered, 0)

        self.assertEqual(dist.get_process_group_ranks(group), [1])  # type: ignore[attr-defined]

    def _test_tensor_dtype_mismatch(self, backend: str) -> None:
        _init_default_group(self, backend)
        tensor = torch.ones(2, 2, device=self.device) * 7
        tensor_h = tensor.half()
        tensor_list = [torch.zeros(2, 2, device=self.device) for _ in range(self.world_size)]
        tensor_list_h = list(tensor_list)
        tensor_list_h[1] = tensor_list_h[1].half()

        mismatched: list[Callable[[], Any]] = [
            lambda: dist.all_gather(tensor_list_h, tensor),
            lambda: dist.all_gather(tensor_list, tensor_h),
            lambda: dist.all_gather_coalesced([tensor_list_h], tensor_list),
            lambda: dist.all_reduce_coalesced(tensor_list_h),
            lambda: dist.reduce_scatter(tensor, tensor_list_h),
            lambda: dist.reduce_scatter(tensor_h, tensor_list),
            lambda: dist.all_to_all_single(tensor_h, tensor),
            lambda: dist.all_to_all(tensor_list_h, tensor_list),
            lambda: dist.all_to_all(tensor_list, tensor_list_h),
            lambda: dist.scatter(tensor, tensor_list_h),
            lambda: dist.gather(tensor_h, tensor_list),
            lambda: dist.gather(tensor, tensor_list_h),
            lambda: dist.scatter(tensor_h, tensor_list),
        ]
        for call in mismatched:
            with self.assertRaisesRegex(ValueError, "tensors with different dtypes"):  # type: ignore[attr-defined]
                call()

    def _test_tensor_dtype_complex(self, backend: str) -> None:
        _init_default_group(self, backend)
        tensor = torch.rand(2, device=self.device)
        tensor_c = torch.view_as_complex(tensor)
        tensor_list = [torch.rand(2, device=self.device) for _ in range(self.world_size)]
        tensor_list_c = list(tensor_list)
        tensor_list_c[1] = torch.view_as_complex(tensor_list_c[1])

        # Complex tensors are gathered as pairs of reals, so mixing them with
        # real tensors of twice the length must be accepted.
        dist.all_gather(tensor_list, tensor)
        dist.all_gather(tensor_list, tensor_c)
        dist.all_gather(tensor_list_c, tensor)
        dist.all_gather(tensor_list_c, tensor_c)

    def _test_bool_tensors(self, backend: str) -> None:
        _init_default_group(self, backend)
        device = "cuda" if backend == "nccl" else "xpu" if backend == "xccl" else "cpu"
        tensor = torch.tensor([1, 0, 0, 1], dtype=torch.bool, device=device)
        zeros = torch.tensor([0, 0, 0, 0], dtype=torch.bool, device=device)
        received = zeros if self.rank > 0 else tensor  # type: ignore[attr-defined]
        dist.broadcast(received, src=0)
        self.assertEqual(received, tensor)  # type: ignore[attr-defined]


class AbstractLargeCommTest:
    """Group creation with ``use_local_synchronization`` (world size 4)."""

    @property
    def op_timeout_sec(self) -> int:
        return 1

    @property
    def world_size(self) -> int:
        return 4

    @property
    def device(self) -> Any:
        raise RuntimeError("Implement me")

    def _test_new_group_local_sync(self, backend: str) -> None:
        _init_default_group(self, backend)
        rank = dist.get_rank()
        ranks_in = [rank, (rank + 2) % self.world_size]
        ranks_out = [i for i in range(self.world_size) if i not in ranks_in]
        self.assertIn(rank, ranks_in)  # type: ignore[attr-defined]
        self.assertNotIn(rank, ranks_out)  # type: ignore[attr-defined]

        # Non-members get None here (torch 2.13), not GroupMember.NON_GROUP_MEMBER.
        self.assertIsNone(  # type: ignore[attr-defined]
            dist.new_group(ranks=ranks_out, use_local_synchronization=True)
        )
        new_pg = dist.new_group(ranks=ranks_in, use_local_synchronization=True)
        self.assertIsInstance(new_pg, dist.ProcessGroup)  # type: ignore[attr-defined]

        # Ranks are sorted before the group is built: [3, 1] becomes group ranks [1, 0].
        ranks_in.sort()
        self.assertEqual(dist.get_group_rank(new_pg, rank), ranks_in.index(rank))  # type: ignore[attr-defined]
        self.assertEqual(  # type: ignore[attr-defined]
            ranks_in,
            dist.get_process_group_ranks(new_pg),
            lambda msg: (
                f"{msg}\nexpecting {ranks_in} but got {dist.get_process_group_ranks(new_pg)}"
            ),
        )

    def _all_gather_in_pair_group(self, new_pg: Any, pg_idx: int, ranks_in: list[int]) -> None:
        rank = dist.get_rank()
        input_tensor = torch.tensor([pg_idx, rank], device=self.device)
        output = [torch.tensor([-1, -1], device=self.device) for _ in range(new_pg.size())]
        dist.all_gather(output, input_tensor, group=new_pg)
        expected = [torch.tensor([pg_idx, r], device=self.device) for r in ranks_in]
        self.assertEqual(output, expected)  # type: ignore[attr-defined]

    def _test_new_group_local_sync_sanity_check(self, backend: str) -> None:
        _init_default_group(self, backend)
        # Split the world into two groups of two: {0, 1} and {2, 3}.
        pg_idx = dist.get_rank() // 2
        ranks_in = [pg_idx * 2, pg_idx * 2 + 1]
        new_pg = dist.new_group(ranks=ranks_in, use_local_synchronization=True)
        self._all_gather_in_pair_group(new_pg, pg_idx, ranks_in)

    def _test_new_group_local_sync_duplicate_pg(self, backend: str) -> None:
        """Several groups over the same members must coexist (no name clash)."""
        _init_default_group(self, backend)
        pg_idx = dist.get_rank() // 2
        ranks_in = [pg_idx * 2, pg_idx * 2 + 1]
        new_pgs = [dist.new_group(ranks=ranks_in, use_local_synchronization=True) for _ in range(2)]
        for new_pg in new_pgs:
            self._all_gather_in_pair_group(new_pg, pg_idx, ranks_in)


# ------------------------------------------------------- dispatched collectives
class ProcessGroupWithDispatchedCollectivesTests(MultiProcessTestCase):
    """Every collective entry point accepts the backend's tensors (world size 1)."""

    @property
    def world_size(self) -> int:
        return 1

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def test_init_process_group_optional_backend(self) -> None:
        store = dist.FileStore(self.file_name, self.world_size)
        # Without a backend name, both gloo and nccl are created when available.
        if dist.is_gloo_available() and dist.is_nccl_available():
            dist.init_process_group(store=store, rank=self.rank, world_size=self.world_size)
            dist.destroy_process_group()

    @staticmethod
    def _device_for(backend: str) -> torch.device:
        return torch.device("cuda" if backend == "nccl" else "xpu" if backend == "xccl" else "cpu")

    def _call_collective_with_varying_tensors(
        self, backend: str, collective: Callable[..., Any], *args: Any
    ) -> None:
        tensor = torch.zeros(2, 2, device=self._device_for(backend))
        if collective is dist.barrier:
            collective()
        elif collective in (dist.all_gather, dist.gather):
            collective([tensor], tensor, *args)
        elif collective is dist.scatter:
            collective(tensor, [tensor], *args)
        elif collective in (dist.reduce_scatter, dist.all_to_all):
            # gloo implements neither reduce_scatter nor all_to_all
            if backend == "gloo":
                return
            if collective is dist.reduce_scatter:
                collective(tensor, [tensor], *args)
            else:
                collective([tensor], [tensor], *args)
        else:
            collective(tensor, *args)

    def _test_collectives(self, backend: str) -> None:
        _init_default_group(self, backend)
        collectives_and_args = [
            (dist.reduce, self.rank),
            (dist.broadcast, self.rank),
            (dist.all_reduce,),
            (dist.all_gather,),
            (dist.reduce_scatter,),
            (dist.barrier,),
            (dist.all_to_all,),
            (dist.scatter,),
        ]
        for collective, *args in collectives_and_args:
            with self.subTest(collective=collective, args=args):
                self._call_collective_with_varying_tensors(backend, collective, *args)

    def _test_allreduce_coalesced(self, backend: str) -> None:
        _init_default_group(self, backend)
        tensors = [torch.ones(10, 10, device=self._device_for(backend))]
        dist.all_reduce_coalesced(tensors, dist.ReduceOp.SUM)
        for tensor in tensors:
            self.assertEqual(tensor, torch.ones(10, 10) * self.world_size)

    def _test_all_to_all_single(self, backend: str) -> None:
        _init_default_group(self, backend)
        device = self._device_for(backend)
        input_tensor = torch.ones(2, 2, device=device)
        output_tensor = torch.zeros(2, 2, device=device)
        dist.all_to_all_single(output_tensor, input_tensor)

        with self.assertRaisesRegex(ValueError, "Tensors must be contiguous"):
            dist.all_to_all_single(output_tensor, input_tensor.t())


from pyc10d.testing.c10d_work import CompilerTest  # noqa: E402 - re-exported for ported tests
