"""pyc10d serving torch's backend name ``"gloo"``: for programs and frameworks that hard-code it.

Some frameworks accept no backend name but Gloo's on CPU (Hugging Face accelerate picks
``"gloo"`` for every CPU job and refuses any other), and some programs name it in code their
user cannot change. ``serve_gloo()``, or the setting ``PYC10D_SERVE_GLOO`` (applied by torch's
backend autoload at ``import torch``, ``_pyc10d_autoload``), makes every group torch builds for
the name ``"gloo"`` from then on (``init_process_group("gloo")``, ``new_group(backend="gloo")``,
a framework's own) a pyc10d group on the engine asked for. Nothing else does: importing pyc10d
leaves Gloo alone unless the user asked.

The seam is the one torch's own helper offers: ``_new_process_group_helper`` builds a Gloo
group by calling the module-level name ``ProcessGroupGloo(store, rank, size, timeout=...)`` of
``torch.distributed.distributed_c10d``; that name (and ``torch.distributed.ProcessGroupGloo``)
becomes ``GlooServedGroup``, a ``TorchProcessGroup``. torch keeps the name it was asked for
(``dist.get_backend()`` says ``"gloo"``), so the group itself says who serves it: its repr,
its ``engine``, and ``python -m pyc10d.info``.

What pyc10d cannot serve fails saying so, naming the setting, rather than running on
something the caller did not ask for: a group whose backend string gives a device to another
backend (``"cpu:gloo,cuda:nccl"``, torch's default on a CUDA machine) is refused, because a
Python group serves every device of its group and the NCCL half would be dropped; an argument
the engine refuses carries a note naming the setting.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .. import errors as pe
from ..process_group import make_engine
from ..settings import SERVE_GLOO
from .group import _IDENTITY, BACKENDS, TorchProcessGroup
from .store_adapter import TorchStoreAdapter

#: The setting's name, for messages.
SETTING = SERVE_GLOO.name
#: What the setting (or ``serve_gloo``) accepts -> the pyc10d engine; "1" and the other yes
#: words mean ``auto``, "0" and the other no words mean Gloo stays Gloo.
_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
ENGINES = ("auto", "shm", "tcp")
#: engine -> the torch backend name of pyc10d's that builds it (the group's label).
_LABEL = {engine: name for name, engine in BACKENDS.items()}

_REAL_GLOO: Any = getattr(c10d, "ProcessGroupGloo", None)
_served: str | None = None


def engine_from(value: str | None) -> str | None:
    """The engine a value of the setting asks for (None: not served); raises ``ValueError``
    naming the setting for any other value."""
    if value is None or not value.strip() or value.strip().lower() in _NO:
        return None
    v = value.strip().lower()
    if v in _YES:
        return "auto"
    if v in ENGINES:
        return v
    raise ValueError(f"{SETTING}={value!r}: expected 1 (pyc10d's auto engine), shm, tcp, or 0")


def _note(error: BaseException) -> BaseException:
    if isinstance(error, (pe.DistInputError, NotImplementedError)):
        error.add_note(f"(torch's backend name 'gloo' is served by pyc10d ({SETTING} or "
                       "pyc10d.torch_backend.serve_gloo()); unset it for torch's own Gloo)")
    return error


def _noting(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - re-raised, with a note
            raise _note(e) from e.__cause__

    return call


def _helper_frame(frame: Any) -> Any:
    """The frame of torch's ``_new_process_group_helper`` above the constructor: torch 2.13
    calls ``ProcessGroupGloo`` there, 2.14 from a creator it calls (None if not found)."""
    for _ in range(4):
        frame = frame.f_back if frame is not None else None
        if frame is not None and "backend_config" in frame.f_locals:
            return frame
    return None


def _mixed_device_map(helper: Any) -> dict[str, str] | None:
    """The device -> backend map of the group torch is building, when it gives a device to
    another backend than gloo (None otherwise, or where torch's helper holds no such map)."""
    config = helper.f_locals.get("backend_config") if helper is not None else None
    mapping = getattr(config, "device_backend_map", None)
    if not isinstance(mapping, dict):
        return None
    return mapping if any(str(b) != dist.Backend.GLOO for b in mapping.values()) else None


class _Options:
    """The two fields torch's helper writes into a Gloo group's ``options`` after building it."""

    def __init__(self, timeout: timedelta) -> None:
        self._timeout = timeout
        self.global_ranks_in_group: list[int] = []
        self.group_name = ""


class GlooServedGroup(TorchProcessGroup):
    """A pyc10d group built where torch builds ``ProcessGroupGloo(store, rank, size, timeout)``.

    Class-level helpers that code reaches through the Gloo class (``create_device``,
    ``_Options``) stay Gloo's. ``engine_name`` is the engine ``serve_gloo`` chose.
    """

    engine_name = "auto"
    if _REAL_GLOO is not None:
        create_device = staticmethod(_REAL_GLOO.create_device)
        create_default_device = staticmethod(_REAL_GLOO.create_default_device)
        _Options = _REAL_GLOO._Options
        Options = _REAL_GLOO._Options

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta = timedelta(minutes=30),
                 enable_reconfigure: bool = False) -> None:
        """(``enable_reconfigure``: torch 2.14 passes it; every pyc10d group can be re-formed.)"""
        helper = _helper_frame(sys._getframe())
        mixed = _mixed_device_map(helper)
        if mixed is not None:
            spec = ",".join(f"{d}:{b}" for d, b in mixed.items())
            raise RuntimeError(
                f"torch's backend name 'gloo' is served by pyc10d ({SETTING} or serve_gloo()), which "
                f"cannot serve the group {spec!r}: a pyc10d group serves every device of its group, so "
                "the other backend would be dropped. Name one backend (\"gloo\", or pyc10d's own name), "
                f"or unset {SETTING} for torch's Gloo")
        name = str(helper.f_locals.get("group_name") or "") if helper is not None else ""
        name = name or "gloo"
        engine = make_engine(self.engine_name, TorchStoreAdapter(store, timeout), rank, size, timeout, name)
        super().__init__(engine, rank, size, _LABEL[self.engine_name], store)
        self.options = _Options(timeout)

    def _set_sequence_number_for_group(self) -> None:
        """torch sets Gloo's sequence number here; pyc10d's engines count their own."""

    def __repr__(self) -> str:
        return (f"<pyc10d TorchProcessGroup serving 'gloo' ({SETTING}): {self._backend_label} "
                f"({self._engine.backend_name}) rank={self.rank()} size={self.size()}>")


