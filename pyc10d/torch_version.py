"""Which torch pyc10d runs on, and what follows from it: asked here and nowhere else.

pyc10d supports torch 2.13 and 2.14 (pyproject's range; ``make venv`` builds 2.13.0, ``make
venv TORCH=2.14.1`` the other, ``make test-torch-next`` runs the suite there). What differs
for pyc10d:

* torch 2.14 also finds a backend through the ``torch.distributed.backends`` entry point when
  ``init_process_group`` meets its name (``Backend._ensure_backend_registered``), so
  ``init_process_group("pyc10d")`` works with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` there; 2.13
  only runs the ``torch.backends`` autoload;
* torch 2.14 has collective hooks on a group (``register_pre_hook`` / ``register_post_hook``)
  and abort hooks on a backend (``register_abort_hook``): ``HAS_COLLECTIVE_HOOKS`` and
  ``HAS_ABORT_HOOKS`` ask for them by feature;
* torch 2.14's API makes calls 2.13 has no name for: ``dist.gather_single``,
  ``dist.set_timeout``, ``dist.get_backend_impl`` (``pg.get_backend(device)``), windows and
  reconfigure (``dist._new_window``, ``dist._reconfigure``).

pyc10d's own API has every name on both torches, and the plugin's group answers 2.14's calls on
both (2.13 never makes them): code asks this module only where torch itself differs, and a
test of a call that only 2.14's API makes asks ``AT_LEAST_2_14`` (on 2.13 that call does not
exist).

A leaf: it imports torch and nothing of pyc10d.
"""

from __future__ import annotations

import torch
from torch.torch_version import TorchVersion

VERSION = TorchVersion(torch.__version__)
#: torch 2.14 or newer: the entry-point discovery and the calls above.
AT_LEAST_2_14: bool = VERSION >= (2, 14)

_c10d = getattr(torch._C, "_distributed_c10d", None)
#: torch's collective hooks (``ProcessGroup.register_pre_hook`` / ``register_post_hook`` with
#: ``PreHookArgs`` / ``PostHookArgs``): asked by feature, not version (2.14 has them, 2.13 not).
HAS_COLLECTIVE_HOOKS: bool = _c10d is not None and hasattr(_c10d, "PreHookArgs") and hasattr(
    _c10d.ProcessGroup, "register_pre_hook")
#: torch's ``Backend.register_abort_hook`` (2.14 has it, 2.13 not).
HAS_ABORT_HOOKS: bool = _c10d is not None and hasattr(_c10d.Backend, "register_abort_hook")
