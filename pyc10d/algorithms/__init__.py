"""Collective algorithms, one per file, each a pure function of a ``Comm``.

``select`` is the one place that decides which algorithm runs, by collective, world size
and message size; ``docs/algorithms.md`` lists the steps and bytes of each. ``select_shm``
does the same for the shared-memory algorithms (``*_shm_*``, functions of a ``ShmComm``).
"""

from __future__ import annotations

from torch.autograd import profiler as _torch_profiler

from . import profiling, segments
from .allgather_direct import allgather_direct
from .allgather_ring import allgather_ring
from .allgather_shm_chunked import allgather_shm_chunked, allgather_shm_flat_step
from .allreduce_direct import allreduce_direct
from .allreduce_ring import allreduce_ring
from .allreduce_shm_flat import allreduce_shm_flat, allreduce_shm_flat_step
from .allreduce_shm_rsag import allreduce_shm_rsag
from .alltoall_pairwise import alltoall_pairwise
from .alltoall_shm_chunked import alltoall_shm_chunked, alltoall_shm_even_step
from .barrier_direct import barrier_direct
from .barrier_shm_counter import barrier_shm_counter, barrier_shm_step
from .broadcast_chain import broadcast_chain
from .broadcast_direct import broadcast_direct
from .broadcast_scatter_allgather import broadcast_scatter_allgather
from .broadcast_shm_chunked import broadcast_shm_chunked, broadcast_shm_flat_step
from .comm import Comm
from .gather_direct import gather_direct
from .reduce_direct import reduce_direct
from .reduce_ring import reduce_ring
from .reduce_scatter_direct import reduce_scatter_direct
from .reduce_scatter_ring import reduce_scatter_ring
from .reduce_scatter_shm_chunked import reduce_scatter_shm_chunked, reduce_scatter_shm_flat_step
from .scatter_direct import scatter_direct
from .shm_comm import ShmComm

# Below these sizes (bytes per rank) one flat round beats the 2(n-1) steps of a ring.
SMALL_ALLREDUCE = 256 * 1024
SMALL_BROADCAST = 512 * 1024
SMALL_REDUCE_SCATTER = 128 * 1024
SMALL_ALLGATHER = 64 * 1024


def select(collective: str, world_size: int, nbytes: int):  # noqa: ANN201
    """Return the algorithm for ``collective`` at this world size and message size (inside
    a ``pyc10d:<algorithm>`` profiler range while a profiler runs, see ``profiling``; the
    check is inline, one attribute read, so that no wrapper call is paid when off)."""
    small = world_size <= 2
    if collective == "allreduce":
        fn = allreduce_direct if nbytes <= SMALL_ALLREDUCE else allreduce_ring
    elif collective == "broadcast":
        if small or nbytes <= SMALL_BROADCAST:
            fn = broadcast_direct
        # The chain moves fewer bytes in all ((n-1)S against about nS), but fills its pipeline
        # in n-1 hops of a segment: worth it once the message spans n-2 segments. Measured
        # on tcp, n=4 on 2 cores: 2 MiB 2.2 ms vs 2.6, 8 MiB 8.0 vs 8.6-8.8, 64 MiB 48-58 vs
        # 61-66 (scatter + all-gather).
        elif nbytes >= (world_size - 2) * segments.SEGMENT_BYTES:
            fn = broadcast_chain
        else:
            fn = broadcast_scatter_allgather
    elif collective == "reduce":
        fn = reduce_direct if small or nbytes <= SMALL_ALLREDUCE else reduce_ring
    elif collective == "reduce_scatter":
        fn = reduce_scatter_direct if nbytes <= SMALL_REDUCE_SCATTER else reduce_scatter_ring
    elif collective == "allgather":
        fn = allgather_direct if nbytes <= SMALL_ALLGATHER else allgather_ring
    else:
        raise KeyError(collective)
    return profiling.algorithm(fn) if _torch_profiler._is_profiler_enabled else fn


# Shared memory: while the ranks' inputs together (n x the tensor) are at most this many
# bytes (and one fits a slot), every rank reduces the whole tensor after one phase; above it
# ranks reduce one slice each (reduce-scatter then all-gather: n times less reduction work,
# one more phase and a copy out of the shared result). `python -m pyc10d.bench --peer mpi`
# on the 2-core host, same hour, every result checked, before (16 KiB per rank) and after
# (with the lean lane in both): all_reduce 64 KiB 178 -> 45 us at n=2 (Open MPI 26-28),
# 463 -> 144 us at n=4 (MPI 145-177); 1 MiB 390 -> 288 us at n=2 (MPI 327-347), 942 -> 856
# at n=4 (MPI 1146-1517). A diagnostic script (unchecked, no peer) put flat 2.3-2.4x ahead
# at 256 KiB for n=2 and 4: the second phase and the extra pass cost more than reading every
# slot while the slots stay in the shared cache.
SHM_FLAT_ALLREDUCE = 4 << 20


_SHM_ONLY = {
    "broadcast": broadcast_shm_chunked, "reduce_scatter": reduce_scatter_shm_chunked,
    "allgather": allgather_shm_chunked, "alltoall": alltoall_shm_chunked,
    "barrier": barrier_shm_counter,
}


def select_shm(collective: str, world_size: int, nbytes: int, slot_bytes: int):  # noqa: ANN201
    """The shared-memory algorithm for ``collective`` (``slot_bytes``: one rank's slot), in a
    profiler range as ``select``'s.

    Only all_reduce/reduce choose by size; the chunked algorithms of the other collectives
    are a single flat exchange whenever the message fits one slot.
    """
    if collective in ("allreduce", "reduce"):
        flat = (nbytes * world_size <= SHM_FLAT_ALLREDUCE and nbytes <= slot_bytes) or world_size == 1
        fn = allreduce_shm_flat if flat else allreduce_shm_rsag
    else:
        fn = _SHM_ONLY[collective]
    return profiling.algorithm(fn) if _torch_profiler._is_profiler_enabled else fn


__all__ = [
    "Comm", "select", "allgather_direct", "allgather_ring", "allreduce_direct", "allreduce_ring",
    "alltoall_pairwise", "barrier_direct", "broadcast_chain", "broadcast_direct",
    "broadcast_scatter_allgather",
    "gather_direct", "reduce_direct", "reduce_ring", "reduce_scatter_direct",
    "reduce_scatter_ring", "scatter_direct", "ShmComm", "select_shm", "allgather_shm_chunked",
    "allreduce_shm_flat", "allreduce_shm_rsag", "alltoall_shm_chunked", "barrier_shm_counter",
    "broadcast_shm_chunked", "reduce_scatter_shm_chunked",
    # the lean lane's single-phase steps (``backends/lane.py``)
    "allreduce_shm_flat_step", "allgather_shm_flat_step", "broadcast_shm_flat_step", "reduce_scatter_shm_flat_step",
    "barrier_shm_step", "alltoall_shm_even_step",
]
