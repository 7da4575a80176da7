"""What ``pg._get_backend(cpu)`` answers on the plugin's group: torch's ``Backend`` interface.

A torch group built from a C++ backend (Gloo's) hands its ``Backend`` to code that asks for
the device backend: ``shrink_group`` (``shrink.py``), 2.14's ``dist.get_backend_impl``, and
code that registers abort hooks or reads the ``supports_*`` flags. The plugin's group is a
Python ``ProcessGroup`` with no C++ backend (``group.py``), so it answers a ``PluginBackend``:
an object with every method and property of the running torch's ``Backend``, each either
served by the group and its pyc10d engine or refused with torch's ``RuntimeError`` naming the
method, the group and the rank, as torch's C++ base refuses what a backend does not support
("Backend gloo does not support ..."). The engine's own methods (``failure``, ...) are reached
through it too, for backend-specific calls. A name torch's ``Backend`` lacks on the running
torch (``register_abort_hook`` on 2.13) is not answered either: it fails as it fails on Gloo.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
from torch._C import _distributed_c10d as _c10d

from .. import errors as pe
from .hooks import plain_of

#: Every public and private name of the running torch's ``Backend`` class.
TORCH_BACKEND_NAMES: frozenset[str] = frozenset(
    n for n in dir(_c10d.Backend) if not n.startswith("__") and n != "_pybind11_conduit_v1_")

#: Names the engine has that only some torch's ``Backend`` has: hidden where torch lacks them.
_VERSIONED = frozenset({"register_abort_hook", "unregister_abort_hook"})

#: The group's collectives, by torch's ``Backend`` name -> the group's method that serves it.
#: They run the group's plain methods, past its collective hooks: torch fires those at the
#: ``ProcessGroup``, and a call made on the backend itself does not pass there.
_COLLECTIVES: dict[str, str] = {
    name: name for name in (
        "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "_allgather_base",
        "all_gather_single", "all_gather_single_coalesced", "allgather_coalesced", "reduce_scatter",
        "_reduce_scatter_base", "reduce_scatter_single", "reduce_scatter_single_coalesced", "alltoall",
        "alltoall_base", "all_to_all_single", "gather", "gather_single", "scatter", "send", "recv",
        "recv_anysource", "barrier")
} | {"gather_into_tensor": "gather_single", "allreduce_sparse": "allreduce"}

#: torch's ``Backend`` names the plugin does not offer, and why (the refusal says it).
_UNSUPPORTED: dict[str, str] = {
    "allocate_tensor": "it allocates no communication memory (supports_tensor_alloc is False)",
    "mem_allocator": "it allocates no communication memory (supports_tensor_alloc is False)",
    "memory_stats": "it allocates no communication memory",
    "split": "it does not split (supports_splitting is False); use new_group or split_group",
    "merge": "it does not merge groups",
    "suspend": "it does not suspend its connections",
    "resume": "it does not suspend its connections",
    "setUsePgForSymmMemRendezvous": "symmetric memory meets through the store on pyc10d",
    "eager_connect_single_device": "it connects when the group is made (supports_splitting is False)",
    "_start_coalescing": "it does not coalesce (supports_coalescing is False)",
    "_end_coalescing": "it does not coalesce (supports_coalescing is False)",
    "_add_ephemeral_timeout": "it has no ephemeral timeouts; use set_timeout",
    "_enable_collectives_timing": "it does not time collectives",
    "_register_on_completion_hook": "it runs no completion hooks; use the group's post hooks",
    "_wait_for_pending_works": "it runs no completion hooks to wait for",
    "_set_group_uid": "the group's name is set when torch makes it",
}


#: torch's ``Backend`` properties among them (read, not called).
_PROPERTIES = frozenset({"mem_allocator"})


class PluginBackend:
    """torch's ``Backend`` interface over one plugin group (see the module docstring)."""

    supports_shrinking = True
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    bound_device_id = None
    #: torch's options class, as on every backend (pyc10d's engine reads its own).
    Options = _c10d.Backend.Options

    def __init__(self, pg: Any) -> None:
        self._pg = pg

    # -- identity ---------------------------------------------------------------------------
    def rank(self) -> int:
        return self._pg.rank()

    def size(self) -> int:
        return self._pg.size()

    def name(self) -> str:
        return self._pg.getBackendName()

    _get_backend_name = name

    def supports_tensor_alloc(self, device: Any) -> bool:
        return False

    # -- lifetime and state -----------------------------------------------------------------
    def abort(self) -> None:
        self._pg.abort()

    def shutdown(self) -> None:
        self._pg.shutdown()

    def set_timeout(self, timeout: timedelta) -> None:
        self._pg.set_timeout(timeout)

    def _set_default_timeout(self, timeout: timedelta) -> None:
        self._pg._set_default_timeout(timeout)

    def get_error(self) -> Any:
        """torch's ``ErrorType`` of the error that aborted the group (SUCCESS while healthy)."""
        error = self._pg.engine.failure()
        kinds = _c10d.ErrorType
        if error is None:
            return kinds.SUCCESS
        if isinstance(error, pe.DistTimeoutError):
            return kinds.TIMEOUT
        return kinds.REMOTE_ERROR if isinstance(error, pe.DistNetworkError) else kinds.COMM_ERROR

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        self._pg.monitored_barrier(timeout, wait_all_ranks)

    # -- the group's own extensions ---------------------------------------------------------
    @property
    def supports_reconfigure(self) -> bool:
        return self._pg.supports_reconfigure

    def get_reconfigure_handle(self) -> str:
        return self._pg.get_reconfigure_handle()

    def reconfigure(self, opts: Any) -> Any:
        return self._pg.reconfigure(opts)

    @property
    def supports_window(self) -> bool:
        return self._pg.supports_window

    def new_window(self, tensor: torch.Tensor | None = None) -> Any:
        return self._pg.new_window(tensor)

    def shrink(self, ranks_to_exclude: list[int], shrink_flags: int = 0, opts_override: Any = None) -> Any:
        return self._pg.shrunk(self._pg.engine.shrink(list(ranks_to_exclude), shrink_flags, opts_override))

    # -- everything else --------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name == "_pg":  # (not set yet: no group to ask)
            raise AttributeError(name)
        if name in _COLLECTIVES:
            return _collective(self._pg, _COLLECTIVES[name])
        if name in _VERSIONED and name not in TORCH_BACKEND_NAMES:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}' "
                                 f"(torch {torch.__version__}'s Backend has none)")
        if name in TORCH_BACKEND_NAMES and (name in _UNSUPPORTED or not hasattr(self._pg.engine, name)):
            if name in _PROPERTIES:  # (torch's property raises when read)
                raise RuntimeError(self._refusal(name))
            return self._refuser(name)
        return getattr(self._pg.engine, name)

    def _refuser(self, name: str) -> Any:
        """A stand-in for torch's method ``name`` that refuses when called, so that
        ``hasattr`` answers as on any backend and the call says why it cannot run."""

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(self._refusal(name))

        refuse.__name__ = name
        return refuse

    def _refusal(self, name: str) -> str:
        why = _UNSUPPORTED.get(name, "pyc10d's engine has no such call")
        return (f"Backend {self.name()} does not support {name}: {why} "
                f"(pyc10d, group {self._pg.getGroupName()!r}, rank {self.rank()})")

    def __repr__(self) -> str:
        return f"<pyc10d PluginBackend of {self._pg!r}>"


def _collective(pg: Any, method: str) -> Any:
    """The group's ``method`` as its plain class runs it (no collective hooks), bound to ``pg``."""
    return getattr(plain_of(pg), method).__get__(pg)


#: The name this class had when it only served ``shrink_group``.
ShrinkableBackend = PluginBackend


def backend_for(pg: Any, device: Any) -> PluginBackend:
    """``pg._get_backend(device)``: the backend for the CPU (or no device)."""
    kind = "cpu" if device is None else torch.device(device).type
    if kind != "cpu":
        raise RuntimeError(f"Could not retrieve or create the backend for device type {kind}: "
                           f"pyc10d's group {pg.getGroupName()!r} runs on CPU tensors")
    return PluginBackend(pg)
