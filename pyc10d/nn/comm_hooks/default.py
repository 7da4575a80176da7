"""The plain and compressing all-reduce hooks (torch's ``default_hooks``).

Each returns a future of the bucket's averaged, flattened gradients; DDP copies its value
into the bucket. The compressing hooks halve the bytes on the wire at the cost of
half-precision rounding: the sum is taken in float16 (bfloat16), so each rank's gradient is
divided by the world size before it is sent, keeping the sum in range.
"""

from __future__ import annotations

from typing import Any

import torch

from ...collectives import all_reduce
from ...groups import _get_default_group
from ..reducer import GradBucket


def _group(process_group: Any) -> Any:
    return process_group if process_group is not None else _get_default_group()


def _allreduce_fut(process_group: Any, tensor: torch.Tensor) -> torch.futures.Future:
    """Average ``tensor`` over the group in place; the future's value is the averaged tensor."""
    group = _group(process_group)
    tensor.div_(group.size())
    fut = all_reduce(tensor, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def allreduce_hook(process_group: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """What DDP does without a hook: average the bucket over ``process_group`` (default: world)."""
    return _allreduce_fut(process_group, bucket.buffer())


def _compress_hook(dtype: torch.dtype, process_group: Any, bucket: GradBucket) -> torch.futures.Future:
    group = _group(process_group)
    buffer = bucket.buffer()
    compressed = buffer.to(dtype).div_(group.size())
    fut = all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(f: torch.futures.Future) -> torch.Tensor:
        out = bucket.buffer()
        out.copy_(f.value()[0])
        return out

    return fut.then(decompress)


def fp16_compress_hook(process_group: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in float16 (half the bytes; about 3 significant digits)."""
    return _compress_hook(torch.float16, process_group, bucket)


def bf16_compress_hook(process_group: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in bfloat16 (half the bytes, float32's range; about 2 digits)."""
    return _compress_hook(torch.bfloat16, process_group, bucket)

