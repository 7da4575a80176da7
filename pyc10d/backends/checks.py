"""Input validation for the low-level ``ProcessGroup`` methods.

Messages match torch's Gloo backend ("invalid root rank", "invalid tensor type", ...) so
code and tests that match on them keep working; every check runs before any byte moves.
What each collective accepts by dtype, op, device and layout is ``accepts``'s table.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import DistInputError


def fail(opname: str, msg: str) -> None:
    """Refuse the call: a ``RuntimeError`` as Gloo's (``DistInputError``), raised before any
    byte moves, so the group stays usable."""
    raise DistInputError(f"ProcessGroup::{opname}: {msg}")


def as_list(x: Any) -> list:
    return [x] if isinstance(x, torch.Tensor) else list(x)


def check_root_rank(opname: str, root: int, size: int) -> None:
    if root < 0 or root >= size:
        fail(opname, f"invalid root rank: {root}")


def check_root_tensor(opname: str, index: int, n: int) -> None:
    if index < 0 or index >= n:
        fail(opname, f"invalid root tensor: {index}")


def check_same(opname: str, tensors: list[torch.Tensor], ref: torch.Tensor | None = None) -> None:
    """All tensors share the layout, dtype and shape of ``ref`` (default: the first)."""
    if not tensors or (ref is None and len(tensors) == 1):
        return
    ref = tensors[0] if ref is None else ref
    for t in tensors:
        if t.layout != ref.layout:
            fail(opname, "invalid tensor layout")
        if t.dtype != ref.dtype:
            fail(opname, f"invalid tensor type: expected {ref.dtype}, got {t.dtype}")
        if t.shape != ref.shape:
            fail(opname, f"invalid tensor size: expected {list(ref.shape)}, got {list(t.shape)}")


def check_non_empty(opname: str, tensors: list, what: str = "tensor list") -> None:
    if len(tensors) == 0:
        fail(opname, f"requires non-empty {what}")


def check_single(opname: str, tensors: list, what: str = "tensor list") -> None:
    if len(tensors) != 1:
        fail(opname, f"requires a single-element {what}")

