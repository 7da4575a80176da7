"""What a functional collective's ``group`` argument may be, and how it becomes a group name.

Functional collectives accept every spelling torch accepts: a ProcessGroup, its
``group_name``, a list of ranks, a 2-D list of ranks (one group per row, all rows the same
size), a 1-D ``DeviceMesh``, or ``(mesh, dim)``, each with an optional tag. The traced op
only ever sees the group *name* (a string): a graph holds no group object, so it can be
replayed by any process that has a group of that name.
"""

from __future__ import annotations

from typing import Any

from ..groups import (
    _find_or_create_pg_by_ranks_and_tag,
    _get_default_group,
    _get_group_tag,
    get_process_group_ranks,
)
from ..process_group import ProcessGroup
from ..world import NonGroupMember, current_world

RANK_TYPES = (list, tuple)


def _is_mesh(group: Any) -> bool:
    # Duck-typed so this module needs no import of device_mesh (a sibling room).
    return hasattr(group, "get_group") and hasattr(group, "mesh") and hasattr(group, "ndim")


def _mesh_group(group: Any) -> Any:
    if _is_mesh(group):
        if group.ndim != 1:
            raise AssertionError("Only 1D mesh is supported, pass in (DeviceMesh, int) together if mesh > 1D")
        return group.get_group(0)
    if isinstance(group, tuple) and len(group) == 2 and _is_mesh(group[0]) and isinstance(group[1], (int, str)):
        return group[0].get_group(group[1])
    return None


def _expand_group(group: Any, tag: str = "") -> tuple[str, list[int], int]:
    """``(tag, ranks, group_size)`` for any accepted ``group``; ``ranks`` may hold several groups."""
    pg = _mesh_group(group)
    if pg is not None:
        group = pg
    if isinstance(group, str):
        group = pg_by_name(group)
    if isinstance(group, ProcessGroup) or (group is not None and hasattr(group, "allreduce")):
        ranks = get_process_group_ranks(group)
        return tag or _get_group_tag(group), ranks, len(ranks)
    if isinstance(group, RANK_TYPES):
        if group and isinstance(group[0], RANK_TYPES):
            sizes = {len(row) for row in group}
            if len(sizes) != 1:
                raise ValueError(f"group sizes must be identical found {sorted(sizes)}")
            return tag, [int(r) for row in group for r in row], len(group[0])
        return tag, [int(r) for r in group], len(group)
    raise ValueError(f"Invalid type for group, must be one of List, Processgroup, DeviceMesh or (DeviceMesh, int), got {type(group)}")


def resolve_group_name(group: Any, tag: str = "") -> str:
    """The name of the group ``group`` stands for on this rank (creating a tagged one for
    a rank list, as torch does)."""
    if isinstance(group, str):
        return group
    if isinstance(group, ProcessGroup):
        return group.group_name
    pg = _mesh_group(group)
    if pg is not None:
        return pg.group_name
    if group is None:
        return _get_default_group().group_name
    if isinstance(group, RANK_TYPES):
        tag, ranks, size = _expand_group(group, tag)
        return _find_or_create_pg_by_ranks_and_tag(tag, ranks, size).group_name
    name = getattr(group, "group_name", None)
    if isinstance(name, str):
        return name
    raise ValueError(f"Unsupported group type: {type(group)}, {group}")


def pg_by_name(name: str) -> Any:
    """The group called ``name`` in this rank's world (a thread's own, for ``threaded``)."""
    pg = current_world().pg_by_name.get(name)
    if pg is None or isinstance(pg, NonGroupMember):
        known = sorted(current_world().pg_by_name)
        raise ValueError(f"no process group named {name!r} on this rank (known: {known})")
    return pg
