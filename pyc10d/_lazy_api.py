"""The API bound into the package on first use, in the processes that import pyc10d without
it (``pyc10d._launching_light_main``: the launcher, whose ``run_fork.preload`` binds it before
forking ranks, and the Open MPI benchmark's ranks)."""

from __future__ import annotations

import importlib
import sys

#: True while ``load_api`` runs: a name of the package looked up meanwhile is not bound yet.
loading = False


def load_api() -> None:
    """Bind every name of ``__all__`` in the package (idempotent)."""
    global loading
    if loading:
        return
    loading = True
    try:
        package = sys.modules[__package__]
        api = importlib.import_module(f"{__package__}._api")
        vars(package).update({name: getattr(api, name) for name in api.__all__})
        package.__all__ = api.__all__
    finally:
        loading = False
