"""Collective algorithms, one per file, each a pure function of a ``Comm``.

``select`` is the one place that decides which algorithm runs, by collective, world size
and message size; ``docs/algorithms.md`` lists the steps and bytes of each.
"""

from __future__ import annotations

from .allgather_direct import allgather_direct
from .allgather_ring import allgather_ring
from .allreduce_direct import allreduce_direct
from .allreduce_ring import allreduce_ring
from .alltoall_pairwise import alltoall_pairwise
from .barrier_direct import barrier_direct
from .broadcast_direct import broadcast_direct
from .broadcast_scatter_allgather import broadcast_scatter_allgather
from .comm import Comm
from .gather_direct import gather_direct
from .reduce_direct import reduce_direct
from .reduce_ring import reduce_ring
from .reduce_scatter_direct import reduce_scatter_direct
from .reduce_scatter_ring import reduce_scatter_ring
from .scatter_direct import scatter_direct

# Below these sizes (bytes per rank) one flat round beats the 2(n-1) steps of a ring.
SMALL_ALLREDUCE = 256 * 1024
SMALL_BROADCAST = 512 * 1024
SMALL_REDUCE_SCATTER = 128 * 1024
SMALL_ALLGATHER = 64 * 1024


def select(collective: str, world_size: int, nbytes: int):  # noqa: ANN201
    """Return the algorithm for ``collective`` at this world size and message size."""
    small = world_size <= 2
    if collective == "allreduce":
        return allreduce_direct if nbytes <= SMALL_ALLREDUCE else allreduce_ring
    if collective == "broadcast":
        return broadcast_direct if small or nbytes <= SMALL_BROADCAST else broadcast_scatter_allgather
    if collective == "reduce":
        return reduce_direct if small or nbytes <= SMALL_ALLREDUCE else reduce_ring
    if collective == "reduce_scatter":
        return reduce_scatter_direct if nbytes <= SMALL_REDUCE_SCATTER else reduce_scatter_ring
    if collective == "allgather":
        return allgather_direct if nbytes <= SMALL_ALLGATHER else allgather_ring
    raise KeyError(collective)


__all__ = [
    "Comm", "select", "allgather_direct", "allgather_ring", "allreduce_direct", "allreduce_ring",
    "alltoall_pairwise", "barrier_direct", "broadcast_direct", "broadcast_scatter_allgather",
    "gather_direct", "reduce_direct", "reduce_ring", "reduce_scatter_direct",
    "reduce_scatter_ring", "scatter_direct",
]
