"""DeviceMesh: the index math alone, then meshes on 4 threaded ranks."""

from __future__ import annotations

import unittest

import numpy as np
import pytest
import torch

import pyc10d as dist
from pyc10d.device_mesh import (
    DeviceMesh,
    init_device_mesh,
    mesh_coordinate,
    mesh_dim_lines,
    submesh_ranks,
)
from pyc10d.distributed_c10d import _get_default_group, _get_group_tag
from pyc10d.testing import MultiThreadedTestCase

pytestmark = pytest.mark.timeout(30)


class TestIndexMath(unittest.TestCase):
    def test_lines_2x2(self) -> None:
        mesh = torch.arange(4).view(2, 2)
        self.assertEqual(mesh_dim_lines(mesh, 0), [[0, 2], [1, 3]])
        self.assertEqual(mesh_dim_lines(mesh, 1), [[0, 1], [2, 3]])

    def test_lines_2x3(self) -> None:
        mesh = torch.arange(6).view(2, 3)
        self.assertEqual(mesh_dim_lines(mesh, 0), [[0, 3], [1, 4], [2, 5]])
        self.assertEqual(mesh_dim_lines(mesh, 1), [[0, 1, 2], [3, 4, 5]])

    def test_lines_2x2x2(self) -> None:
        mesh = torch.arange(8).view(2, 2, 2)
        self.assertEqual(mesh_dim_lines(mesh, 0), [[0, 4], [1, 5], [2, 6], [3, 7]])
        self.assertEqual(mesh_dim_lines(mesh, 1), [[0, 2], [1, 3], [4, 6], [5, 7]])
        self.assertEqual(mesh_dim_lines(mesh, 2), [[0, 1], [2, 3], [4, 5], [6, 7]])

    def test_lines_cover_every_rank_once(self) -> None:
        mesh = torch.randperm(24).view(2, 3, 4)
        for d in range(3):
            flat = sorted(r for line in mesh_dim_lines(mesh, d) for r in line)
            self.assertEqual(flat, list(range(24)))

    def test_coordinate(self) -> None:
        mesh = torch.arange(8).view(2, 2, 2)
        self.assertEqual(mesh_coordinate(mesh, 0), [0, 0, 0])
        self.assertEqual(mesh_coordinate(mesh, 5), [1, 0, 1])
        self.assertEqual(mesh_coordinate(mesh, 6), [1, 1, 0])
        self.assertIsNone(mesh_coordinate(mesh, 8))

    def test_submesh(self) -> None:
        mesh = torch.arange(8).view(2, 2, 2)
        self.assertEqual(submesh_ranks(mesh, [1, 0, 1], [2]).tolist(), [4, 5])
        self.assertEqual(submesh_ranks(mesh, [1, 0, 1], [0]).tolist(), [1, 5])
        self.assertEqual(submesh_ranks(mesh, [1, 0, 1], [0, 2]).tolist(), [[0, 1], [4, 5]])
        self.assertEqual(submesh_ranks(mesh, [1, 0, 1], [2, 0]).tolist(), [[0, 4], [1, 5]])

    def test_layout_without_backend(self) -> None:
        m = DeviceMesh("cpu", np.arange(6).reshape(2, 3), mesh_dim_names=["a", "b"], _init_backend=False)
        self.assertEqual((m.ndim, m.shape, m.size(), m.size(1)), (2, (2, 3), 6, 3))
        self.assertEqual(m.mesh.dtype, torch.int)
        self.assertEqual(m.mesh_dim_names, ("a", "b"))
        self.assertEqual(repr(m), "DeviceMesh('cpu', [[0, 1, 2], [3, 4, 5]], mesh_dim_names=('a', 'b'))")
        with self.assertRaisesRegex(RuntimeError, "no process groups"):
            m.get_group(0)

    def test_eq_hash(self) -> None:
        a = DeviceMesh("cpu", [[0, 1], [2, 3]], _init_backend=False)
        b = DeviceMesh("cpu", torch.arange(4).view(2, 2), _init_backend=False)
        self.assertEqual(a, b)
        self.assertEqual(hash(a), hash(b))
        self.assertNotEqual(a, DeviceMesh("cpu", [0, 1, 2, 3], _init_backend=False))
        self.assertNotEqual(a, DeviceMesh("cuda", [[0, 1], [2, 3]], _init_backend=False))
        self.assertNotEqual(a, DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("x", "y"),
                                          _init_backend=False))
        self.assertNotEqual(a, DeviceMesh("cpu", [[0, 2], [1, 3]], _init_backend=False))

    def test_errors_without_groups(self) -> None:
        with self.assertRaisesRegex(RuntimeError, "duplicate ranks"):
            DeviceMesh("cpu", [[0, 1], [1, 2]], _init_backend=False)
        with self.assertRaisesRegex(RuntimeError, "one name per mesh dim"):
            DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("a",), _init_backend=False)
        with self.assertRaisesRegex(RuntimeError, "unique"):
            DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("a", "a"), _init_backend=False)
        with self.assertRaisesRegex(ValueError, "integer"):
            DeviceMesh("cpu", [0.0, 1.0], _init_backend=False)

    def test_needs_default_group(self) -> None:
        self.assertFalse(dist.is_initialized())
        with self.assertRaisesRegex(RuntimeError, "init_process_group"):
            DeviceMesh("cpu", [0, 1])
        with self.assertRaisesRegex(RuntimeError, "init_process_group"):
            init_device_mesh("cpu", (2,))


