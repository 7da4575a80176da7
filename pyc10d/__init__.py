"""pyc10d: torch.distributed's c10d layer in Python.

``import pyc10d as dist`` where you wrote ``import torch.distributed as dist``. Layers, each
importing only the ones before it: ``store`` → ``transport`` → ``algorithms`` → ``backends``
→ ``process_group`` → the public API (``groups``, ``collectives``, ``p2p``,
``object_collectives``), re-exported here. On top of it, rooms of their own:
``functional`` (functional collectives; importing it also installs how in-place
collectives are traced), ``device_mesh``, ``nn`` (DistributedDataParallel, its Reducer,
comm hooks, SyncBatchNorm; ``Reducer`` and ``GradBucket`` are re-exported here as torch
does) and ``symmetric_memory`` (imported on its own, as torch's).
"""

from __future__ import annotations

import sys as _sys
from typing import Any as _Any

__version__ = "0.2.0"


#: Modules run with ``python -m`` that need nothing of the API: the launcher, and the Open MPI
#: benchmark's ranks (numpy and mpi4py only).
_LIGHT_MAINS = ("pyc10d.run", "pyc10d.bench.mpi_worker")


def _launching_light_main() -> bool:
    """True while ``python -m <one of _LIGHT_MAINS>`` imports this package as its parent.

    Those processes need nothing of the API, and the API imports torch: 2-2.5 s of CPU per
    process on a 2-core machine, most of a launch of ranks that start no torch themselves (or,
    with ``--start-method fork``, that the launcher preloads on purpose). Python sets
    ``sys.argv[0]`` to ``"-m"`` while it locates the module to run."""
    argv = getattr(_sys, "orig_argv", [])
    if _sys.argv[:1] != ["-m"] or "-m" not in argv:
        return False
    after = argv.index("-m") + 1
    return after < len(argv) and argv[after] in _LIGHT_MAINS


def _is_submodule(name: str) -> bool:
    import pkgutil

    return any(m.name == name for m in pkgutil.iter_modules(_sys.modules[__name__].__path__))


if _launching_light_main():
    from . import _lazy_api

    def __getattr__(name: str) -> _Any:  # such a process: the API on first use
        if name.startswith("__") or _lazy_api.loading or _is_submodule(name):
            raise AttributeError(name)  # ``from . import x`` then imports the submodule x
        _lazy_api.load_api()
        try:
            return globals()[name]
        except KeyError:
            raise AttributeError(f"module 'pyc10d' has no attribute {name!r}") from None

else:
    from ._api import *  # noqa: F403 - the API, re-exported
    from ._api import __all__  # noqa: F401 - re-exported
