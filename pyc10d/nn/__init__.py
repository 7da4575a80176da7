"""Data-parallel training on pyc10d: ``DistributedDataParallel``, its ``Reducer``, comm hooks.

``from pyc10d.nn import DistributedDataParallel`` where torch code imports it from
``torch.nn.parallel``; ``SyncBatchNorm`` replaces ``torch.nn.SyncBatchNorm``. Everything
here is built on torch's public autograd hooks and pyc10d's own collectives.
"""

from __future__ import annotations

from .ddp import DistributedDataParallel
from .reducer import (
    _DEFAULT_BUCKET_BYTES,
    _DEFAULT_FIRST_BUCKET_BYTES,
    GradBucket,
    Reducer,
    _compute_bucket_assignment_by_size,
    compute_bucket_assignment_by_size,
)
from .sync_batchnorm import SyncBatchNorm

__all__ = [
    "DistributedDataParallel",
    "GradBucket",
    "Reducer",
    "SyncBatchNorm",
    "compute_bucket_assignment_by_size",
    "_DEFAULT_BUCKET_BYTES",
    "_DEFAULT_FIRST_BUCKET_BYTES",
    "_compute_bucket_assignment_by_size",
]
