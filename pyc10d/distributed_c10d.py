"""``pyc10d.distributed_c10d``: torch's module name, for code that reaches into it.

Nothing lives here; it re-exports the public API (``_get_default_group``, ``_world`` ...).
"""

from __future__ import annotations

from .collectives import *  # noqa: F403
from .collectives import _all_gather_base, _broadcast_coalesced, _reduce_scatter_base  # noqa: F401
from .groups import *  # noqa: F403
from .groups import (  # noqa: F401
    _find_or_create_pg_by_ranks_and_tag,
    _find_pg_by_ranks_and_tag,
    _get_default_group,
    _get_default_store,
    _get_group_tag,
    _new_group_with_tag,
    _rank_not_in_group,
)
from .object_collectives import *  # noqa: F403
from .p2p import *  # noqa: F403
from .process_group import Backend, ProcessGroup, ProcessGroupGloo, _round_robin_process_groups  # noqa: F401
from .shrink import SHRINK_ABORT, SHRINK_DEFAULT, shrink_group  # noqa: F401
from .world import GroupMember, current_world, group  # noqa: F401


def __getattr__(name: str):
    if name == "_world":
        return current_world()
    raise AttributeError(name)