def _noting_methods(cls: type) -> None:
    """Every operation ``cls`` inherits from ``TorchProcessGroup`` notes the setting on a refusal."""
    for name, fn in list(vars(TorchProcessGroup).items()):
        if callable(fn) and not name.startswith("__") and name not in _IDENTITY and name not in vars(cls):
            setattr(cls, name, _noting(fn))


_noting_methods(GlooServedGroup)


def serve_gloo(engine: str = "auto") -> None:
    """Make every group torch builds for the name ``"gloo"`` from now on a pyc10d group on
    ``engine`` (``auto``, ``shm`` or ``tcp``). Groups already built stay what they are: a
    default group already on Gloo is named in a warning. Calling it again changes the engine."""
    global _served
    if engine not in ENGINES:
        raise ValueError(f"serve_gloo({engine!r}): expected one of {', '.join(ENGINES)}")
    if _REAL_GLOO is None:
        raise RuntimeError("serve_gloo(): this torch has no Gloo to stand in for "
                           "(torch.distributed.distributed_c10d has no ProcessGroupGloo)")
    if _served is None and dist.is_initialized():
        default = c10d._get_default_group()
        if not isinstance(default, GlooServedGroup) and dist.get_backend(default) == dist.Backend.GLOO:
            warnings.warn("pyc10d serves the name 'gloo' from now on, but the default group was built "
                          "before and stays torch's Gloo", RuntimeWarning, stacklevel=2)
    GlooServedGroup.engine_name = engine
    c10d.ProcessGroupGloo = GlooServedGroup
    dist.ProcessGroupGloo = GlooServedGroup
    _served = engine


def stop_serving_gloo() -> None:
    """torch's own Gloo serves the name ``"gloo"`` again, for groups built from now on."""
    global _served
    if _REAL_GLOO is not None:
        c10d.ProcessGroupGloo = _REAL_GLOO
        dist.ProcessGroupGloo = _REAL_GLOO
    _served = None


def gloo_served_by() -> str | None:
    """The pyc10d engine that serves the name ``"gloo"`` now, or None (torch's Gloo)."""
    return _served if c10d.ProcessGroupGloo is GlooServedGroup else None


def autoload_off() -> bool:
    """Whether torch's backend autoload, where ``PYC10D_SERVE_GLOO`` acts, is switched off."""
    return os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0"


def apply_setting() -> str | None:
    """Serve the name as ``PYC10D_SERVE_GLOO`` asks (torch's autoload calls this at ``import
    torch`` when it is set); the engine, or None when the setting asks for nothing."""
    engine = engine_from(SERVE_GLOO.raw())
    if engine is not None:
        serve_gloo(engine)
    return engine


def warn_if_not_acting() -> None:
    """A warning when ``PYC10D_SERVE_GLOO`` asks for pyc10d but nothing applied it (torch's
    autoload switched off): the user's program would otherwise run on Gloo without a word."""
    try:
        engine = engine_from(SERVE_GLOO.raw())
    except ValueError as e:
        warnings.warn(str(e), RuntimeWarning, stacklevel=3)
        return
    if engine is not None and gloo_served_by() is None:
        why = ("torch's backend autoload is off (TORCH_DEVICE_BACKEND_AUTOLOAD=0)" if autoload_off()
               else "pyc10d's autoload entry point did not run")
        warnings.warn(f"{SETTING}={SERVE_GLOO.raw()} is set but does not act: {why}, and the setting acts "
                      "there, at `import torch`; the name 'gloo' stays torch's Gloo. Call "
                      "pyc10d.torch_backend.serve_gloo() before building groups, or turn the autoload on",
                      RuntimeWarning, stacklevel=3)


__all__ = ["ENGINES", "GlooServedGroup", "apply_setting", "engine_from", "gloo_served_by", "serve_gloo",
           "stop_serving_gloo", "warn_if_not_acting"]
