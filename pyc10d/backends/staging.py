"""Host staging: algorithms see contiguous CPU tensors; results are copied back if needed.

A contiguous CPU tensor is used in place (zero-copy); a strided view or a CUDA tensor gets
a contiguous CPU copy, and ``writeback`` copies the result into the caller's tensor.
"""

from __future__ import annotations

import torch


def host(t: torch.Tensor) -> torch.Tensor:
    if t.is_cpu and not t.requires_grad and t.is_contiguous():
        return t  # (a detached alias would cost a tensor per call and change nothing)
    d = t.detach()
    if d.is_cpu and d.is_contiguous():
        return d
    return d.to("cpu", memory_format=torch.contiguous_format, copy=True)


def writeback(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst is src:
        return
    d = dst.detach()
    if d.is_cpu and d.data_ptr() == src.data_ptr() and d.is_contiguous():
        return
    d.copy_(src)

