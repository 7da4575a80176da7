"""Sizes, iteration counts and bandwidth formulas shared by the driver, workers and report.

Bandwidths follow nccl-tests (``doc/PERFORMANCE.md`` there):

* ``algbw = size / time`` where ``size`` is the op's full message: the buffer of
  ``all_reduce``/``broadcast``/``reduce``, the *output* of ``all_gather`` (all ranks' parts),
  the *input* of ``reduce_scatter`` and the whole per-rank buffer of ``all_to_all``;
* ``busbw = algbw * factor(n)`` with ``factor`` = ``2(n-1)/n`` for ``all_reduce``,
  ``(n-1)/n`` for ``all_gather``, ``reduce_scatter`` and ``all_to_all``, ``1`` for
  ``broadcast`` and ``reduce``.

GB/s are decimal (1e9 bytes per second), as in nccl-tests.
"""

from __future__ import annotations

from pyc10d.env import parse_size  # noqa: F401 - the benchmarks' sizes, as the settings' (re-exported)

DTYPE_BYTES = 4  # float32, the default
#: The element types the collective benchmark times (``--dtype``), by bytes per element.
#: bfloat16 is what tensor-parallel inference and mixed-precision gradients send; the C
#: reference (Open MPI through numpy) has no such type and times float32 only.
DTYPES = {"float32": 4, "bfloat16": 2}
#: The largest world size whose checked values (integers up to n * n, ``worker._make``)
#: bfloat16 holds exactly: its 8-bit significand holds every integer up to 256.
BFLOAT16_MAX_WORLD = 16
MIB = 1 << 20

# op name -> bus bandwidth factor as a function of the world size n
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "all_to_all_single": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
OPS = list(BUS_FACTOR)
DEFAULT_OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
               "all_to_all_single"]
ALIASES = {"allreduce": "all_reduce", "all_gather": "all_gather_into_tensor",
           "allgather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor",
           "reducescatter": "reduce_scatter_tensor", "all_to_all": "all_to_all_single",
           "alltoall": "all_to_all_single"}
# ops whose message is split into n equal parts: the element count must divide by n
SPLIT_OPS = {"all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"}

def format_size(nbytes: int) -> str:
    """``67108864`` -> ``'64MiB'``, ``8`` -> ``'8B'``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def size_grid(min_bytes: int, max_bytes: int, step: int = 4) -> list[int]:
    """``min, min*step, ...`` up to ``max`` (``max`` itself included)."""
    if min_bytes < 1 or max_bytes < min_bytes or step < 2:
        raise ValueError("need 1 <= min-bytes <= max-bytes and step >= 2")
    sizes, s = [], min_bytes
    while s < max_bytes:
        sizes.append(s)
        s *= step
    sizes.append(max_bytes)
    return sizes


def element_count(op: str, nbytes: int, world_size: int, itemsize: int = DTYPE_BYTES) -> int:
    """Elements (of ``itemsize`` bytes, float32's by default) of the op's full message:
    ``nbytes`` rounded to what the op allows."""
    count = max(1, nbytes // itemsize)
    if op in SPLIT_OPS:
        count = max(world_size, count // world_size * world_size)
    return count


def iterations(nbytes: int, max_iters: int, min_iters: int = 8) -> tuple[int, int]:
    """(warm-up, timed) iterations: ``max_iters`` up to 1 MiB, then fewer as size grows.

    Never fewer than ``min_iters`` timed runs: on a shared 2-core host single runs of one
    large op swing by 20-30%, and a median of 3 moved the reported ratios as much.
    """
    if nbytes <= MIB:
        return 5, max_iters
    return 2, max(min(min_iters, max_iters), max_iters * MIB // nbytes)


def bandwidths(op: str, nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one op of ``nbytes`` taking ``seconds``."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else float("nan")
    return algbw, algbw * BUS_FACTOR[op](world_size)


def loop_shape(nbytes: int, ops: int, loops: int = 5) -> tuple[int, int]:
    """(K ops back to back per loop, loops) for a message of ``nbytes``: ``ops`` timed ops
    in all up to 1 MiB, proportionally fewer above (at least 2 per loop), and K messages at
    most 256 MiB (every op of a loop has buffers of its own, so each result is checked)."""
    per_loop = ops // loops if nbytes <= MIB else ops * MIB // nbytes // loops
    return max(2, min(per_loop, (256 * MIB) // max(nbytes, 1))), loops
