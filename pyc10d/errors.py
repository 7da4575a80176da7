"""One small error hierarchy.

Every error subclasses ``RuntimeError`` (as torch.distributed's do) so that code written
against torch's ``except RuntimeError`` keeps working; ``DistTimeoutError`` is also a
``TimeoutError`` so ``except TimeoutError`` works too.
"""

from __future__ import annotations


class DistError(RuntimeError):
    """Base of every pyc10d error."""


class DistStoreError(DistError):
    """A store operation failed (bad key, server gone, ...)."""


class QueueEmptyError(DistStoreError):
    """``queue_pop(key, block=False)`` found the queue empty."""


class DistTimeoutError(DistError, TimeoutError):
    """A blocking call waited longer than its timeout. The message says what was awaited."""


class DistNetworkError(DistError):
    """A peer was lost: its connection closed or broke mid-operation."""


class DistInputError(DistError, ValueError):
    """A call refused on the calling rank before anything was posted (a dtype, op, device,
    layout, size, rank or split it does not accept): the group stays usable. A ``RuntimeError``
    as Gloo's refusals are, and a ``ValueError`` as torch's Python-level checks are."""


class DistBackendError(DistError):
    """A collective failed inside a backend (mismatch between ranks, aborted group, ...)."""
