"""``torch.distributed.shrink_group`` on the plugin's groups.

torch shrinks a group in three steps: it asks the group for its device backend
(``pg._get_backend(device)``), checks ``supports_shrinking`` and calls
``shrink(sorted_excluded, flags, opts)``; then it destroys the parent and wraps what
``shrink`` returned into a new ``ProcessGroup`` (``_create_shrunk_process_group``: a plain
C++ group, ``_register_backend(device, GLOO, new_backend)``), which becomes the default group
when the default one was shrunk. The plugin's group is a Python ``ProcessGroup`` with no
registered backend, and torch 2.13's ``Backend`` cannot be subclassed in Python (it binds no
constructor), so:

* ``TorchProcessGroup._get_backend`` answers, for the CPU, a ``ShrinkableBackend`` (``group.py``) that
  declares ``supports_shrinking`` and whose ``shrink`` returns the survivors'
  ``TorchProcessGroup`` (``backends.shrink``: derived from the parent's engine, no store);
  for another device it raises as torch does for a group with no backend there;
* ``_create_shrunk_process_group`` is wrapped once (``install``): a ``TorchProcessGroup``
  coming back from ``shrink`` is named and described as torch names and describes its own
  and used as the new group; anything else goes to torch's. Everything else — argument
  checks, the parent's destruction, the default group's replacement, the registries — is
  torch's own code. torch's version clones the parent's store there (a new connection to
  it); the plugin's group needs none, so the shrink works when the rank hosting it died.
"""

from __future__ import annotations

from typing import Any

import torch.distributed.distributed_c10d as c10d

from .group import TorchProcessGroup


def install() -> None:
    """Wrap torch's ``_create_shrunk_process_group`` (once; a torch without it is left alone)."""
    original = getattr(c10d, "_create_shrunk_process_group", None)
    if original is None or getattr(original, "installed_by_pyc10d", False):
        return

    def create(new_backend: Any, remaining_ranks: list[int], metadata: dict, is_default_group: bool) -> Any:
        if not isinstance(new_backend, TorchProcessGroup):
            return original(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend.setGroupName(metadata["new_group_name"])
        shrunk = "default:shrunken" if is_default_group else f"{metadata['original_group_name']}:shrunk"
        new_backend.setGroupDesc(shrunk)
        if metadata.get("bound_device_id") is not None:
            new_backend.bound_device_id = metadata["bound_device_id"]
        return new_backend

    create.installed_by_pyc10d = True  # type: ignore[attr-defined]
    create.__wrapped__ = original  # type: ignore[attr-defined]
    c10d._create_shrunk_process_group = create
