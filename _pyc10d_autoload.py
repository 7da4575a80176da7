"""torch's backend autoload hook: ``init_process_group("pyc10d")`` with no ``import pyc10d``.

pyc10d's distribution declares this module's ``register`` in the ``torch.backends`` entry-point
group. ``import torch`` calls every such entry point near the end of its own initialisation
(unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), after it imported ``torch.distributed``, and turns
any exception into a failed ``import torch``. So this module is the least that can register:

* it is a top-level module, so that loading it does not run ``pyc10d/__init__.py`` (which
  imports torch's submodules while ``torch`` itself is still half-initialised);
* it registers pyc10d's backend names with creators that import ``pyc10d.torch_backend`` on
  the first group they build: ``import torch`` pays for a few dictionary writes, not for pyc10d;
* it never raises: a failure is a warning, and torch imports as if pyc10d were not installed.

The one exception to "imports nothing of pyc10d": with ``PYC10D_SERVE_GLOO`` set (the user's
request that pyc10d serve torch's name ``"gloo"``), it imports ``pyc10d.torch_backend`` and
applies it here, before the program can build a group (``pyc10d/torch_backend/gloo_name.py``).

torch 2.14 also calls ``register_on_demand`` through the ``torch.distributed.backends`` entry
points (one per name), when ``init_process_group`` meets a name that is not registered yet:
with the autoload switched off, ``init_process_group("pyc10d")`` still finds pyc10d there.
That call does raise: the program asked for pyc10d, and is told why it cannot have it.

On a torch that lacks something pyc10d needs (a torch it was not tested on), ``import torch``
still works: ``register`` warns, naming the torch version and what is missing, and the group's
creator refuses ``init_process_group("pyc10d")`` with the same words
(``pyc10d.torch_version.require_plugin``).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

#: torch backend name -> what it is (the full table lives in ``pyc10d.torch_backend``).
NAMES = ("pyc10d", "pyc10d_shm", "pyc10d_tcp")
#: The user's request that pyc10d serve the name "gloo" (declared in ``pyc10d.settings``).
SERVE_GLOO = "PYC10D_SERVE_GLOO"


def _lazy(name: str) -> Any:
    def create(dist_opts: Any, backend_options: Any = None) -> Any:
        from pyc10d.torch_version import require_plugin  # (torch is whole by now)

        require_plugin(f"build a {name!r} group")
        from pyc10d.torch_backend import _creator

        return _creator(name)(dist_opts, backend_options)

    create.__name__ = f"create_{name}"
    return create


def _torch_version() -> str:
    return str(getattr(sys.modules.get("torch"), "__version__", "(unknown)"))


def _register(tdist: Any) -> None:
    backend = tdist.Backend
    lacking = [f"torch.distributed.Backend.{n}" for n in ("register_backend", "_plugins") if not hasattr(backend, n)]
    if lacking:
        raise RuntimeError(f"torch lacks {', '.join(lacking)}, which registering a backend needs")
    for name in NAMES:
        if name.upper() not in backend._plugins:
            backend.register_backend(name, _lazy(name), extended_api=True, devices=["cpu"])


def register() -> None:
    """Register pyc10d's names with torch.distributed, if it is there; never raise."""
    try:
        tdist = sys.modules.get("torch.distributed")
        if tdist is None or not tdist.is_available():
            return
        _register(tdist)
    except Exception as e:  # noqa: BLE001 - torch's import must not fail because of us
        warnings.warn(f"pyc10d: could not register its torch.distributed backends on torch {_torch_version()} "
                      f"({e}); init_process_group('pyc10d') will not find them", RuntimeWarning, stacklevel=2)
    if os.environ.get(SERVE_GLOO, "").strip():
        _serve_gloo()


def register_on_demand() -> None:
    """torch 2.14's ``torch.distributed.backends`` entry point: register, or raise saying why
    not (torch's ``init_process_group`` is waiting for the name and passes the error on)."""
    import torch.distributed as tdist

    from pyc10d.torch_version import require_plugin

    require_plugin("register its torch.distributed backends")
    _register(tdist)


def _serve_gloo() -> None:
    """Apply ``PYC10D_SERVE_GLOO`` (only called when it is set); a failure is a warning that
    names the setting, since torch's import must not fail and the user must not be left on
    Gloo without a word."""
    try:
        from pyc10d.torch_backend.gloo_name import apply_setting

        apply_setting()
    except Exception as e:  # noqa: BLE001 - torch's import must not fail because of us
        warnings.warn(f"pyc10d: {SERVE_GLOO} is set but pyc10d could not serve the name 'gloo' "
                      f"({type(e).__name__}: {e}); torch's Gloo serves it", RuntimeWarning, stacklevel=2)
