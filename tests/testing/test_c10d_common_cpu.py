"""CPU runs of the shared c10d test bodies that the seed port gates on GPUs (sequence numbers,
rank membership, dtype checks, non-member warnings, async work)."""
import pytest
import torch

import pyc10d.testing.c10d_common as test_c10d_common
from pyc10d.testing import MultiProcessTestCase

pytestmark = pytest.mark.timeout(90)


class CpuCommTest(test_c10d_common.AbstractCommTest, MultiProcessTestCase):
    @property
    def device(self):
        return "cpu"

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_sequence_num_set_default_pg(self):
        self._test_sequence_num_set_default_pg(backend="gloo")

    def test_sequence_num_set_new_group(self):
        self._test_sequence_num_set_new_group(backend="gloo")

    def test_rank_membership(self):
        self._test_rank_membership(backend="gloo")

    def test_tensor_dtype_mismatch(self):
        self._test_tensor_dtype_mismatch(backend="gloo")

    def test_tensor_dtype_complex(self):
        self._test_tensor_dtype_complex(backend="gloo")


class CpuCommTest4(CpuCommTest):
    @property
    def world_size(self):
        return 4

    # world_size > 2 exercises the "ranks 0 and 2 lag" branch; no CUDA on CPU so
    # patch the device lookups the helper makes.
    def test_sequence_num_incremented_subgroup(self):
        torch.cuda.set_device = lambda *_: None
        torch.cuda.current_device = lambda: "cpu"
        self._test_sequence_num_incremented_subgroup("gloo")

    def test_sequence_num_incremented_default(self):
        torch.cuda.set_device = lambda *_: None
        torch.cuda.current_device = lambda: "cpu"
        self._test_sequence_num_incremented_default_group("gloo")

    def test_warn_not_in_group(self):
        orig = torch.Tensor.to
        torch.Tensor.to = lambda self, *a, **k: self if a and isinstance(a[0], int) else orig(self, *a, **k)
        self._test_warn_not_in_group(backend="gloo")


class CpuCompilerTest(test_c10d_common.CompilerTest):
    @property
    def world_size(self):
        return 2

    def _get_default_group(self):
        import pyc10d as dist
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size, store=store)
        return dist.distributed_c10d._get_default_group()

    def test_allgather_into_tensor(self):
        self._test_allgather_into_tensor_work_wait(torch.ones(2, 2) * self.rank)

    def test_reduce_scatter_tensor(self):
        self._test_reduce_scatter_tensor_work_wait(torch.ones(4, 2) * self.rank)

    def test_alltoall(self):
        self._test_alltoall_work_wait(torch.ones(2, 2) * self.rank)

    def test_reduce_scatter(self):
        self._test_reduce_scatter_work_wait(torch.ones(2, 2) * self.rank)
