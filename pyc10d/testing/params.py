"""``parametrize`` and ``instantiate_parametrized_tests``, as torch's ``common_utils`` has them.

``@parametrize("device", ["cpu", "cuda"])`` on a test method, and the class decorated with
``@instantiate_parametrized_tests``, give one test per value, named ``<test>_<param>_<value>``
(``test_broadcast_device_cpu``); the undecorated method is removed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_PARAMS_ATTR = "_pyc10d_parametrize"


def parametrize(name: str, values: list[Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the decorated test once per value of ``name`` (stackable)."""

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        setattr(func, _PARAMS_ATTR, [(name, list(values)), *getattr(func, _PARAMS_ATTR, [])])
        return func

    return decorator


def _expand(func: Callable[..., Any]) -> list[tuple[str, dict[str, Any]]]:
    combos: list[tuple[str, dict[str, Any]]] = [("", {})]
    for name, values in getattr(func, _PARAMS_ATTR):
        combos = [(f"{suffix}_{name}_{v}", {**kw, name: v}) for suffix, kw in combos for v in values]
    return combos


def instantiate_parametrized_tests(cls: T) -> T:
    """Replace every parametrized ``test_*`` method of ``cls`` by one method per combination."""
    for attr, func in list(vars(cls).items()):
        if not attr.startswith("test") or not hasattr(func, _PARAMS_ATTR):
            continue
        delattr(cls, attr)
        for suffix, kwargs in _expand(func):

            def make(f: Callable[..., Any], kw: dict[str, Any]) -> Callable[..., Any]:
                @functools.wraps(f)
                def test(self: Any) -> Any:
                    return f(self, **kw)

                return test

            setattr(cls, attr + suffix, make(func, kwargs))
    return cls
