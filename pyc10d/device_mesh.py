"""``DeviceMesh``: the world's ranks laid out as an n-D array, one process group per axis.

The counterpart of ``torch.distributed.device_mesh``. A mesh of shape ``(2, 2)`` over ranks
``[[0, 1], [2, 3]]`` gives each rank two groups: along dim 0 the ranks of its column
(``[0, 2]`` or ``[1, 3]``), along dim 1 those of its row (``[0, 1]`` or ``[2, 3]``).

Two halves, kept apart as torch keeps mesh layout apart from communication:

* pure index math (:func:`mesh_dim_lines`, :func:`mesh_coordinate`, :func:`submesh_ranks`):
  which ranks form each dimension's groups, where a rank sits; no process group needed;
* group creation (:func:`_dim_groups`), which is collective: every rank of the world builds
  the same ``DeviceMesh`` and so makes the same sequence of ``new_group`` calls. Groups are
  cached in the rank's ``World``, so building the same layout again, or slicing a mesh,
  creates nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from . import groups as _groups
from .world import current_world

__all__ = ["DeviceMesh", "init_device_mesh", "mesh_coordinate", "mesh_dim_lines", "submesh_ranks"]

MeshLike = Any  # a torch.Tensor, a (nested) list of ints, or a numpy array


def _as_mesh(mesh: MeshLike) -> torch.Tensor:
    """``mesh`` as a CPU int tensor; a mesh naming a rank twice cannot be laid out."""
    t = mesh.detach().cpu() if isinstance(mesh, torch.Tensor) else torch.as_tensor(mesh)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"DeviceMesh: mesh must hold integer ranks, got dtype {t.dtype}")
    t = t.to(torch.int).contiguous()
    flat = t.flatten().tolist()
    if len(set(flat)) != len(flat):
        raise RuntimeError(f"DeviceMesh: mesh {t.tolist()} has duplicate ranks")
    if any(r < 0 for r in flat):
        raise RuntimeError(f"DeviceMesh: mesh {t.tolist()} has negative ranks")
    return t


def _check_dim_names(names: Sequence[str] | None, ndim: int) -> tuple[str, ...] | None:
    if names is None:
        return None
    names = tuple(names)
    if len(names) != ndim:
        raise RuntimeError(f"mesh_dim_names {names} must have one name per mesh dim ({ndim})")
    if len(set(names)) != len(names):
        raise RuntimeError(f"mesh_dim_names {names} must be unique")
    return names


def mesh_dim_lines(mesh: torch.Tensor, dim: int) -> list[list[int]]:
    """The groups of dimension ``dim``: one list per line of the mesh along ``dim``.

    Each list holds the ranks that differ only in their ``dim`` coordinate, ordered by it.
    """
    return mesh.movedim(dim, -1).reshape(-1, mesh.size(dim)).tolist()


def mesh_coordinate(mesh: torch.Tensor, rank: int) -> list[int] | None:
    """Where ``rank`` sits in ``mesh`` (one index per dim), or None if it is not there."""
    hits = (mesh == rank).nonzero()
    return hits[0].tolist() if len(hits) else None


def submesh_ranks(mesh: torch.Tensor, coordinate: Sequence[int], dims: Sequence[int]) -> torch.Tensor:
    """The sub-mesh over ``dims`` (in that order) through the point ``coordinate``.

    The dims not kept are fixed at ``coordinate``'s value: the result holds the ranks that
    share those coordinates with the point, e.g. its row or its column.
    """
    index = tuple(slice(None) if d in dims else c for d, c in enumerate(coordinate))
    kept = sorted(dims)
    return mesh[index].permute([kept.index(d) for d in dims])


def _canonical(lines: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    """A key for a set of lines: groups sort their ranks, so the same sets are the same groups."""
    return tuple(sorted(tuple(sorted(line)) for line in lines))


def _dim_groups(lines: list[list[int]], rank: int) -> Any:
    """The group of ``lines`` holding ``rank`` (None if none does), creating all of them once.

    Collective: every rank must call it with the same ``lines`` in the same order. The cache
    is keyed by all the lines, which every rank knows, so all ranks agree on whether to
    create (and in which order) or reuse. It belongs to the default group it was filled
    under: a new ``init_process_group`` starts it afresh on every rank alike.
    """
    world = current_world()
    owner, cache = world.mesh_groups
    if owner is not world.default_pg:
        owner, cache = world.default_pg, {}
        world.mesh_groups = (owner, cache)
    key = _canonical(lines)
    if key not in cache:
        mine = None
        for line in key:
            pg = _groups.new_group(list(line))
            if rank in line:
                mine = pg
        cache[key] = mine
    return cache[key]


def _group_info(pg: Any, ranks: list[int]) -> tuple[str, list[int], str]:
    return (_groups._get_group_tag(pg), ranks, current_world().pg_names[pg])


class DeviceMesh:
    """A layout of global ranks (``mesh``) with one process group per dimension.

    Every rank of the world constructs it with the same arguments (group creation is
    collective), including ranks outside the mesh: they get no groups and a None coordinate.
    ``_init_backend=False`` makes no groups (a layout only, e.g. before the world exists).
    """

    def __init__(
        self,
        device_type: str,
        mesh: MeshLike,
        *,
        mesh_dim_names: Sequence[str] | None = None,
        _init_backend: bool = True,
    ) -> None:
        self.device_type = device_type
        self.mesh = _as_mesh(mesh)
        self.mesh_dim_names = _check_dim_names(mesh_dim_names, self.mesh.ndim)
        self._groups: list[Any] = []
        self._dim_group_infos: list[tuple[str, list[int], str]] = []
        self._coordinate: list[int] | None = None
        if _groups.is_initialized():
            self._coordinate = mesh_coordinate(self.mesh, _groups.get_rank())
        if _init_backend:
            self._init_groups()

    def _init_groups(self) -> None:
        if not _groups.is_initialized():
            raise RuntimeError("DeviceMesh: init_process_group must be called before building a DeviceMesh")
        world_size, rank = _groups.get_world_size(), _groups.get_rank()
        if self.mesh.numel() and int(self.mesh.max()) >= world_size:
            raise RuntimeError(f"DeviceMesh: mesh {self.mesh.tolist()} names ranks beyond world size {world_size}")
        if self.mesh.ndim == 1 and self.mesh.tolist() == list(range(world_size)):
            pg = _groups._get_default_group()
            self._set_groups([pg], [self.mesh.tolist()])
            return
        found: list[Any] = []
        for d in range(self.mesh.ndim):
            found.append(_dim_groups(mesh_dim_lines(self.mesh, d), rank))
        if self._coordinate is not None:
            mine = [submesh_ranks(self.mesh, self._coordinate, [d]).tolist() for d in range(self.mesh.ndim)]
            self._set_groups(found, mine)

    def _set_groups(self, pgs: list[Any], ranks: list[list[int]]) -> None:
        self._groups = list(pgs)
        self._dim_group_infos = [_group_info(pg, r) for pg, r in zip(pgs, ranks)]

    @classmethod
    def from_group(
        cls,
        group: Any,
        device_type: str,
        mesh: MeshLike | None = None,
        *,
        mesh_dim_names: Sequence[str] | None = None,
    ) -> DeviceMesh:
        """A mesh over groups that already exist (no creation, so any rank may call it alone).

        One group gives a 1-D mesh of its ranks. A list of groups needs ``mesh``, n-D with one
        group per dim, each holding this rank's line of the mesh along its dim.
        """
        if not isinstance(group, list | tuple):
            ranks = _groups.get_process_group_ranks(group)
            if mesh is not None and _as_mesh(mesh).tolist() != ranks:
                raise ValueError(f"from_group: mesh {mesh} differs from the group's ranks {ranks}")
            group, mesh = [group], ranks
        elif mesh is None:
            if len(group) != 1:
                raise ValueError("from_group: a list of several groups needs an explicit mesh")
            mesh = _groups.get_process_group_ranks(group[0])
        dm = cls(device_type, mesh, mesh_dim_names=mesh_dim_names, _init_backend=False)
        if len(group) != dm.ndim:
            raise ValueError(f"from_group: {len(group)} groups for a {dm.ndim}-D mesh")
        if dm._coordinate is None:
            raise RuntimeError(f"from_group: rank {_groups.get_rank()} is not in mesh {dm.mesh.tolist()}")
        lines = [submesh_ranks(dm.mesh, dm._coordinate, [d]).tolist() for d in range(dm.ndim)]
        for d, (pg, line) in enumerate(zip(group, lines)):
            if sorted(_groups.get_process_group_ranks(pg)) != sorted(line):
                raise ValueError(f"from_group: group for dim {d} holds ranks "
                                 f"{_groups.get_process_group_ranks(pg)}, the mesh says {line}")
        dm._set_groups(list(group), lines)
        return dm

    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mesh.shape)

    def size(self, mesh_dim: int | None = None) -> int:
        """Ranks along ``mesh_dim``, or in the whole mesh when None."""
        return self.mesh.numel() if mesh_dim is None else self.mesh.size(mesh_dim)

    def _dim_index(self, mesh_dim: int | str | None) -> int:
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(f"Found the DeviceMesh have {self.ndim} dimensions. Optional kwarg "
                                   "`mesh_dim` needs to be specified when device_mesh.ndim > 1.")
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"Mesh dimension '{mesh_dim}' does not exist. "
                               f"Available mesh dimensions are: mesh_dim_names={self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh_dim {mesh_dim} out of range for a {self.ndim}-D DeviceMesh")
        return mesh_dim % self.ndim

    def get_group(self, mesh_dim: int | str | None = None) -> Any:
        """The process group of this rank along ``mesh_dim`` (index or name)."""
        d = self._dim_index(mesh_dim)
        if not self._groups:
            raise RuntimeError(f"DeviceMesh {self!r} has no process groups on this rank "
                               "(built with _init_backend=False, or this rank is not in the mesh)")
        return self._groups[d]

    def get_all_groups(self) -> list[Any]:
        return [self.get_group(d) for d in range(self.ndim)]

    def get_rank(self) -> int:
        """This rank's global rank."""
        return _groups.get_rank()

    def get_coordinate(self) -> list[int] | None:
        """This rank's index along every dim, or None if it is not in the mesh."""
        return None if self._coordinate is None else list(self._coordinate)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's coordinate along ``mesh_dim``; its rank in ``get_group(mesh_dim)`` too,
        as long as that dim's lines list ranks in increasing order (groups sort their ranks)."""
        d = self._dim_index(mesh_dim)
        if self._coordinate is None:
            raise RuntimeError(f"rank {self.get_rank()} is not part of {self!r}")
        return self._coordinate[d]

    def __getitem__(self, names: str | Sequence[str]) -> DeviceMesh:
        """The sub-mesh over the named dims (in the given order) through this rank.

        Reuses this mesh's groups, so it creates none and one rank may call it alone.
        """
        if not self.mesh_dim_names:
            raise RuntimeError("Cannot slice a DeviceMesh without mesh_dim_names!")
        wanted = (names,) if isinstance(names, str) else tuple(names)
        if not wanted or len(set(wanted)) != len(wanted):
            raise RuntimeError(f"Invalid mesh_dim_names {wanted}: give distinct names")
        for name in wanted:
            if name not in self.mesh_dim_names:
                raise KeyError(f"Invalid mesh_dim_name '{name}' specified. "
                               f"Valid mesh_dim_names are {self.mesh_dim_names}")
        if wanted == self.mesh_dim_names:
            return self
        if self._coordinate is None:
            raise RuntimeError(f"rank {self.get_rank()} is not part of {self!r}: nothing to slice")
        dims = [self.mesh_dim_names.index(n) for n in wanted]
        sub = DeviceMesh(self.device_type, submesh_ranks(self.mesh, self._coordinate, dims),
                         mesh_dim_names=wanted, _init_backend=False)
        if self._groups:
            sub._groups = [self._groups[d] for d in dims]
            sub._dim_group_infos = [self._dim_group_infos[d] for d in dims]
        sub._parent = self  # type: ignore[attr-defined]
        return sub

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeviceMesh):
            return NotImplemented
        return (self.device_type == other.device_type and self.mesh_dim_names == other.mesh_dim_names
                and self.shape == other.shape and torch.equal(self.mesh, other.mesh))

    def __hash__(self) -> int:
        return hash((self.device_type, self.mesh_dim_names, self.shape, tuple(self.mesh.flatten().tolist())))

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"


def init_device_mesh(
    device_type: str, mesh_shape: Sequence[int], *, mesh_dim_names: Sequence[str] | None = None
) -> DeviceMesh:
    """A mesh of ``mesh_shape`` over ranks ``0 .. world_size - 1`` in row-major order.

    Collective, like the constructor. The shape must use every rank of the world.
    """
    mesh_shape = tuple(mesh_shape)
    _check_dim_names(mesh_dim_names, len(mesh_shape))
    if not _groups.is_initialized():
        raise RuntimeError("init_device_mesh: init_process_group must be called first")
    world_size = _groups.get_world_size()
    if math.prod(mesh_shape) != world_size:
        raise RuntimeError(f"init_device_mesh: mesh_shape {mesh_shape} holds {math.prod(mesh_shape)} "
                           f"ranks but the world size is {world_size}")
    mesh = torch.arange(world_size, dtype=torch.int).view(mesh_shape)
    return DeviceMesh(device_type, mesh, mesh_dim_names=mesh_dim_names)
