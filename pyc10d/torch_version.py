"""Which torch pyc10d runs on, and what follows from it: asked here and nowhere else.

pyc10d is tested on torch 2.13 and 2.14 (``make venv`` builds 2.13.0, ``make venv
TORCH=2.14.1`` the other, ``make test-torch-next`` runs the suite there); pyproject admits
the next minor too, untested: what the plugin needs of torch is checked by feature
(``PLUGIN_NEEDS``, ``require_plugin``), never by version, and ``pyc10d.info`` says when the
running torch is one the suite never ran on (``untested_note``). What differs for pyc10d:

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

# -- a torch pyc10d was not tested on ---------------------------------------------------------
#: The torch minors pyc10d's suite runs on. The metadata admits the next one too (a new minor
#: rarely drops what pyc10d uses), and what the plugin needs is checked by feature below.
TESTED_MINORS: tuple[tuple[int, int], ...] = ((2, 13), (2, 14))

#: What the plugin needs of torch, by dotted name (from ``torch``), and what for.
#: ``init_process_group("pyc10d")`` and ``import pyc10d.torch_backend`` check these before
#: anything uses them, so a torch that lacks one is refused with its version and the names,
#: not with an ``AttributeError`` from deep inside.
PLUGIN_NEEDS: dict[str, str] = {
    "distributed.Backend.register_backend": "registering pyc10d's backend names",
    "distributed.ProcessGroup": "the group torch is handed (a Python subclass)",
    "distributed.DistBackendError": "the errors torch's callers catch",
    "distributed.FileStore": "meeting through torch's stores",
    "distributed.TCPStore": "meeting through torch's stores",
    "_C._distributed_c10d.Work": "the Work every call returns (a Python subclass)",
    "_C._distributed_c10d.AllreduceOptions": "reading torch's options of all_reduce",
    "_C._distributed_c10d.AllgatherOptions": "reading torch's options of all_gather",
    "_C._distributed_c10d.AllToAllOptions": "reading torch's options of all_to_all",
    "_C._distributed_c10d.BarrierOptions": "reading torch's options of barrier",
    "_C._distributed_c10d.BroadcastOptions": "reading torch's options of broadcast",
    "_C._distributed_c10d.ReduceScatterOptions": "reading torch's options of reduce_scatter",
}


def tested() -> bool:
    """Whether the running torch is a minor pyc10d's suite runs on."""
    major, minor = (int(x) for x in str(torch.__version__).split("+")[0].split(".")[:2])
    return (major, minor) in TESTED_MINORS


def untested_note() -> str:
    """'' on a tested torch; else the line ``pyc10d.info`` and refusals add."""
    if tested():
        return ""
    minors = " and ".join(f"{a}.{b}" for a, b in TESTED_MINORS)
    return f"not tested on torch {torch.__version__} (pyc10d is tested on torch {minors})"


def missing(needs: dict[str, str] = PLUGIN_NEEDS) -> list[str]:
    """The names of ``needs`` the running torch lacks (``torch.``-prefixed)."""
    out = []
    for path in needs:
        obj: object = torch
        for part in path.split("."):
            obj = getattr(obj, part, _ABSENT)
            if obj is _ABSENT:
                out.append(f"torch.{path}")
                break
    return out


_ABSENT = object()


def plugin_refusal(what: str) -> str | None:
    """None when this torch has everything the plugin needs; else why ``what`` cannot run:
    the torch version and each missing name with what it is for."""
    lacking = missing()
    if not lacking:
        return None
    uses = "; ".join(f"{name} ({PLUGIN_NEEDS[name.removeprefix('torch.')]})" for name in lacking)
    note = untested_note()
    return (f"pyc10d cannot {what} on torch {torch.__version__}: torch lacks {uses}"
            + (f"; {note}" if note else "") + ". Use another backend (gloo) on this torch, or a torch pyc10d supports")


def require_plugin(what: str) -> None:
    """Raise ``RuntimeError`` (torch's ``DistBackendError`` where it exists) when this torch
    lacks what the plugin needs (``plugin_refusal``)."""
    why = plugin_refusal(what)
    if why is not None:
        error = getattr(getattr(torch, "distributed", None), "DistBackendError", RuntimeError)
        raise error(why)