class TestDeviceMesh(MultiThreadedTestCase):
    @property
    def world_size(self) -> int:
        return 4

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def _reduce(self, group: object) -> float:
        t = torch.tensor([float(self.rank)])
        dist.all_reduce(t, group=group)
        return t.item()

    def test_1d_world_mesh_uses_default_group(self) -> None:
        count = dist.get_pg_count()
        mesh = DeviceMesh("cpu", list(range(4)))
        self.assertIs(mesh.get_group(), _get_default_group())
        self.assertIs(mesh.get_group(0), _get_default_group())
        self.assertEqual(dist.get_pg_count(), count)
        tag, ranks, name = mesh._dim_group_infos[0]
        self.assertEqual(tag, _get_group_tag(mesh.get_group(0)))
        self.assertEqual(ranks, [0, 1, 2, 3])
        self.assertEqual(name, _get_default_group().group_name)
        self.assertEqual(mesh.get_local_rank(), self.rank)
        self.assertEqual(mesh.get_coordinate(), [self.rank])
        self.assertEqual(self._reduce(mesh.get_group()), 6.0)

    def test_2d_groups(self) -> None:
        mesh = DeviceMesh("cpu", [[0, 1], [2, 3]])
        col = [0, 2] if self.rank in (0, 2) else [1, 3]
        row = [0, 1] if self.rank in (0, 1) else [2, 3]
        self.assertEqual(dist.get_process_group_ranks(mesh.get_group(0)), col)
        self.assertEqual(dist.get_process_group_ranks(mesh.get_group(1)), row)
        self.assertEqual(mesh.get_all_groups(), [mesh.get_group(0), mesh.get_group(1)])
        self.assertEqual(mesh.get_coordinate(), [self.rank // 2, self.rank % 2])
        self.assertEqual(mesh.get_local_rank(0), self.rank // 2)
        self.assertEqual(mesh.get_local_rank(1), self.rank % 2)
        self.assertEqual(mesh.get_rank(), self.rank)
        self.assertEqual([info[1] for info in mesh._dim_group_infos], [col, row])
        for d in (0, 1):
            tag, _, name = mesh._dim_group_infos[d]
            self.assertEqual(tag, _get_group_tag(mesh.get_group(d)))
            self.assertEqual(name, mesh.get_group(d).group_name)
        self.assertEqual(self._reduce(mesh.get_group(0)), float(sum(col)))
        self.assertEqual(self._reduce(mesh.get_group(1)), float(sum(row)))
        with self.assertRaisesRegex(RuntimeError, "Found the DeviceMesh have 2 dimensions"):
            mesh.get_group()
        with self.assertRaisesRegex(RuntimeError, "Found the DeviceMesh have 2 dimensions"):
            mesh.get_local_rank()

    def test_init_device_mesh_and_slicing(self) -> None:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        self.assertEqual(mesh.mesh.tolist(), [[0, 1], [2, 3]])
        count = dist.get_pg_count()
        tp, dp = mesh["tp"], mesh["dp"]
        self.assertEqual((tp.size(), dp.size(), tp.ndim), (2, 2, 1))
        self.assertEqual(tp.mesh_dim_names, ("tp",))
        self.assertEqual(tp.mesh.tolist(), [0, 1] if self.rank < 2 else [2, 3])
        self.assertEqual(dp.mesh.tolist(), [0, 2] if self.rank % 2 == 0 else [1, 3])
        self.assertIs(tp.get_group(), mesh.get_group("tp"))
        self.assertIs(dp.get_group(), mesh.get_group(0))
        self.assertEqual(tp._dim_group_infos, [mesh._dim_group_infos[1]])
        self.assertEqual(tp.get_local_rank(), self.rank % 2)
        self.assertEqual(dp.get_coordinate(), [self.rank // 2])
        self.assertIs(mesh["dp", "tp"], mesh)
        swapped = mesh["tp", "dp"]
        self.assertEqual(swapped.mesh.tolist(), [[0, 2], [1, 3]])
        self.assertIs(swapped.get_group("tp"), mesh.get_group("tp"))
        self.assertEqual(dist.get_pg_count(), count)
        self.assertEqual(self._reduce(tp.get_group()), 1.0 if self.rank < 2 else 5.0)
        self.assertEqual(self._reduce(dp.get_group()), 2.0 if self.rank % 2 == 0 else 4.0)

    def test_slice_on_one_rank_alone(self) -> None:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        if self.rank == 3:
            count = dist.get_pg_count()
            self.assertEqual(mesh["tp"].mesh.tolist(), [2, 3])
            self.assertEqual(dist.get_pg_count(), count)
        dist.barrier()

    def test_same_layout_reuses_groups(self) -> None:
        first = DeviceMesh("cpu", [[0, 1], [2, 3]])
        count = dist.get_pg_count()
        second = DeviceMesh("cpu", torch.arange(4).view(2, 2), mesh_dim_names=("a", "b"))
        self.assertEqual(dist.get_pg_count(), count)
        self.assertIs(second.get_group(0), first.get_group(0))
        self.assertIs(second.get_group(1), first.get_group(1))
        # The transposed layout has the same lines, dims swapped: still nothing new.
        transposed = DeviceMesh("cpu", [[0, 2], [1, 3]])
        self.assertEqual(dist.get_pg_count(), count)
        self.assertIs(transposed.get_group(0), first.get_group(1))
        # A different layout does create groups, on every rank alike.
        DeviceMesh("cpu", [[0, 3], [1, 2]])
        self.assertGreater(dist.get_pg_count(), count)

    def test_3d_mesh(self) -> None:
        mesh = DeviceMesh("cpu", torch.arange(4).view(2, 1, 2), mesh_dim_names=("a", "b", "c"))
        ranks = [dist.get_process_group_ranks(g) for g in mesh.get_all_groups()]
        self.assertEqual(ranks[0], [self.rank % 2, self.rank % 2 + 2])
        self.assertEqual(ranks[1], [self.rank])
        self.assertEqual(ranks[2], [0, 1] if self.rank < 2 else [2, 3])
        self.assertEqual(mesh.get_coordinate(), [self.rank // 2, 0, self.rank % 2])
        self.assertEqual(self._reduce(mesh.get_group("a")), float(ranks[0][0] + ranks[0][1]))
        self.assertEqual(self._reduce(mesh.get_group("b")), float(self.rank))
        ac = mesh["a", "c"]
        self.assertEqual(ac.mesh.tolist(), [[0, 1], [2, 3]])
        self.assertIs(ac.get_group(1), mesh.get_group(2))

    def test_from_group(self) -> None:
        pair = dist.new_group([0, 1]), dist.new_group([2, 3])
        mine = pair[0] if self.rank < 2 else pair[1]
        count = dist.get_pg_count()
        mesh = DeviceMesh.from_group(mine, "cpu", mesh_dim_names=("x",))
        self.assertEqual(dist.get_pg_count(), count)
        self.assertIs(mesh.get_group("x"), mine)
        self.assertEqual(mesh.mesh.tolist(), [0, 1] if self.rank < 2 else [2, 3])
        self.assertEqual(mesh.get_local_rank(), self.rank % 2)
        self.assertEqual(mesh._dim_group_infos[0][0], _get_group_tag(mine))
        with self.assertRaisesRegex(ValueError, "differs"):
            DeviceMesh.from_group(mine, "cpu", mesh=[3, 2, 1, 0])
        world = DeviceMesh.from_group(_get_default_group(), "cpu")
        self.assertEqual(world, DeviceMesh("cpu", [0, 1, 2, 3], _init_backend=False))

    def test_from_groups_2d(self) -> None:
        ref = DeviceMesh("cpu", [[0, 1], [2, 3]])
        count = dist.get_pg_count()
        mesh = DeviceMesh.from_group(ref.get_all_groups(), "cpu", mesh=[[0, 1], [2, 3]],
                                     mesh_dim_names=("dp", "tp"))
        self.assertEqual(dist.get_pg_count(), count)
        self.assertEqual(mesh.get_all_groups(), ref.get_all_groups())
        self.assertIs(mesh["tp"].get_group(), ref.get_group(1))
        with self.assertRaisesRegex(ValueError, "group for dim 0"):
            DeviceMesh.from_group(ref.get_all_groups()[::-1], "cpu", mesh=[[0, 1], [2, 3]])
        with self.assertRaisesRegex(ValueError, "explicit mesh"):
            DeviceMesh.from_group(ref.get_all_groups(), "cpu")

    def test_rank_outside_mesh(self) -> None:
        mesh = DeviceMesh("cpu", [[0, 1]])
        if self.rank < 2:
            self.assertEqual(dist.get_process_group_ranks(mesh.get_group(1)), [0, 1])
            self.assertEqual(self._reduce(mesh.get_group(1)), 1.0)
        else:
            self.assertIsNone(mesh.get_coordinate())
            with self.assertRaisesRegex(RuntimeError, "not in the mesh"):
                mesh.get_group(1)

    def test_errors(self) -> None:
        with self.assertRaisesRegex(RuntimeError, r"\(3, 2\).*6 ranks.*world size is 4"):
            init_device_mesh("cpu", (3, 2))
        with self.assertRaisesRegex(RuntimeError, "one name per mesh dim"):
            init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp",))
        with self.assertRaisesRegex(RuntimeError, "unique"):
            init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "dp"))
        with self.assertRaisesRegex(RuntimeError, "duplicate ranks"):
            DeviceMesh("cpu", [[0, 1], [1, 2]])
        with self.assertRaisesRegex(RuntimeError, "beyond world size 4"):
            DeviceMesh("cpu", [[0, 1], [2, 4]])
        named = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        with self.assertRaisesRegex(KeyError, r"'pp'.*\('dp', 'tp'\)"):
            named["pp"]
        with self.assertRaisesRegex(KeyError, r"'pp'.*\('dp', 'tp'\)"):
            named.get_group("pp")
        with self.assertRaisesRegex(RuntimeError, "distinct"):
            named["dp", "dp"]
        with self.assertRaisesRegex(IndexError, "out of range"):
            named.get_group(2)
        unnamed = DeviceMesh("cpu", [[0, 1], [2, 3]])
        with self.assertRaisesRegex(RuntimeError, "without mesh_dim_names"):
            unnamed["dp"]
        with self.assertRaisesRegex(KeyError, "does not exist"):
            unnamed.get_group("dp")


if __name__ == "__main__":
    unittest.main()
