"""Numbers from the environment: every numeric ``PYC10D_*`` setting read one way.

A bare ``int(os.environ[...])`` answers a typo with ``invalid literal for int() with base
10: '1M'``, naming neither the variable nor what it wants (measured: ``PYC10D_SHM_SLOT_BYTES=1M``
failed a job's first all_reduce that way). Here a bad value raises a ``ValueError`` that names
the variable, its value and the form expected; byte counts take the units the documentation
writes them in (``256K``, ``1M``, ``1MiB``: binary), as the benchmarks' ``--max-bytes`` does.

The bottom of the package: it imports nothing of pyc10d, so every layer may use it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

MIB = 1 << 20
#: A default of another type than the setting's: ``None`` for "unset" where that means more.
D = TypeVar("D")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": MIB, "MB": MIB,
          "MIB": MIB, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    """``'8'`` -> 8, ``'64M'``/``'64MiB'`` -> 67108864 (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"bad size {text!r}: use e.g. 8, 4K, 64M, 1G")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def _read(name: str, default: Any, convert: Callable[[str], Any], wants: str) -> Any:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return convert(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {wants}") from None


def env_bytes(name: str, default: D) -> int | D:
    """``name`` as a byte count (``1048576``, ``256K``, ``1M``), ``default`` when unset or empty."""
    return _read(name, default, parse_size, "a byte count such as 1048576, 256K or 1M")


def env_int(name: str, default: int) -> int:
    """``name`` as a whole number, ``default`` when unset or empty."""
    return _read(name, default, int, "a whole number")


def env_float(name: str, default: D, unit: str = "") -> float | D:
    """``name`` as a number (of ``unit``, for the error), ``default`` when unset or empty."""
    return _read(name, default, float, "a number" + (f" of {unit}" if unit else ""))
