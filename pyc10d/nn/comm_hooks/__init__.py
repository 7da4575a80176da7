"""Built-in DDP communication hooks: ``model.register_comm_hook(state, hook)``.

``allreduce_hook``, ``fp16_compress_hook`` and ``bf16_compress_hook`` take a process group
(or None for the world) as state; ``powerSGD_hook`` takes a :class:`PowerSGDState`.
"""

from __future__ import annotations

from .default import allreduce_hook, bf16_compress_hook, fp16_compress_hook
from .powersgd import PowerSGDState, powerSGD_hook

__all__ = ["PowerSGDState", "allreduce_hook", "bf16_compress_hook", "fp16_compress_hook", "powerSGD_hook"]
