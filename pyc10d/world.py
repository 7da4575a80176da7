"""All global state of pyc10d, in one object.

torch.distributed scatters its state over module globals; here it lives in a ``World``.
There is one per process, except that a thread can install its own (``set_thread_world``):
that is what lets the threaded backend run several ranks as threads of one process.
"""

from __future__ import annotations

import threading
from typing import Any


class NonGroupMember:
    """What ``new_group`` returns on a rank outside the group (torch: ``GroupMember.NON_GROUP_MEMBER``)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NonGroupMember)

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return "<NON_GROUP_MEMBER>"


class GroupMember:
    """``GroupMember.WORLD`` is the default group (None before init); NON_GROUP_MEMBER a sentinel."""

    NON_GROUP_MEMBER = NonGroupMember()


class _WorldDescriptor:
    def __get__(self, obj: Any, owner: Any) -> Any:
        return current_world().default_pg


GroupMember.WORLD = _WorldDescriptor()  # type: ignore[attr-defined]


class group:  # noqa: N801 - torch's name
    """``dist.group.WORLD``: the default process group."""

    WORLD = _WorldDescriptor()


class World:
    """Default group, registries of groups and their ranks/tags/names, the group counter."""

    def __init__(self) -> None:
        self.default_pg: Any = None
        self.default_store: Any = None
        self.backend_name: str | None = None
        self.pg_group_ranks: dict[Any, dict[int, int]] = {}
        self.pg_names: dict[Any, str] = {}
        self.pg_by_name: dict[str, Any] = {}
        self.pg_backend: dict[Any, str] = {}
        self.pg_tags: dict[Any, str] = {}
        self.tags_to_pg: dict[str, list[Any]] = {}
        self.group_count = 0
        self.split_counts: dict[str, int] = {}  # split_group calls per parent group name
        self.timeout: Any = None
        self.warned: set[str] = set()
        # DeviceMesh's groups, by the lines of ranks they were made for, and the default group
        # they were made under (``device_mesh._dim_groups``).
        self.mesh_groups: tuple[Any, dict] = (None, {})

    def register(self, pg: Any, name: str, ranks: list[int], backend: str, tag: str) -> None:
        self.pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
        self.pg_names[pg] = name
        self.pg_by_name[name] = pg
        self.pg_backend[pg] = backend
        self.pg_tags[pg] = tag
        self.tags_to_pg.setdefault(tag, []).append(pg)
        if tag != "":
            self.tags_to_pg.setdefault("", []).append(pg)

    def unregister(self, pg: Any) -> None:
        self.pg_group_ranks.pop(pg, None)
        name = self.pg_names.pop(pg, None)
        if name is not None and self.pg_by_name.get(name) is pg:
            del self.pg_by_name[name]
        self.pg_backend.pop(pg, None)
        tag = self.pg_tags.pop(pg, None)
        for key in (tag, ""):
            if key is not None and pg in self.tags_to_pg.get(key, []):
                self.tags_to_pg[key].remove(pg)

    def reset(self) -> None:
        self.__init__()


_process_world = World()


class _Local(threading.local):
    world: World | None = None  # a class default: a thread without one reads None, no miss


_local = _Local()


def current_world() -> World:
    w = _local.world
    return w if w is not None else _process_world


def set_thread_world(world: World | None) -> None:
    """Give the calling thread its own World (threaded backend), or None to use the process's."""
    _local.world = world


def ensure_thread_world() -> World:
    """The calling thread's own World, made if it has none (ranks of the threaded backend)."""
    w = _local.world
    if w is None:
        w = _local.world = World()
    return w
