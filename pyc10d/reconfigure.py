"""torch 2.14's reconfigure calls on pyc10d's API: ``_supports_reconfigure``,
``_get_reconfigure_handle`` and ``_reconfigure`` (how a group is re-formed, and what a handle
is: ``backends/reconfigure.py``).

Reconfiguring the default group renumbers the world as the handles order it:
``get_rank()``/``get_world_size()`` then answer in the new numbering. Other groups are left as
they are (as torch leaves them): their ranks still mean what they did.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import Any

from .backends.work import Work
from .groups import _watch, member_group
from .world import current_world

__all__ = ["ReconfigureOptions", "_get_reconfigure_handle", "_reconfigure", "_supports_reconfigure"]


class ReconfigureOptions:
    """torch's ``ReconfigureOptions``: ``uuid``, ``handles``, ``timeout`` (unset: the group's),
    ``hints`` (none read)."""

    def __init__(self, uuid: int = 0, handles: Collection[str] = (), timeout: timedelta | None = None,
                 hints: dict[str, str] | None = None) -> None:
        self.uuid, self.handles, self.timeout, self.hints = uuid, handles, timeout, dict(hints or {})


def _supports_reconfigure(group: Any = None) -> bool:
    return bool(member_group(group).supports_reconfigure)


def _get_reconfigure_handle(group: Any = None) -> str:
    """This process's handle for ``group`` (default: the default group), to pass to its peers."""
    return member_group(group).get_reconfigure_handle()


def _reconfigure(uuid: int, handles: Collection[str], group: Any = None, timeout: timedelta | None = None,
                 hints: dict[str, str] | None = None) -> Work:
    """Re-form ``group`` with the peers whose handles are given (a list fixes the ranks by
    position, a set lets pyc10d choose), every peer passing the same ``uuid`` and handles."""
    pg = member_group(group)
    work = pg.reconfigure(ReconfigureOptions(uuid, handles, timeout, hints))
    world = current_world()
    world.pg_group_ranks[pg] = {r: r for r in range(pg.size())}
    if pg is world.default_pg:
        _watch(pg._get_backend(), pg.get_group_store())
    return work
