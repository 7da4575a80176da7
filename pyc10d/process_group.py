"""``ProcessGroup``: a group of ranks, and the low-level methods torch code calls on it.

A ProcessGroup pairs group metadata (name, tag, global ranks) with a backend that moves
the bytes. Low-level calls (``pg.allreduce([t], opts)``, ``pg.broadcast(x, root=0)`` ...) go
straight to the backend; the public API in ``collectives.py`` adds argument translation.
``Backend`` here is torch's registry of backend names (``Backend.register_backend``), not
the engine class in ``pyc10d.backends``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from .backends import Options
from .backends import reconfigure as reconf
from .backends.fake import FakeBackend
from .backends.hier import create_auto, create_hier
from .backends.lane import LaneOps
from .backends.lifetime import freeze_heap_once, release_on_drop
from .backends.options import DeviceSpec, create_device
from .backends.shm import ShmBackend
from .backends.tcp import TCPBackend
from .backends.threaded import ThreadedBackend
from .backends.work import CompletedWork, Work
from .store import attempt
from .store.base import Store
from .types import DEFAULT_TIMEOUT


class Backend(str):
    """Backend names, as ``torch.distributed.Backend``: ``Backend("GLOO") == "gloo"``."""

    UNDEFINED = "undefined"
    TCP = "tcp"
    GLOO = "gloo"
    SHM = "shm"
    THREADED = "threaded"
    FAKE = "fake"
    NCCL = "nccl"
    MPI = "mpi"
    _plugins: dict[str, Callable[..., Any]] = {}
    backend_list = ["undefined", "tcp", "gloo"]
    default_device_backend_map = {"cpu": "auto", "cuda": "auto"}
    _aliases = {"gloo": "tcp"}

    def __new__(cls, name: str) -> Backend:
        if not isinstance(name, str):
            raise ValueError(f"Backend name must be a string, but got: {name}")
        value = name.lower()
        if value not in cls.backend_list and value not in cls._plugins:
            raise ValueError(f"Invalid backend: '{name}'; known: {sorted(set(cls.backend_list) | set(cls._plugins))}")
        return super().__new__(cls, value)

    @classmethod
    def register_backend(
        cls, name: str, func: Callable[..., Any], extended_api: bool = False, devices: Any = None
    ) -> None:
        """``func(store, rank, world_size, timeout)`` (or ``func(prefix_store, group_rank, group_size, options)``
        with ``extended_api``) returns a ProcessGroup or a backend engine."""
        key = name.lower()
        cls._plugins[key] = func
        setattr(cls, name.upper(), key)
        if key not in cls.backend_list:
            cls.backend_list.append(key)

    @classmethod
    def resolve(cls, name: str | None) -> str:
        value = "auto" if name in (None, "", "undefined") else str(name).lower()
        if ":" in value:  # "cpu:gloo,cuda:nccl"
            parts = dict(p.split(":", 1) for p in value.split(","))
            value = parts.get("cpu", next(iter(parts.values())))
        return cls._aliases.get(value, value)


_FACTORIES: dict[str, Callable[[Store, int, int, timedelta, str], Any]] = {"tcp": TCPBackend.create}


def register_factory(name: str, factory: Callable[[Store, int, int, timedelta, str], Any]) -> None:
    """Let a built-in backend (shm, threaded, fake) plug in without touching the public API."""
    _FACTORIES[name] = factory
    if name not in Backend.backend_list:
        Backend.backend_list.append(name)


register_factory("threaded", ThreadedBackend.create)
register_factory("fake", FakeBackend.create)
register_factory("shm", ShmBackend.create)
register_factory("hier", create_hier)  # shm within each host, tcp between hosts' leaders
register_factory("auto", create_auto)  # the default: shm on one host, hier across hosts, else tcp

#: The engines whose ranks meet through keys of the group's store: each forming of such a
#: group meets under a scope of its own, never reading what an earlier one left there (a
#: restarted torchrun attempt gets the failed attempt's store back, keys and all).
_MEET_IN_STORE = frozenset({"tcp", "shm", "hier", "auto"})


#: One-sided windows (``window/``, which registers itself here when imported): whether an
#: engine's group makes them, and the maker. Until then no group does.
_windows: tuple[Callable[[Any], bool], Callable[[Any, Any, str], Any]] | None = None


def serve_windows(supports: Callable[[Any], bool], make: Callable[[Any, Any, str], Any]) -> None:
    """Let the window room answer ``ProcessGroup.supports_window`` / ``new_window``."""
    global _windows
    _windows = (supports, make)


def make_engine(backend: str, store: Store, rank: int, size: int, timeout: timedelta, name: str) -> Any:
    """The engine of a new group (every API makes its groups' engines here)."""
    key = Backend.resolve(backend)
    freeze_heap_once()
    if key in _MEET_IN_STORE:  # under a prefix of this forming's own (``store.attempt``)
        store = attempt.scope(store, rank, size, timeout, name)
    if key in _FACTORIES:
        return _FACTORIES[key](store, rank, size, timeout, name)
    if key in Backend._plugins:
        return Backend._plugins[key](store, rank, size, timeout)
    raise ValueError(f"unknown backend {backend!r}; available: {sorted(set(_FACTORIES) | set(Backend._plugins))}")


class ProcessGroup:
    """A group of ranks. ``rank()``/``size()`` are group-local; calls not defined here go to the backend."""

    def __init__(
        self, *args: Any, engine: Any = None, group_name: str = "", ranks: list[int] | None = None,
        backend_name: str = "custom",
    ) -> None:
        """``ProcessGroup(rank, size)`` or ``(store, rank, size)`` as torch; pyc10d passes ``engine=``."""
        rank, size = int(args[-2]), int(args[-1])
        self._engine = engine
        # The engine when it has the lean lane's entries (``backends.lane``), for the public API.
        self._lane = engine if isinstance(engine, LaneOps) else None
        self._rank = rank
        self._size = size
        self._group_name = group_name
        self.group_desc = "undefined"
        self.global_ranks = list(ranks) if ranks is not None else list(range(size))
        self._backend_name = backend_name
        self.bound_device_id = None
        self._store: Store | None = None  # the group's store (PrefixStore), set by its maker
        # What ``reconfigure`` builds the next engine as: the name asked for ("auto" stays auto).
        self.requested_backend = backend_name
        self._handle: str | None = None
        if engine is not None:  # a group nobody holds any more shuts down (``release_on_drop``)
            release_on_drop(self, engine)

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def name(self) -> str:
        return self._backend_name

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def options(self) -> Options:
        return self._engine.options

    def _get_backend(self, device: Any = None) -> Any:
        return self._engine

    def get_backend(self, device: Any) -> Any:
        """The engine that serves ``device`` (torch 2.14's name): the one engine, for any."""
        return self._engine

    def _get_backend_name(self) -> str:
        return self._backend_name

    def _set_default_timeout(self, timeout: timedelta) -> None:
        self._engine._set_default_timeout(timeout)

    def set_timeout(self, timeout: timedelta) -> None:
        """The timeout of this group's operations issued from now on."""
        self._set_default_timeout(timeout)

    def get_group_store(self) -> Store:
        if self._store is None:
            raise RuntimeError(f"{self!r} was made without a store")
        return self._store

    def set_group_store(self, store: Store) -> None:
        """Give the group its store (``get_group_store``): the API that makes a group sets it."""
        self._store = store

    def _set_group_desc(self, desc: str) -> None:
        self.group_desc = desc

    # torch 2.13's names of the single-tensor operations (its own collectives call these).
    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        return self._allgather_base(output, input, opts)

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output: Any, input: Any, output_split_sizes: Any, input_split_sizes: Any,
                          opts: Any = None) -> Any:
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def _get_sequence_number_for_group(self) -> int:
        return self._engine._get_sequence_number_for_group()

    def _set_sequence_number_for_group(self) -> None:
        pass

    def shutdown(self) -> None:
        self._engine.shutdown()

    def abort(self) -> None:
        self._engine.abort()

    # -- one-sided windows (torch 2.14's dist._new_window; ``window/``) ------------------------
    @property
    def supports_window(self) -> bool:
        return _windows is not None and _windows[0](self._engine)

    def new_window(self, tensor: torch.Tensor | None = None) -> Any:
        """A one-sided window on this group (collective), ``tensor`` registered if given."""
        if _windows is None:
            raise RuntimeError(f"Backend {self._backend_name} does not support new_window")
        return _windows[1](self._engine, tensor, self._backend_name)

    # -- reconfigure (torch 2.14's dist._reconfigure; ``reconfigure.py``) --------------------
    supports_reconfigure = True

    def get_reconfigure_handle(self) -> str:
        """This process's handle, the same until the group is re-formed."""
        if self._handle is None:
            self._handle = reconf.new_handle(self._store)
        return self._handle

    def reconfigure(self, opts: Any) -> Work:
        """Re-form the group in place with the peers of ``opts.handles`` (a list: ranks by
        position; a set: sorted), meeting under ``opts.uuid``; the old engine is aborted."""
        engine, rank, size, store = reconf.reform(self, self._engine, make_engine, self.requested_backend, opts,
                                                  self.get_reconfigure_handle(), self._group_name, self._store)
        self._engine, self._lane = engine, engine if isinstance(engine, LaneOps) else None
        self._rank, self._size, self.global_ranks = rank, size, list(range(size))
        self._store, self._handle = store, None
        return CompletedWork("reconfigure", [])

    def __getattr__(self, name: str) -> Any:
        engine = self.__dict__.get("_engine")
        if name.startswith("__") or engine is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(engine, name)

    def __repr__(self) -> str:
        return f"<ProcessGroup {self._group_name!r} rank={self._rank} size={self._size} backend={self._backend_name}>"


