"""``shrink_group``: the survivors of a failed rank go on in a group without it, at once.

torch's ``shrink_group`` (NCCL only there) on every pyc10d backend. The survivors' group is
derived from the parent's engine (``backends.shrink``): same connections, no rendezvous, no
store traffic, no message, so it works when the rank that died hosted the store. What does
need the store afterwards fails with a store error naming it: a group of another backend than
the world's (a rendezvous), and the watchdog's progress reports (it warns once and goes on).

Shrinking the default group makes the new group the default one and renumbers the world:
``get_rank()``/``get_world_size()`` then answer in the survivors' numbering, and every other
group is aborted (torch's rule: their ranks no longer mean what they did). Group counters are
not reset, so no later group can take the name, and so the aborted channels, of an old one.
"""

from __future__ import annotations

import logging
from typing import Any

from .backends.shrink import SHRINK_ABORT, SHRINK_DEFAULT
from .groups import _get_default_group, _rank_not_in_group, _watch
from .process_group import ProcessGroup
from .store import PrefixStore
from .world import current_world

__all__ = ["SHRINK_ABORT", "SHRINK_DEFAULT", "shrink_group"]

log = logging.getLogger(__name__)


def shrink_group(
    ranks_to_exclude: list[int],
    group: ProcessGroup | None = None,
    shrink_flags: int = SHRINK_DEFAULT,
    pg_options: Any = None,
) -> ProcessGroup:
    """The group of ``group``'s ranks (default: the world) less ``ranks_to_exclude`` (ranks of
    ``group``), renumbered in order. Only the survivors call it, each on its own: nothing is
    exchanged. ``group`` is destroyed (aborted first with ``SHRINK_ABORT``); the default group's
    shrunk group becomes the default group. Raises as torch's: TypeError or ValueError for bad
    arguments, RuntimeError when an excluded rank calls it."""
    _check_arguments(ranks_to_exclude, shrink_flags)
    world = current_world()
    default = _get_default_group()
    target = default if group is None else group
    if _rank_not_in_group(target) or target not in world.pg_names:
        raise ValueError("shrink_group: this rank is not a member of the group (or the group was destroyed)")
    size, name = target.size(), world.pg_names[target]
    if size <= 1:
        raise ValueError(f"Cannot shrink a process group with size {size}. "
                         f"Group must have at least 2 ranks to support shrinking.")
    engine = target._get_backend()
    if not getattr(engine, "supports_shrinking", False):
        raise TypeError(f"Process group backend for '{name}' does not support shrinking operations.")
    excluded = _check_excluded(ranks_to_exclude, size, target.rank())
    child = engine.shrink(sorted(excluded), shrink_flags, pg_options)
    is_default = target is default
    backend_name = world.pg_backend.get(target, world.backend_name or "undefined")
    ranks = [g for g, r in sorted(world.pg_group_ranks[target].items(), key=lambda item: item[1])
             if r not in excluded]
    if is_default:
        _end_all_but(default)
        ranks = list(range(len(ranks)))  # the world renumbered
    _end(target)
    pg = ProcessGroup(child.rank(), child.size(), engine=child, group_name=child.group_name, ranks=ranks,
                      backend_name=backend_name)
    pg.group_desc = "default:shrunken" if is_default else f"{name}:shrunk"
    pg.set_group_store(PrefixStore(f"{child.group_name}/", world.default_store))
    if is_default:
        world.default_pg = pg
    _watch(child, world.default_store)
    world.register(pg, child.group_name, ranks, backend_name, f"ptd:{child.group_name}")
    return pg


def _check_arguments(ranks_to_exclude: Any, shrink_flags: Any) -> None:
    if not isinstance(ranks_to_exclude, list):
        raise TypeError(f"ranks_to_exclude must be a list, but got {type(ranks_to_exclude).__name__}. "
                        f"Example: [1, 3, 5] to exclude ranks 1, 3, and 5.")
    if not ranks_to_exclude:
        raise ValueError("ranks_to_exclude cannot be empty. To shrink a group, you must specify at least "
                         "one rank to exclude. Example: [failed_rank_id]")
    if not isinstance(shrink_flags, int) or shrink_flags not in (SHRINK_DEFAULT, SHRINK_ABORT):
        raise ValueError(f"Invalid shrink_flags value: {shrink_flags}. Must be one of: "
                         f"SHRINK_DEFAULT ({SHRINK_DEFAULT}) or SHRINK_ABORT ({SHRINK_ABORT}). "
                         f"Use SHRINK_ABORT to abort ongoing operations before shrinking.")


def _check_excluded(ranks_to_exclude: list[Any], size: int, me: int) -> set[int]:
    """The excluded ranks as a set, after torch's checks in torch's words."""
    excluded: set[int] = set()
    for i, rank in enumerate(ranks_to_exclude):
        if not isinstance(rank, int):
            raise TypeError(f"All elements in ranks_to_exclude must be integers. "
                            f"Element at index {i} is {type(rank).__name__}: {rank}")
        if not 0 <= rank < size:
            raise ValueError(f"Rank {rank} at index {i} is out of bounds for group size {size}. "
                             f"Valid ranks are in range [0, {size - 1}].")
        if rank in excluded:
            raise ValueError(f"Duplicate rank {rank} found in ranks_to_exclude at index {i}. "
                             f"Each rank can only be excluded once.")
        excluded.add(rank)
    if len(excluded) >= size:
        raise ValueError(f"Cannot exclude all {size} ranks from process group. "
                         f"At least one rank must remain. Excluding {len(excluded)} ranks.")
    if me in excluded:
        raise RuntimeError(f"Current rank {me} is in the exclusion list and should not call shrink_group(). "
                           f"Only non-excluded ranks should participate in the shrinking operation. "
                           f"Excluded ranks should terminate their processes instead.")
    return excluded


def _end(pg: Any) -> None:
    """Destroy ``pg`` (shrunk, or aborted as the world was): its transports, handed to the
    shrunk group, stay open (``backends.shrink``)."""
    if isinstance(pg, ProcessGroup):
        try:
            pg.shutdown()
        except Exception:  # a broken group: its state goes regardless
            log.warning("shrink_group: destroying group %r failed", pg, exc_info=True)
    current_world().unregister(pg)


def _end_all_but(keep: Any) -> None:
    """Abort every group but ``keep`` (the default group being shrunk), as torch does."""
    world = current_world()
    others = [pg for pg in world.pg_names if pg is not keep]
    if others:
        log.warning("Shrinking default group will destroy %d other process groups: %s", len(others),
                    ", ".join(world.pg_names[pg] for pg in others))
    for pg in others:
        if isinstance(pg, ProcessGroup):
            try:
                pg.abort()
            except Exception:  # some may be broken already
                log.warning("shrink_group: aborting group %r failed", pg, exc_info=True)
        world.unregister(pg)
