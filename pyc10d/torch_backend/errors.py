"""The one place where a pyc10d failure becomes what torch's callers expect.

torch's code catches ``torch.distributed``'s own exception types (``DistBackendError``,
``DistStoreError``, ``DistNetworkError``), and torch's C++ (DDP's reducer, ``wait_tensor``)
only sees a failure when the work's future is *completed with an error*. pyc10d's engines
raise pyc10d's types and complete their own futures with ``set_exception``, which in torch
stores the exception as the future's *value* (a Python object) and only raises it when
Python unwraps it: C++ reads that value as the operation's output tensors and crashes
(DDP's reducer takes the first tensor of an exception object: a segfault).

So the plugin translates here, and nowhere else:

* ``to_torch(error)``: the same error (message, cause, traceback, attributes) as an instance
  of a class that is both pyc10d's type and torch's, so ``except pyc10d.DistNetworkError``
  and ``except torch.distributed.DistBackendError`` both catch it.
* ``torch_future(fut)``: a future that C++ sees as failed when ``fut`` failed. The only way
  Python can set an error on a torch future is a ``then`` callback that raises; torch's C++
  stores that as a ``RuntimeError`` whose message is ``"Got the following error when running
  the callback: DistBackendError: <pyc10d's message>"``, which is what DDP's ``backward``
  raises on a lost peer (Gloo raises a ``RuntimeError`` there too).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as tdist

from .. import errors as pe
from ..backends.work import Work

#: pyc10d's error type -> the torch type its plugin-side twin also derives from. Most
#: specific first: a timeout is a backend failure to torch (as NCCL's collective timeouts).
_TORCH_BASE: tuple[tuple[type[BaseException], type[BaseException]], ...] = (
    (pe.DistStoreError, tdist.DistStoreError),
    (pe.DistError, tdist.DistBackendError),
)

_twins: dict[type[BaseException], type[BaseException]] = {}


def _twin(cls: type[BaseException]) -> type[BaseException] | None:
    """The class deriving from ``cls`` and from its torch counterpart (made once per class)."""
    twin = _twins.get(cls)
    if twin is None:
        base = next((t for p, t in _TORCH_BASE if issubclass(cls, p)), None)
        if base is None or issubclass(cls, base):
            return None
        twin = type(cls.__name__, (cls, base), {"__module__": cls.__module__})
        _twins[cls] = twin
    return twin


def to_torch(error: BaseException) -> BaseException:
    """``error`` as torch's type too (see the module docstring); other errors as they are."""
    cls = _twin(type(error))
    if cls is None:
        return error
    twin = copy.copy(error)  # args and attributes; the original may be raised elsewhere
    twin.__class__ = cls
    twin.__cause__, twin.__context__ = error.__cause__, error.__context__
    twin.__traceback__ = error.__traceback__
    return twin


_F = TypeVar("_F", bound=Callable[..., Any])


def translating(fn: _F) -> _F:
    """``fn`` raising torch's types (``to_torch``): for a process group's methods, which fail
    at once when the group is destroyed or aborted, before any Work exists."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - re-raised as torch's type
            raise to_torch(e) from e.__cause__

    return call  # type: ignore[return-value]


def torch_future(work: Work) -> torch.futures.Future:
    """A future that completes as ``work`` does, failed (as C++ sees failure) when it fails."""

    def outcome(fut: torch.futures.Future) -> Any:
        error = work.exception()
        if error is not None:  # raised here, not by the parent's unwrap: one frame in the text
            raise to_torch(error).with_traceback(None) from None
        return fut.value()

    return work.get_future().then(outcome)
