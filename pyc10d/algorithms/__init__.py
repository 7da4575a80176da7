"""Collective algorithms, one per file, each a pure function of a ``Comm``.

``select`` is the one place that decides which algorithm runs, by collective, world size
and message size; ``docs/algorithms.md`` lists the steps and bytes of each. ``select_shm``
does the same for the shared-memory algorithms (``*_shm_*``, functions of a ``ShmComm``).
"""

from __future__ import annotations

from torch.autograd import profiler as torch_profiler

from . import cost, profiling, segments
from .allgather_bruck import allgather_bruck
from .allgather_direct import allgather_direct
from .allgather_recursive_doubling import allgather_recursive_doubling
from .allgather_ring import allgather_ring
from .allgather_shm_chunked import allgather_shm_chunked, allgather_shm_flat_step
from .allreduce_direct import allreduce_direct, allreduce_direct_step
from .allreduce_rabenseifner import allreduce_rabenseifner
from .allreduce_recursive_doubling import allreduce_recursive_doubling
from .allreduce_ring import allreduce_ring
from .allreduce_shm_flat import allreduce_shm_flat, allreduce_shm_flat_step
from .allreduce_shm_rsag import allreduce_shm_rsag
from .alltoall_pairwise import alltoall_pairwise
from .alltoall_shm_chunked import alltoall_shm_chunked, alltoall_shm_even_step
from .barrier_direct import barrier_direct
from .barrier_dissemination import barrier_dissemination
from .barrier_shm_counter import barrier_shm_counter, barrier_shm_step
from .broadcast_binomial import broadcast_binomial
from .broadcast_chain import broadcast_chain
from .broadcast_direct import broadcast_direct
from .broadcast_scatter_allgather import broadcast_scatter_allgather
from .broadcast_scatter_doubling import broadcast_scatter_doubling
from .broadcast_shm_chunked import broadcast_shm_chunked, broadcast_shm_flat_step
from .comm import Comm
from .gather_direct import gather_direct
from .reduce_binomial import reduce_binomial
from .reduce_direct import reduce_direct
from .reduce_rabenseifner import reduce_rabenseifner
from .reduce_ring import reduce_ring
from .reduce_scatter_direct import reduce_scatter_direct
from .reduce_scatter_halving import reduce_scatter_halving
from .reduce_scatter_ring import reduce_scatter_ring
from .reduce_scatter_shm_chunked import reduce_scatter_shm_chunked, reduce_scatter_shm_flat_step
from .scatter_direct import scatter_direct
from .shm_comm import ShmComm

# At n <= SMALL_WORLD, the choices measured on this project's hosts (tcp, 2-4 ranks): below
# these sizes (bytes per rank) one flat round beats the 2(n-1) steps of a ring.
SMALL_WORLD = 4
SMALL_ALLREDUCE = 256 * 1024
SMALL_BROADCAST = 512 * 1024
SMALL_REDUCE_SCATTER = 128 * 1024
SMALL_ALLGATHER = 64 * 1024

# Above SMALL_WORLD, the cost model (``cost``) picks: its parameters are a 10 Gb/s network's
# (``pyc10d.sim`` fits them to a host from a ping-pong); patch MODEL to retune every choice.
MODEL = cost.Model()
_FNS: dict[str, object] = {}
_CHOSEN: dict[tuple[str, int, int], object] = {}
#: The (MODEL, SEGMENT_BYTES) that ``_CHOSEN``'s entries were chosen under: a new model or
#: segment size (patched by a test, retuned by a caller) empties the cache rather than leave
#: the old choices in force.
_CHOSEN_FOR: list = [None, None]


def _by_model(collective: str, world_size: int, nbytes: int):
    if _CHOSEN_FOR[0] is not MODEL or _CHOSEN_FOR[1] != segments.SEGMENT_BYTES:
        _CHOSEN.clear()
        _CHOSEN_FOR[:] = [MODEL, segments.SEGMENT_BYTES]
    key = (collective, world_size, nbytes)
    fn = _CHOSEN.get(key)
    if fn is None:
        fn = _FNS[cost.cheapest(collective, world_size, nbytes, MODEL, segments.SEGMENT_BYTES)]
        if len(_CHOSEN) > 4096:  # a bounded cache: sizes vary with the caller's tensors
            _CHOSEN.clear()
        _CHOSEN[key] = fn
    return fn


