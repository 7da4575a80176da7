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


#: The words torch's own backends use for a timeout and for a lost peer. torch's tests and
#: users' code match them (torch's suite: ``" (Timed out|closed|timeout) "``), so pyc10d's
#: messages carry them beside pyc10d's own detail (op, sequence number, group, ranks).
TIMED_OUT = "Timed out"
PEER_CLOSED = "Connection closed by peer"


def with_torch_phrase(error: BaseException, detail: str) -> str:
    """``detail`` led by torch's phrase for ``error``'s kind (timeout, lost peer), once.

    Other errors (a mismatch between ranks, a bad argument) have no common phrase in torch
    and keep their text as it is.
    """
    if isinstance(error, DistTimeoutError):  # (also a network error for a silent peer)
        return detail if TIMED_OUT in detail else f"{TIMED_OUT} ({detail})"
    if isinstance(error, DistNetworkError) and PEER_CLOSED not in detail:
        return f"{PEER_CLOSED} ({detail})"
    return detail


def with_message(e: BaseException, message: str) -> BaseException:
    """``e`` again, as an exception of its own type that says ``message``: for re-raising
    with the operation and rank in front. ``type(e)(message)`` where that works; for a class
    whose constructor takes other arguments, a subclass of it made here that takes just the
    message (``isinstance`` and ``except`` still see the original type, and its attributes are
    copied); failing that, a ``DistBackendError``. Raise the result ``from e`` or ``from None``."""
    cls = type(e)
    try:
        new = cls(message)
        if str(new) == message:
            return new
    except Exception:  # noqa: BLE001 - a constructor with another signature; handled below
        pass
    try:
        sub = type(cls.__name__, (cls,), {
            "__init__": lambda self, msg: BaseException.__init__(self, msg),
            "__str__": lambda self: BaseException.__str__(self),
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        })
        new = sub(message)
        new.__dict__.update(getattr(e, "__dict__", {}))
        return new
    except Exception:  # noqa: BLE001 - a type that cannot be subclassed
        return DistBackendError(f"{message} ({cls.__name__})")
