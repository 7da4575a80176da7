"""What every collective accepts — dtype × reduce op, devices, layouts — in one table.

The engine's methods (the path both pyc10d's own API and the torch.distributed plugin take)
read it on the calling rank before an operation is issued: a refused call raises
``DistInputError`` (a ``RuntimeError``, as Gloo's refusals are, and a ``ValueError``) naming the
op, the argument and what is accepted, and the group stays usable. Nothing here can fail once
bytes move. The README prints ``readme_table()``; a test keeps the two equal.

pyc10d reduces more dtypes than Gloo (``GLOO``, measured on torch 2.13): ``int16``, the wide
unsigned integers (``uint16/32/64``: as the same-width signed integer, whose sum, product and
bitwise ops have the same bits modulo 2**n; MIN/MAX with the sign bit flipped, which maps the
unsigned order onto the signed one) and float8 (reduced in float32, rounded once at the end).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..errors import DistInputError
from ..types import RedOpType, ReduceOp

_R = RedOpType
#: The reductions, in the order the README's table lists them.
OPS: tuple[RedOpType, ...] = (_R.SUM, _R.AVG, _R.PRODUCT, _R.MIN, _R.MAX, _R.BAND, _R.BOR, _R.BXOR,
                              _R.PREMUL_SUM)
_ARITH = frozenset((_R.SUM, _R.AVG, _R.PRODUCT, _R.MIN, _R.MAX, _R.PREMUL_SUM))
_INTEGRAL = frozenset((_R.SUM, _R.PRODUCT, _R.MIN, _R.MAX, _R.BAND, _R.BOR, _R.BXOR))
_COMPLEX_OPS = frozenset((_R.SUM, _R.AVG, _R.PREMUL_SUM))  # torch's ``supports_complex``


def _dtypes(*names: str) -> tuple[torch.dtype, ...]:
    return tuple(getattr(torch, n) for n in names if isinstance(getattr(torch, n, None), torch.dtype))


FLOAT = _dtypes("float16", "bfloat16", "float32", "float64")
FLOAT8 = _dtypes("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
COMPLEX = _dtypes("complex64", "complex128")
#: Complex of 16-bit halves: complex32, and bcomplex32 (bfloat16's; torch 2.14 has it).
HALF_COMPLEX = _dtypes("complex32", "bcomplex32")
INT = _dtypes("int8", "int16", "int32", "int64", "uint8")
UINT_WIDE = _dtypes("uint16", "uint32", "uint64")
#: Every dtype torch has, by name (``torch.float`` and its other aliases once).
ALL_DTYPES: tuple[torch.dtype, ...] = tuple(sorted(
    {v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))


def _copies(dtype: torch.dtype) -> bool:
    """Whether torch can copy a tensor of ``dtype`` (the sub-byte ``int1``-``uint7`` shells
    cannot: every collective's write-back is a copy)."""
    try:
        with warnings.catch_warnings():  # complex32: "ComplexHalf support is experimental"
            warnings.simplefilter("ignore")
            torch.empty(1, dtype=dtype).clone()
    except (RuntimeError, NotImplementedError):
        return False
    return True


#: Dtypes no collective moves: a quantized tensor's bytes mean nothing without its quantizer,
#: and torch cannot copy the sub-byte shells.
UNMOVABLE = frozenset(d for d in ALL_DTYPES
                      if str(d).startswith(("torch.qint", "torch.quint")) or not _copies(d))
MOVABLE = frozenset(d for d in ALL_DTYPES if d not in UNMOVABLE)

#: Devices a tensor may live on: CPU tensors are used in place, CUDA ones staged through host
#: memory (``staging.host``). Anything else (``meta``, ``xpu``, ...) has no bytes pyc10d can read.
DEVICES = {"cpu": "in place", "cuda": "staged through host memory"}


class Widen:
    """How a reduction the kernels lack runs: on ``wire`` tensors, converted back at the end.

    ``to_wire`` runs when the operation runs (not at issue: an earlier queued operation may
    still write the input); ``back`` writes a result into the caller's tensor.
    """

    __slots__ = ("wire", "flip", "alias")

    def __init__(self, wire: torch.dtype, *, flip: bool = False, alias: bool = False) -> None:
        self.wire = wire
        self.flip = torch.iinfo(wire).min if flip else 0  # the sign bit, for MIN/MAX of unsigned
        self.alias = alias  # a same-width view: the result lands in the caller's tensor as is

    def to_wire(self, t: torch.Tensor) -> torch.Tensor:
        d = t.detach()
        if self.alias:
            return d.view(self.wire)
        if self.flip:
            return d.view(self.wire).bitwise_xor(self.flip)
        return d.to(self.wire)

    def back(self, dst: torch.Tensor, wire: torch.Tensor) -> None:
        if self.alias:
            return
        d = dst.detach()
        if self.flip:
            d.view(self.wire).copy_(wire.bitwise_xor(self.flip))
        else:
            d.copy_(wire)

    def __repr__(self) -> str:
        return f"Widen({self.wire}{', flip' if self.flip else ''}{', alias' if self.alias else ''})"


_SIGNED_OF = {u: s for u, s in zip(UINT_WIDE, _dtypes("int16", "int32", "int64"))}


def support(dtype: torch.dtype, op: RedOpType) -> Widen | None | bool:
    """pyc10d's answer for reducing ``dtype`` with ``op``: None (the kernels do it as is), a
    ``Widen`` (reduced as another dtype), or False (refused)."""
    if op not in OPS:
        return False
    if dtype in FLOAT:
        return None if op in _ARITH else False
    if dtype in FLOAT8:
        return Widen(torch.float32) if op in _ARITH else False
    if dtype in COMPLEX:
        return None if op in _COMPLEX_OPS else False
    if dtype in HALF_COMPLEX:  # CPU kernels lack most of it: reduce as complex64
        return Widen(torch.complex64) if op in _COMPLEX_OPS else False
    if dtype in INT:
        return None if op in _INTEGRAL else False
    if dtype in UINT_WIDE:
        if op not in _INTEGRAL:
            return False
        return Widen(_SIGNED_OF[dtype], flip=op in (_R.MIN, _R.MAX), alias=op not in (_R.MIN, _R.MAX))
    if dtype == torch.bool:  # SUM is OR, PRODUCT is AND (``reduce_ops._KERNELS``)
        return None if op in _INTEGRAL else False
    return False


def accepted_dtypes(op: RedOpType) -> list[torch.dtype]:
    return [d for d in ALL_DTYPES if support(d, op) is not False]


def _names(dtypes: Any) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


_PLANS: dict[tuple[int, torch.dtype], Widen | None] = {}  # (id of a RedOpType member, dtype)


def reduction(opname: str, red: ReduceOp, dtype: torch.dtype) -> Widen | None:
    """Check that ``dtype`` can be reduced with ``red``; how (None: as it is). Cached by
    (op, dtype): the 8-byte all_reduce pays one dict lookup (keyed by the member's ``id``,
    an Enum's own hash being a Python call)."""
    t = red.op
    key = (id(t), dtype)
    try:
        return _PLANS[key]
    except KeyError:
        pass
    if t.__class__ is not RedOpType or t not in OPS:
        raise DistInputError(f"{opname}: argument `op`: {red!r} is not a reduction; accepted: "
                             + ", ".join(f"ReduceOp.{o.name}" for o in OPS))
    plan = support(dtype, t)
    if plan is False:
        ok = accepted_dtypes(t)
        if dtype in MOVABLE and any(support(dtype, o) is not False for o in OPS):
            others = ", ".join(f"ReduceOp.{o.name}" for o in OPS if support(dtype, o) is not False)
            raise DistInputError(
                f"{opname}: argument `op`: ReduceOp.{t.name} is not supported for {dtype} "
                f"({dtype} accepts {others}; ReduceOp.{t.name} accepts {_names(ok)})")
        raise DistInputError(
            f"{opname}: argument `tensor`: {dtype} cannot be reduced (invalid scalar type; "
            f"ReduceOp.{t.name} accepts {_names(ok)})")
    _PLANS[key] = plan
    return plan


_strided = torch.strided
_Tensor = torch.Tensor


def check_tensors(opname: str, tensors: Any, what: str = "tensor", sparse: bool = False) -> None:
    """Every item of ``tensors`` is a tensor pyc10d can read and write: on an accepted device,
    strided (or sparse COO where ``sparse``), of a movable dtype. Raises ``TypeError`` for a
    non-tensor, ``DistInputError`` otherwise."""
    for t in tensors:
        if t.__class__ is _Tensor and t.is_cpu and t.layout is _strided and t.dtype in MOVABLE:
            continue  # the common case, in four attribute reads
        _check_slow(opname, t, what, sparse)


def check_tensor(opname: str, t: Any, what: str = "tensor") -> None:
    if t.__class__ is _Tensor and t.is_cpu and t.layout is _strided and t.dtype in MOVABLE:
        return
    _check_slow(opname, t, what, False)


def _check_slow(opname: str, t: Any, what: str, sparse: bool) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{opname}: argument `{what}` must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type not in DEVICES:
        raise DistInputError(
            f"{opname}: argument `{what}`: unsupported device type {t.device.type}; accepted: "
            + ", ".join(f"{k} ({v})" for k, v in DEVICES.items()))
    if t.layout is not _strided and not (sparse and t.layout is torch.sparse_coo):
        accepted = "torch.strided" + (" and torch.sparse_coo (ReduceOp.SUM)" if sparse else "")
        raise DistInputError(f"{opname}: argument `{what}`: unsupported layout {t.layout}; accepted: {accepted}")
    if t.is_quantized or t.dtype not in MOVABLE:
        raise DistInputError(
            f"{opname}: argument `{what}`: invalid scalar type {t.dtype} (pyc10d moves no quantized "
            f"tensor and no dtype torch cannot copy); accepted: {_names(sorted(MOVABLE, key=str))}")


# -- Gloo, for the README: which (dtype, op) torch 2.13's ProcessGroupGloo reduces ------------
#: Measured by running ``ProcessGroupGloo.allreduce`` on 2 ranks for every pair
#: (tests/backends/test_accepts.py checks this against a live Gloo).
GLOO: dict[str, frozenset[RedOpType]] = {
    "float16/bfloat16/float32/float64": frozenset((_R.SUM, _R.AVG, _R.PRODUCT, _R.MIN, _R.MAX)),
    "float8 (e4m3fn, e5m2, ...)": frozenset(),
    "complex64/complex128": frozenset((_R.SUM, _R.AVG)),
    "complex32 (bcomplex32: torch 2.14)": frozenset((_R.SUM,)),
    "int8/int32/int64/uint8": frozenset(_INTEGRAL),
    "int16": frozenset(),
    "uint16/uint32/uint64": frozenset(),
    "bool": frozenset(_INTEGRAL),
    "bits8/bits16/bits1x8/.../float4_e2m1fn_x2": frozenset(),
    "int1-int7/uint1-uint7 (sub-byte shells)": frozenset(),
}
#: One dtype of each README row (pyc10d answers the same for every dtype of a row).
ROWS: dict[str, tuple[torch.dtype, ...]] = {
    "float16/bfloat16/float32/float64": FLOAT,
    "float8 (e4m3fn, e5m2, ...)": FLOAT8,
    "complex64/complex128": COMPLEX,
    "complex32 (bcomplex32: torch 2.14)": HALF_COMPLEX,
    "int8/int32/int64/uint8": _dtypes("int8", "int32", "int64", "uint8"),
    "int16": _dtypes("int16"),
    "uint16/uint32/uint64": UINT_WIDE,
    "bool": (torch.bool,),
    "bits8/bits16/bits1x8/.../float4_e2m1fn_x2": tuple(sorted(
        (d for d in MOVABLE if d not in FLOAT + FLOAT8 + COMPLEX + INT + UINT_WIDE
         and d not in (torch.bool, *HALF_COMPLEX)), key=str)),
    "int1-int7/uint1-uint7 (sub-byte shells)": tuple(sorted(
        (d for d in UNMOVABLE if not str(d).startswith(("torch.qint", "torch.quint"))), key=str)),
}
#: The rows whose dtypes Gloo moves at all (broadcast, all_gather, ...; measured as ``GLOO``).
GLOO_MOVES = frozenset(("float16/bfloat16/float32/float64", "complex64/complex128",
                        "complex32 (bcomplex32: torch 2.14)",
                        "int8/int32/int64/uint8", "bool"))


def _cell(dtype: torch.dtype, row: str, op: RedOpType) -> str:
    ours = support(dtype, op)
    mine = "✗" if ours is False else ("✓" if ours is None else "✓ᵂ")
    return f"{mine} / {'✓' if op in GLOO[row] else '✗'}"


def readme_table() -> str:
    """The README's dtype × op table: each cell "pyc10d / Gloo" (✓ᵂ: through a wider or
    same-width signed accumulator, see ``Widen``); "moved": broadcast, all_gather, scatter,
    gather, all_to_all, send/recv."""
    head = "| dtype | moved | " + " | ".join(o.name for o in OPS) + " |"
    lines = [head, "|" + "---|" * (len(OPS) + 2)]
    for row, dtypes in ROWS.items():
        moved = f"{'✓' if dtypes[0] in MOVABLE else '✗'} / {'✓' if row in GLOO_MOVES else '✗'}"
        lines.append(f"| {row} | {moved} | " + " | ".join(_cell(dtypes[0], row, o) for o in OPS) + " |")
    return "\n".join(lines)
