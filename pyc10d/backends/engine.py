"""``Engine``: the class every backend is, the engine core with every operation on top.

A backend (tcp, shm, threaded, fake, hier) is an ``Engine`` bound to its transport; it adds
how it is created and, where it can, its lean lane's steps (``_lane_step``). The layers:

* ``base.EngineCore``: sequence numbers, the group's order, the progress thread, desync
  checks, the flight recorder's feed, failure (worded by ``failures``) and shutdown;
* ``ops.CollectiveOps``, ``ops_gather.GatherOps``, ``p2p.P2POps``: the operations, each
  checked (``accepts``, ``checks``), staged where needed, and submitted to the core;
* ``lane.LaneOps``: the lean lane, a synchronous call that repeats an earlier call's shape
  run as a prepared step, with the core's bookkeeping;
* ``shrink``: the survivors' engine after a rank is gone, derived over the same transports.
"""

from __future__ import annotations

from typing import Any

from .lane import LaneOps
from .ops import CollectiveOps
from .ops_gather import GatherOps
from .options import create_device
from .p2p import P2POps
from .shrink import shrink_engine


class Engine(CollectiveOps, GatherOps, P2POps, LaneOps):
    """Every collective of a group, over any transport."""

    #: torch's Gloo backend has it too (``ProcessGroupGloo.create_device``).
    create_device = staticmethod(create_device)

    #: torch's ``Backend.supports_shrinking``: every engine can (``shrink``).
    supports_shrinking = True

    def shrink(self, ranks_to_exclude: list[int], shrink_flags: int = 0, opts_override: Any = None) -> Engine:
        """torch's ``Backend.shrink``: the engine of this group's ranks less ``ranks_to_exclude``,
        derived over the same transports (``shrink.py``)."""
        return shrink_engine(self, ranks_to_exclude, shrink_flags, opts_override)  # type: ignore[return-value]
