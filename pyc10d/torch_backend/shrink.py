"""``torch.distributed.shrink_group`` on the plugin's groups.

torch shrinks a group in three steps: it asks the group for its device backend
(``pg._get_backend(device)``), checks ``supports_shrinking`` and calls
``shrink(sorted_excluded, flags, opts)``; then it destroys the parent and wraps what
``shrink`` returned into a new ``ProcessGroup`` (``_create_shrunk_process_group``: a plain
C++ group, ``_register_backend(device, GLOO, new_backend)``), which becomes the default group
when the default one was shrunk. The plugin's group is a Python ``ProcessGroup`` with no
registered backend, and torch 2.13's ``Backend`` cannot be subclassed in Python (it binds no
constructor), so:

* ``TorchProcessGroup._get_backend`` answers, for the CPU, a ``ShrinkableBackend`` that
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

import torch
import torch.distributed.distributed_c10d as c10d

from .group import TorchProcessGroup


class ShrinkableBackend:
    """What torch's ``shrink_group`` talks to for a plugin group: the flags torch reads on
    a device backend (only shrinking is offered), and ``shrink``."""

    supports_shrinking = True
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def __init__(self, pg: TorchProcessGroup) -> None:
        self._pg = pg

    def supports_tensor_alloc(self, device: Any) -> bool:
        return False

    def rank(self) -> int:
        return self._pg.rank()

    def size(self) -> int:
        return self._pg.size()

    def name(self) -> str:
        return self._pg.getBackendName()

    def shrink(self, ranks_to_exclude: list[int], shrink_flags: int = 0, opts_override: Any = None) -> TorchProcessGroup:
        engine = self._pg.engine.shrink(list(ranks_to_exclude), shrink_flags, opts_override)
        return TorchProcessGroup(engine, engine.rank(), engine.size(), self._pg.getBackendName())


def backend_for(pg: TorchProcessGroup, device: Any) -> ShrinkableBackend:
    """``pg._get_backend(device)``: the shrink interface for the CPU (or no device)."""
    kind = "cpu" if device is None else torch.device(device).type
    if kind != "cpu":
        raise RuntimeError(f"Could not retrieve or create the backend for device type {kind}: "
                           f"pyc10d's group {pg.getGroupName()!r} runs on CPU tensors")
    return ShrinkableBackend(pg)


def install() -> None:
    """Wrap torch's ``_create_shrunk_process_group`` (once; a torch without it is left alone)."""
    original = getattr(c10d, "_create_shrunk_process_group", None)
    if original is None or getattr(original, "_pyc10d", False):
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

    create._pyc10d = True  # type: ignore[attr-defined]
    create.__wrapped__ = original  # type: ignore[attr-defined]
    c10d._create_shrunk_process_group = create
