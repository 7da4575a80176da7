"""Skip and retry decorators with the names torch's distributed tests use.

Skip conditions raise :class:`unittest.SkipTest` when the test runs, so they work
in plain test cases and inside the ranks of a
:class:`~pyc10d.testing.MultiProcessTestCase`. Conditions that do not depend on
the test instance are also recorded on the function (``_pyc10d_skip_checks``)
so that ``MultiProcessTestCase`` can skip in the parent without forking.
"""

from __future__ import annotations

import functools
import os
import random
import sys
import time
import unittest
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])
SkipCheck = Callable[[], "str | None"]

#: Attribute holding instance-independent skip checks (evaluated before forking).
SKIP_CHECKS_ATTR = "_pyc10d_skip_checks"

ADDRESS_IN_USE = "Address already in use"
CONNECT_TIMEOUT = "connect() timed out."


def pending_skip_reason(func: Callable[..., Any]) -> str | None:
    """Reason to skip ``func`` now, from checks recorded by the decorators below."""
    for check in getattr(func, SKIP_CHECKS_ATTR, ()):
        reason = check()
        if reason:
            return reason
    return None


def _skip_when(check: SkipCheck) -> Callable[[F], F]:
    """Decorator factory: skip the test whenever ``check()`` returns a reason."""

    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            reason = check()
            if reason:
                raise unittest.SkipTest(reason)
            return func(*args, **kwargs)

        setattr(wrapper, SKIP_CHECKS_ATTR, (*getattr(func, SKIP_CHECKS_ATTR, ()), check))
        return wrapper  # type: ignore[return-value]

    return decorator


def skip_if_lt_x_gpu(n: int) -> Callable[[F], F]:
    """Skip unless at least ``n`` CUDA devices are visible (never initialises CUDA)."""

    def check() -> str | None:
        if torch.cuda.is_available() and torch.cuda.device_count() >= n:
            return None
        return f"Need at least {n} CUDA device{'s' if n != 1 else ''}"

    return _skip_when(check)


def requires_gloo() -> Callable[[F], F]:
    """No-op: pyc10d's TCP backend answers to the name ``"gloo"``, so it is always there."""

    def decorator(func: F) -> F:
        return func

    return decorator


def skip_if_win32() -> Callable[[F], F]:
    """Skip on Windows."""
    return _skip_when(
        lambda: (
            "This unit test case is not supported on Windows platform"
            if sys.platform == "win32"
            else None
        )
    )


def skip_but_pass_in_sandcastle(reason: str) -> Callable[[F], F]:
    """Unconditionally skip with ``reason`` (there is no Sandcastle here)."""
    return unittest.skip(reason)


def skip_but_pass_in_sandcastle_if(condition: bool, reason: str) -> Callable[[F], F]:
    """Skip with ``reason`` when ``condition`` is true."""
    return unittest.skipIf(condition, reason)


def skip_if_small_worldsize(func: F) -> F:
    """Skip when the world size is below 8 (unless ``BACKEND=mpi``), as torch does.

    The world size is the test's ``world_size`` when the decorated function is a
    method of an object that has one, otherwise the ``WORLD_SIZE`` env variable.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        world_size = getattr(args[0], "world_size", None) if args else None
        if world_size is None:
            world_size = int(os.environ.get("WORLD_SIZE", "0"))
        if os.environ.get("BACKEND") != "mpi" and int(world_size) < 8:
            raise unittest.SkipTest("Skipped due to small world size.")
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def retry_on_connect_failures(
    func: F | None = None,
    connect_errors: tuple[str, ...] = (ADDRESS_IN_USE,),
    retries: int = 10,
) -> Any:
    """Re-run a test whose ``RuntimeError`` mentions one of ``connect_errors``.

    Usable bare (``@retry_on_connect_failures``) or with arguments. Ports picked
    by :func:`~pyc10d.testing.find_free_port` can be taken by someone else before
    they are bound; that race is what this absorbs.
    """
    if isinstance(connect_errors, str):
        connect_errors = (connect_errors,)
    if func is None:
        return functools.partial(
            retry_on_connect_failures, connect_errors=connect_errors, retries=retries
        )

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for attempt in range(1, retries + 1):
            try:
                return func(*args, **kwargs)
            except RuntimeError as error:
                if not any(text in str(error) for text in connect_errors):
                    raise
                if attempt == retries:
                    raise RuntimeError(
                        f"Failing after {retries} retries with error: {error}"
                    ) from error
                time.sleep(random.random())
        raise AssertionError("unreachable")

    return wrapper


def requires_nccl() -> Callable[[F], F]:
    """Skip: pyc10d has no NCCL backend (CUDA tensors are staged through host memory)."""
    return _skip_when(lambda: "c10d was not compiled with NCCL support")
