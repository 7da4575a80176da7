"""Shrinking a group to the ranks left: torch's ``Backend.shrink`` for every pyc10d engine.

torch shrinks an NCCL communicator (``ncclCommShrink``); here the survivors' engine is
derived from the parent's (``EngineCore.derive``), so it runs over the same transports (tcp
connections, shm rings) with no store traffic and no message at all: each survivor computes
it alone, and the dead rank is never asked for anything. It gets a name of its own — the
parent's, and how many shrinks of that parent came before, which every survivor counts
alike — so its channels, sequence numbers and abort state are its own: an abort of the
parent (keyed by the parent's group key) never reaches it. An shm group's arena is sized
for its members, so the shrunk group opens its own on its first collective, through the
rings, as every subgroup does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .base import EngineCore
from .options import Options

#: torch's ``distributed_c10d.SHRINK_DEFAULT``: the shrink leaves the parent's pending
#: operations alone (they finish, or fail as their peers are gone; the parent is destroyed next).
SHRINK_DEFAULT = 0x00
#: torch's ``SHRINK_ABORT``: abort the parent first, failing its pending operations here and
#: telling its members, so that none stays blocked in an operation the dead rank never joins.
SHRINK_ABORT = 0x01


def shrink_engine(parent: EngineCore, ranks_to_exclude: list[int], shrink_flags: int = SHRINK_DEFAULT,
                  opts_override: Any = None) -> EngineCore:
    """The engine of ``parent``'s ranks less ``ranks_to_exclude`` (ranks of ``parent``),
    renumbered in order. Only the survivors call it; the caller has checked the ranks."""
    excluded = set(ranks_to_exclude)
    if parent.rank() in excluded:
        raise RuntimeError(f"shrink: rank {parent.rank()} of group {parent.group_name!r} is in the exclusion "
                           f"list {sorted(excluded)} and should not call shrink")
    survivors = [r for r in range(parent.size()) if r not in excluded]
    timeout = getattr(opts_override, "_timeout", None)  # torch's options name it so
    options = Options(timedelta(seconds=parent.timeout_s) if timeout is None else timeout)
    child = parent.derive(survivors, survivors.index(parent.rank()), parent.shrink_name(), options)
    _hand_over(parent, child)
    if shrink_flags & SHRINK_ABORT:
        parent.abort()
    return child


def _hand_over(parent: EngineCore, child: EngineCore) -> None:
    """The transports ``parent`` owns (closes when it shuts down) go to the engine of
    ``child`` that runs on them: the parent is destroyed right after a shrink, and must not
    take the connections with it. One the child does not use stays the parent's."""
    heirs = {id(e.transport): e for e in reversed(child.components())}
    for e in parent.components():
        heir = heirs.get(id(e.transport))
        if heir is not None:
            e.hand_transport_to(heir)
