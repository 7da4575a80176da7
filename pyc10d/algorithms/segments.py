"""Splitting blocks into pipeline segments, identically on every rank."""

from __future__ import annotations

import torch

from .. import settings

# Large enough that per-message overhead is small, small enough that a rank can forward
# segment s while segment s+1 is still on the wire (the ring becomes a pipeline).
# Every rank must use the same value: set PYC10D_SEGMENT_BYTES on all ranks or none.
SEGMENT_BYTES = settings.SEGMENT_BYTES.get()


def segments(block: torch.Tensor, seg_bytes: int | None = None) -> list[torch.Tensor]:
    # Read SEGMENT_BYTES at call time (not as a default argument) so it can be tuned/patched.
    if seg_bytes is None:
        seg_bytes = SEGMENT_BYTES
    elems = max(1, seg_bytes // max(block.element_size(), 1))
    flat = block.reshape(-1)
    return list(flat.split(elems)) if flat.numel() else [flat]
