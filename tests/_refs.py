"""Deterministic inputs, single-process reference results and a mismatch collector.

Shared by the multi-rank suites: every rank can regenerate every other rank's input from
``(key, rank)``, so it computes the expected result of a collective locally.
"""

from __future__ import annotations

import functools
import zlib

import torch

from pyc10d.algorithms.cost import Model

DTYPES: list[torch.dtype] = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
    torch.int32, torch.int64, torch.bool, torch.complex64,
]
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

#: Thresholds (bytes) and segment size used by most families: ring above 2 KiB, 512 B segments,
#: 1 KiB shm slots. With 1 KiB slots the flat exchange (<= one slot) and the chunked paths
#: (first, middle and a partial last chunk) are all taken: 4099 elements of any dtype are 5-65
#: chunks, 1009 of 4 bytes or more at least 4. 256 B slots (4-16x as many phases, each a sync of
#: every rank: reduce_scatter's family took 10 s at 4 ranks) stay in ``ring_everywhere`` and
#: ``tests/backends/test_shm.py``.
PATCHED = {
    "pyc10d.algorithms.SMALL_ALLREDUCE": 2048,
    "pyc10d.algorithms.SMALL_BROADCAST": 2048,
    "pyc10d.algorithms.SMALL_REDUCE_SCATTER": 1024,
    "pyc10d.algorithms.SMALL_ALLGATHER": 1024,
    "pyc10d.algorithms.segments.SEGMENT_BYTES": 512,
    "pyc10d.backends.shm.SLOT_BYTES": 1024,
    # Above SMALL_WORLD ranks ``select`` asks the cost model, not the thresholds above: bytes
    # 128x dearer (the thresholds are 64-256x below their defaults) move its crossovers into
    # these sizes too, so that 5-33 ranks take the latency-bound algorithms (direct, recursive
    # doubling, binomial) for the small cases and the bandwidth-bound ones (ring, Rabenseifner,
    # recursive halving, scatter + doubling) for the large (``test_patched_model_covers``).
    "pyc10d.algorithms.MODEL": Model(beta=128 / 1.25e9, gamma=128 / 2.0e9),
}

#: Ranks below this contribute values in [-4, 4] to every case; the others contribute -1 or 1
#: to a PRODUCT, so that a product over 33 ranks stays within 4**4 = 256 in magnitude (exact
#: in bfloat16, which has 8 significant bits) in every order, and never overflows float16.
FULL_RANGE_RANKS = 4


