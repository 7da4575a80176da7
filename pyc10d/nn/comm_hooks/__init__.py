"""Built-in DDP communication hooks: ``model.register_comm_hook(state, hook)``.

``allreduce_hook``, ``fp16_compress_hook`` and ``bf16_compress_hook`` take a process group
(or None for the world) as state; ``powerSGD_hook`` takes a :class:`PowerSGDState`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from .default import allreduce_hook, bf16_compress_hook, fp16_compress_hook
from .powersgd import PowerSGDState, powerSGD_hook

__all__ = ["BuiltinCommHookType", "PowerSGDState", "allreduce_hook", "bf16_compress_hook", "builtin_hook",
           "fp16_compress_hook", "powerSGD_hook"]


class BuiltinCommHookType(enum.Enum):
    """torch.distributed.BuiltinCommHookType: the hooks DDP's ``_register_builtin_comm_hook``
    knows by name (in torch, C++ versions of the two hooks below)."""

    ALLREDUCE = "allreduce"
    FP16_COMPRESS = "fp16_compress"


def builtin_hook(kind: Any) -> Callable[..., Any]:
    """The hook ``kind`` names: a ``BuiltinCommHookType`` of pyc10d's or torch's (by name)."""
    name = getattr(kind, "name", None)
    if name == "ALLREDUCE":
        return allreduce_hook
    if name == "FP16_COMPRESS":
        return fp16_compress_hook
    raise ValueError(f"unknown built-in communication hook {kind!r}: use BuiltinCommHookType.ALLREDUCE "
                     f"or BuiltinCommHookType.FP16_COMPRESS")