class ProcessGroupGloo(ProcessGroup):
    """torch's ``ProcessGroupGloo(store, rank, size, options)``, served by the TCP backend."""

    _Options = Options
    _counter = itertools.count()

    def __init__(self, store: Store, rank: int, size: int, options: Options | timedelta | None = None,
                 enable_reconfigure: bool = False) -> None:
        """(``enable_reconfigure``: torch 2.14's; every pyc10d group can be re-formed.)"""
        if isinstance(options, timedelta) or options is None:
            options = Options(options if options is not None else DEFAULT_TIMEOUT)
        name = f"gloo_pg_{next(ProcessGroupGloo._counter)}"
        # the engine "gloo" stands for: tcp, unless ``Backend._aliases`` says otherwise
        engine = _FACTORIES[Backend.resolve("gloo")](store, rank, size, options._timeout, name)
        engine.options = Options.of(options)
        super().__init__(rank, size, engine=engine, group_name=name, backend_name="gloo")
        self._store = store

    create_device = staticmethod(create_device)

    @staticmethod
    def create_default_device(lazy_init: Any = None) -> DeviceSpec:
        return DeviceSpec()


class RoundRobinProcessGroup(ProcessGroup):
    """Spreads successive operations over several groups of the same ranks."""

    def __init__(self, groups: list[ProcessGroup]) -> None:
        if not groups:
            raise ValueError("_round_robin_process_groups: needs at least one process group")
        first = groups[0]
        for g in groups:
            if g.size() != first.size() or g.rank() != first.rank():
                raise ValueError("_round_robin_process_groups: groups must have the same size and rank")
        self._groups = groups
        self._cycle = itertools.cycle(groups)
        super().__init__(
            first.rank(), first.size(), group_name="round_robin", ranks=first.global_ranks, backend_name="round_robin"
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(next(self.__dict__["_cycle"]), name)

    @property
    def options(self) -> Options:
        return self._groups[0].options

    def _get_backend(self, device: Any = None) -> Any:
        return self._groups[0]._get_backend(device)

    def _get_sequence_number_for_group(self) -> int:
        return sum(g._get_sequence_number_for_group() for g in self._groups)

    def shutdown(self) -> None:
        for g in self._groups:
            g.shutdown()


def _round_robin_process_groups(groups: list[ProcessGroup]) -> ProcessGroup:
    return RoundRobinProcessGroup(groups)


__all__ = [
    "Backend", "ProcessGroup", "ProcessGroupGloo", "RoundRobinProcessGroup",
    "_round_robin_process_groups", "make_engine", "register_factory", "torch",
]