def short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def gen(key: str, rank: int, dtype: torch.dtype, shape: tuple[int, ...] | int,
        op: str | None = None) -> torch.Tensor:
    """The input of ``rank`` for case ``key`` of reduction ``op`` (None: not a reduction).

    Small integers, so that every reduction over up to 33 ranks is exact in every dtype in any
    order: |sum| <= 33 * 4 = 132 (x2 for PREMUL_SUM_T: even values up to 264), exact in
    bfloat16 (integers to 256, even ones to 512) and float16 (integers to 2048); integer sums
    and products wrap, in the reference as in the collective (the same value modulo 2**bits).
    A PRODUCT takes values in [-4, 4] from the first ``FULL_RANGE_RANKS`` ranks only, and -1 or
    1 from the others: over 33 factors in [-4, 4] the partial products leave bfloat16's exact
    range (and float16's 65504), and the result depends on the order of multiplication. Below
    ``FULL_RANGE_RANKS`` ranks every ``op`` gives the same values as no ``op``."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}|{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if op == "PRODUCT" and rank >= FULL_RANGE_RANKS:
        return (torch.randint(0, 2, shape, generator=g) * 2 - 1).to(dtype)
    if dtype.is_complex:
        re = torch.randint(-4, 5, shape, generator=g).float()
        im = torch.randint(-4, 5, shape, generator=g).float()
        return torch.complex(re, im).to(dtype)
    if dtype.is_floating_point:
        return torch.randint(-4, 5, shape, generator=g).to(dtype)
    lo, hi = {torch.uint8: (0, 256), torch.int8: (-128, 128)}.get(dtype, (-1000, 1000))
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def op_names(dtype: torch.dtype) -> list[str]:
    """Every reduction valid for ``dtype`` (PREMUL_SUM twice: float and tensor factor)."""
    if dtype.is_complex:
        return ["SUM", "AVG", "PREMUL_SUM"]
    if dtype.is_floating_point:
        return ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM", "PREMUL_SUM_T"]
    return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def factor_of(name: str) -> float | torch.Tensor | None:
    if name == "PREMUL_SUM":
        return 0.5
    if name == "PREMUL_SUM_T":
        return torch.tensor(2.0)
    return None


def reduce_op(dist, name: str):
    """``dist.ReduceOp.<name>``, or a premul-sum op built with ``dist._make_premul_sum``."""
    if name.startswith("PREMUL_SUM"):
        return dist._make_premul_sum(factor_of(name))
    return getattr(dist.ReduceOp, name)


def ref_reduce(xs: list[torch.Tensor], name: str) -> torch.Tensor:
    """Reduce the ranks' tensors ``xs`` with op ``name``, in the inputs' dtype."""
    dtype, n = xs[0].dtype, len(xs)
    if name.startswith("PREMUL_SUM"):
        xs = [x * factor_of(name) for x in xs]
        name = "SUM"
    st = torch.stack(xs)
    wide = torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else torch.int64
    if name in ("SUM", "AVG"):
        r = st.any(0) if dtype == torch.bool else st.to(wide).sum(0).to(dtype)
        return r.div(n) if name == "AVG" else r
    if name == "PRODUCT":
        return st.all(0) if dtype == torch.bool else st.to(wide).prod(0).to(dtype)
    if name in ("MIN", "MAX"):
        s = st.to(torch.uint8) if dtype == torch.bool else st
        r = s.amin(0) if name == "MIN" else s.amax(0)
        return r.to(dtype)
    fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[name]
    return functools.reduce(fn, xs)


def strided(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A non-contiguous view with ``t``'s values, and its base (odd columns must stay 0)."""
    base = torch.stack([t, torch.zeros_like(t)], dim=-1)
    return base[..., 0], base


def guard_ok(base: torch.Tensor) -> bool:
    pad = base[..., 1]
    return torch.equal(pad, torch.zeros_like(pad))


def _describe(got: torch.Tensor, want: torch.Tensor) -> str:
    if not isinstance(got, torch.Tensor):
        return f"got {got!r}"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {short(got.dtype)}{list(got.shape)}, want {short(want.dtype)}{list(want.shape)}"
    diff = (got != want).reshape(-1).nonzero()
    i = int(diff[0]) if diff.numel() else 0
    return (f"{diff.numel()} of {got.numel()} elements differ, first at flat index {i}: "
            f"got {got.reshape(-1)[i].item()!r}, want {want.reshape(-1)[i].item()!r}")


class Check:
    """Collects mismatches so a rank keeps in step with the others and reports all of them."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.count = 0
        self.bad: list[str] = []

    def eq(self, got: torch.Tensor, want: torch.Tensor, what: str, approx: bool = False) -> None:
        self.count += 1
        ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
        if ok:
            if approx and (want.dtype.is_floating_point or want.dtype.is_complex):
                ok = torch.allclose(got, want, rtol=1e-2, atol=1e-2)
            else:
                ok = torch.equal(got, want)
        if not ok:
            self.bad.append(f"{what}: {_describe(got, want)}")

    def true(self, cond: bool, what: str) -> None:
        self.count += 1
        if not cond:
            self.bad.append(what)

    def finish(self) -> int:
        if self.bad:
            more = f"\n... and {len(self.bad) - 25} more" if len(self.bad) > 25 else ""
            raise AssertionError(
                f"rank {self.rank}: {len(self.bad)} of {self.count} checks failed:\n"
                + "\n".join(self.bad[:25]) + more
            )
        return self.count
