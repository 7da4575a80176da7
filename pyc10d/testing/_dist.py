"""Which module plays ``torch.distributed`` for the shared test helpers.

The helpers in :mod:`pyc10d.testing` are written against the ``torch.distributed``
API. By default they drive :mod:`pyc10d`; setting the environment variable
``PYC10D_TESTING_DIST`` (for example to ``torch.distributed``) or calling
:func:`set_dist_module` points them at another implementation, which is how the
ported seed tests are cross-checked against PyTorch's own gloo backend.

The module is resolved on every attribute access and imported lazily, so
importing :mod:`pyc10d.testing` never imports :mod:`pyc10d` (or torch.distributed)
by itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

ENV_VAR = "PYC10D_TESTING_DIST"
DEFAULT_MODULE = "pyc10d"

_override: str | None = None


def dist_module_name() -> str:
    """Name of the module the helpers use: override, then env var, then ``pyc10d``."""
    from pyc10d.settings import TESTING_DIST

    return _override or TESTING_DIST.get() or DEFAULT_MODULE


def set_dist_module(name: str | None) -> None:
    """Point the helpers at module ``name`` (``None`` restores env/default lookup)."""
    global _override
    _override = name


def get_dist() -> ModuleType:
    """Import (if needed) and return the module playing ``torch.distributed``."""
    return importlib.import_module(dist_module_name())


class LazyModule:
    """Stand-in whose attributes are looked up on a module resolved at access time."""

    def __init__(self, resolve: Callable[[], Any], label: str) -> None:
        self._resolve = resolve
        self._label = label

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resolve(), name)

    def __repr__(self) -> str:
        return f"<lazy {self._label} -> {dist_module_name()}>"


#: ``import torch.distributed as dist`` equivalent for helper code.
dist = LazyModule(get_dist, "dist")
#: ``torch.distributed.distributed_c10d`` equivalent (private helpers live there).
c10d = LazyModule(lambda: get_dist().distributed_c10d, "distributed_c10d")
