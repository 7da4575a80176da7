"""Inputs that stress a dtype and the exact reduction of them, for any dtype pyc10d reduces.

Integers wrap as the dtype does (computed in Python integers, so ``uint64`` is exact);
floating and complex values are reduced in float64/complex128 and rounded once to the dtype.
Shared by ``tests/backends/test_accepts.py`` (the kernels) and ``tests/test_properties.py``
(over the wire): every rank regenerates every rank's input from ``(seed, rank)``.
"""

from __future__ import annotations

import torch

from pyc10d.types import RedOpType

_FLOAT_POOL = torch.tensor([0.5, 1.0, 1.5, 2.0, 4.0, 0.25, 3.0])


def inputs(dtype: torch.dtype, n: int, shape: tuple[int, ...] | int = 16, seed: int = 7) -> list[torch.Tensor]:
    """``n`` ranks' inputs: an integer type's extremes and mid-points (unsigned MIN/MAX come out
    right only if the sign trick does), small exact floats, random bytes for byte-only dtypes."""
    g = torch.Generator().manual_seed(seed)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    numel = 1
    for s in shape:
        numel *= s
    out = []
    for _ in range(n):
        if dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=g).bool()
        elif dtype.is_floating_point or dtype.is_complex:
            pick = _FLOAT_POOL[torch.randint(0, len(_FLOAT_POOL), shape, generator=g)]
            if dtype.is_complex:
                t = torch.complex(pick, pick.flip(-1) if pick.dim() else pick).to(dtype)
            else:
                t = pick.to(dtype)
        else:
            try:
                info = torch.iinfo(dtype)
            except TypeError:  # bits*, float4: bytes
                size = torch.empty(0, dtype=dtype).element_size()
                raw = torch.randint(0, 256, (numel * size,), generator=g, dtype=torch.uint8)
                t = raw.view(dtype).view(shape) if shape else raw.view(dtype)[0].clone()
                out.append(t)
                continue
            pool = [info.min, info.max, 0, 1, 3, info.max - 1, info.min + 1, (info.max + info.min) // 2]
            idx = torch.randint(0, len(pool), (numel,), generator=g).tolist()
            t = torch.tensor([pool[i] for i in idx], dtype=dtype).view(shape)
        out.append(t)
    return out


def reference(xs: list[torch.Tensor], op: RedOpType, factor: float = 2.0) -> torch.Tensor:
    """``op`` over ``xs`` exactly, in ``xs``'s dtype (PREMUL_SUM multiplies by ``factor``)."""
    dtype, shape = xs[0].dtype, xs[0].shape
    if dtype.is_floating_point or dtype.is_complex:
        wide = torch.stack([x.to(torch.complex128 if dtype.is_complex else torch.float64) for x in xs])
        fn = {RedOpType.SUM: lambda w: w.sum(0), RedOpType.AVG: lambda w: w.sum(0) / len(xs),
              RedOpType.PREMUL_SUM: lambda w: (w * factor).sum(0), RedOpType.PRODUCT: lambda w: w.prod(0),
              RedOpType.MIN: lambda w: w.min(0).values, RedOpType.MAX: lambda w: w.max(0).values}[op]
        return fn(wide).to(dtype)
    cols = list(zip(*[x.reshape(-1).tolist() for x in xs]))
    if dtype == torch.bool:
        red = {RedOpType.SUM: any, RedOpType.MAX: any, RedOpType.BOR: any, RedOpType.PRODUCT: all,
               RedOpType.MIN: all, RedOpType.BAND: all, RedOpType.BXOR: lambda c: sum(c) % 2 == 1}[op]
        return torch.tensor([red(c) for c in cols], dtype=dtype).view(shape)
    info = torch.iinfo(dtype)
    bits = info.bits

    def wrap(v: int) -> int:
        v %= 1 << bits
        return v - (1 << bits) if info.min < 0 and v > info.max else v

    f = {RedOpType.SUM: lambda a, b: a + b, RedOpType.PRODUCT: lambda a, b: a * b, RedOpType.MIN: min,
         RedOpType.MAX: max, RedOpType.BAND: lambda a, b: a & b, RedOpType.BOR: lambda a, b: a | b,
         RedOpType.BXOR: lambda a, b: a ^ b}[op]
    vals = []
    for c in cols:
        acc = c[0]
        for v in c[1:]:
            acc = f(acc, v)
        vals.append(wrap(acc))
    return torch.tensor(vals, dtype=dtype).view(shape)


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal values and dtype (bytes for dtypes without arithmetic)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    try:
        return got.tolist() == want.tolist()
    except (RuntimeError, TypeError):  # bits*, float4: no scalars; compare the bytes
        return torch.equal(got.reshape(-1).contiguous().view(torch.uint8),
                           want.reshape(-1).contiguous().view(torch.uint8))