def select_small_world(collective: str, world_size: int, nbytes: int):
    """The algorithm the measured thresholds choose (``select`` up to ``SMALL_WORLD`` ranks)."""
    small = world_size <= 2
    if collective == "allreduce":
        return allreduce_direct if nbytes <= SMALL_ALLREDUCE else allreduce_ring
    if collective == "broadcast":
        if small or nbytes <= SMALL_BROADCAST:
            return broadcast_direct
        # The chain moves fewer bytes in all ((n-1)S against about nS), but fills its pipeline
        # in n-1 hops of a segment: worth it once the message spans n-2 segments. Measured
        # on tcp, n=4 on 2 cores: 2 MiB 2.2 ms vs 2.6, 8 MiB 8.0 vs 8.6-8.8, 64 MiB 48-58 vs
        # 61-66 (scatter + all-gather).
        if nbytes >= (world_size - 2) * segments.SEGMENT_BYTES:
            return broadcast_chain
        return broadcast_scatter_allgather
    if collective == "reduce":
        return reduce_direct if small or nbytes <= SMALL_ALLREDUCE else reduce_ring
    if collective == "reduce_scatter":
        return reduce_scatter_direct if nbytes <= SMALL_REDUCE_SCATTER else reduce_scatter_ring
    if collective == "allgather":
        return allgather_direct if nbytes <= SMALL_ALLGATHER else allgather_ring
    if collective == "barrier":
        return barrier_direct
    raise KeyError(collective)


def select(collective: str, world_size: int, nbytes: int):
    """Return the algorithm for ``collective`` at this world size and message size (inside
    a ``pyc10d:<algorithm>`` profiler range while a profiler runs, see ``profiling``; the
    check is inline, one attribute read, so that no wrapper call is paid when off).

    ``nbytes``: the tensor's bytes per rank (all_reduce, broadcast, reduce), one rank's
    block (all_gather, reduce_scatter), 0 for a barrier. Up to ``SMALL_WORLD`` ranks the
    measured thresholds above decide; beyond, the least time in ``cost``'s model.
    """
    if world_size <= SMALL_WORLD:
        fn = select_small_world(collective, world_size, nbytes)
    else:
        if collective not in cost.COSTS:
            raise KeyError(collective)
        fn = _by_model(collective, world_size, nbytes)
    return profiling.algorithm(fn) if torch_profiler._is_profiler_enabled else fn


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


def select_shm(collective: str, world_size: int, nbytes: int, slot_bytes: int):
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
    return profiling.algorithm(fn) if torch_profiler._is_profiler_enabled else fn


_FNS.update({fn.__name__: fn for fn in (
    allreduce_direct, allreduce_ring, allreduce_recursive_doubling, allreduce_rabenseifner,
    reduce_scatter_direct, reduce_scatter_ring, reduce_scatter_halving, allgather_direct,
    allgather_ring, allgather_bruck, allgather_recursive_doubling, broadcast_direct,
    broadcast_binomial, broadcast_scatter_allgather, broadcast_scatter_doubling, broadcast_chain,
    reduce_direct, reduce_binomial, reduce_rabenseifner, reduce_ring, barrier_direct, barrier_dissemination)})

__all__ = [
    "Comm", "select", "select_small_world", "allgather_direct", "allgather_ring", "allreduce_direct", "allreduce_ring",
    "alltoall_pairwise", "barrier_direct", "broadcast_chain", "broadcast_direct",
    "broadcast_scatter_allgather",
    "gather_direct", "reduce_direct", "reduce_ring", "reduce_scatter_direct",
    "reduce_scatter_ring", "scatter_direct", "ShmComm", "select_shm", "allgather_shm_chunked",
    "allreduce_shm_flat", "allreduce_shm_rsag", "alltoall_shm_chunked", "barrier_shm_counter",
    "broadcast_shm_chunked", "reduce_scatter_shm_chunked",
    # the lean lane's single-phase steps (``backends/lane.py``)
    "allreduce_direct_step", "allreduce_shm_flat_step", "allgather_shm_flat_step", "broadcast_shm_flat_step", "reduce_scatter_shm_flat_step",
    "barrier_shm_step", "alltoall_shm_even_step",
    # logarithmic algorithms (chosen above SMALL_WORLD by ``cost``)
    "allreduce_recursive_doubling", "allreduce_rabenseifner", "reduce_scatter_halving",
    "allgather_recursive_doubling", "allgather_bruck", "broadcast_binomial",
    "broadcast_scatter_doubling", "reduce_binomial", "reduce_rabenseifner", "barrier_dissemination", "cost", "MODEL",
]
