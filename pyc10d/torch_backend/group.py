"""The torch ``ProcessGroup`` that torch.distributed gets from the plugin, and its ``Work``.

``TorchProcessGroup`` subclasses ``torch.distributed.ProcessGroup``: torch's Python API calls
its methods directly (``dist.all_reduce`` → ``pg.allreduce``), and torch's C++ code (DDP's
reducer, ``_broadcast_coalesced``, functional collectives) reaches them through torch's pybind
trampoline, which looks up Python overrides by name. Every method translates torch's options
(``options.py``) and hands the call to the pyc10d engine's method of the same name: the engine
moves the bytes, no torch backend is involved.

torch 2.13 calls some collectives by new names (``all_gather_single``, ``reduce_scatter_single``,
``all_to_all_single``, ``*_single_coalesced``); older torch and code written for it use the old
ones (``_allgather_base``, ``_reduce_scatter_base``, ``alltoall_base``,
``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``). Both are served.
"""

from __future__ import annotations

import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist
from torch._C import _distributed_c10d as _c10d
from torch._C._distributed_c10d import AllgatherOptions as _AllgatherOptions
from torch._C._distributed_c10d import AllreduceOptions as _AllreduceOptions
from torch._C._distributed_c10d import AllToAllOptions as _AllToAllOptions
from torch._C._distributed_c10d import BarrierOptions as _BarrierOptions
from torch._C._distributed_c10d import BroadcastOptions as _BroadcastOptions
from torch._C._distributed_c10d import ReduceScatterOptions as _ReduceScatterOptions
from torch._C._distributed_c10d import Work as _TorchWorkBase

from .. import window as windows
from ..backends import reconfigure as reconf
from ..backends.lane import LaneOps
from ..backends.lifetime import release_on_drop
from ..backends.work import CompletedWork, Work
from ..process_group import make_engine
from ..torch_version import HAS_ABORT_HOOKS, HAS_COLLECTIVE_HOOKS
from . import hooks
from . import options as opt
from .backend import PluginBackend, ShrinkableBackend, backend_for
from .errors import to_torch, torch_future, translating


class TorchWork(_TorchWorkBase):
    """A torch ``Work`` that is a pyc10d ``Work`` underneath.

    A Python subclass rather than ``_create_work_from_future``: a Python caller's ``wait``
    re-raises pyc10d's own exception (its wording: ranks, op, sequence number) as torch's type
    too (``errors.to_torch``), and ``source_rank`` answers for ``recv`` from any source, which
    a future cannot carry. C++ callers get ``wait`` and ``get_future`` through torch's
    trampoline; the future is one C++ sees failed when the operation fails
    (``errors.torch_future``).
    """

    def __init__(self, work: Work) -> None:
        super().__init__()
        self._work = work
        self._future: torch.futures.Future | None = None

    def wait(self, timeout: timedelta | None = None) -> bool:
        try:
            return self._work.wait(timeout)
        except BaseException as e:  # noqa: BLE001 - re-raised as torch's type
            raise to_torch(e) from e.__cause__

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> BaseException | None:
        error = self._work.exception()
        return None if error is None else to_torch(error)

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._work.result()

    def source_rank(self) -> int:
        self.wait()
        return self._work.source_rank()

    _source_rank = source_rank

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        fut = self._future
        if fut is None:  # one per Work: DDP chains its callbacks on the one it got
            fut = self._future = torch_future(self._work)
        return fut

    def __repr__(self) -> str:
        return f"<TorchWork {self._work!r}>"


class _LaneWork(TorchWork):
    """A group's shared finished Work: what ``laned`` answers for every synchronous call of
    the group that the lean lane ran."""

    def __init__(self) -> None:
        super().__init__(_SyncDone())

    def laned(self, done: Any, opname: str, outputs: list[torch.Tensor]) -> TorchWork | None:
        """The Work of a call the lean lane took: ``done`` is its sequence number (a
        synchronous call, run) or the ``StartedWork`` of an asynchronous one; 0 when the lane
        declined (None).

        Every synchronous call of the group answers this same finished ``TorchWork``,
        refilled: torch asks for one only to ``wait`` on it at once and drop it
        (``async_op=False``), and making a torch ``Work`` is a C++ object and two Python ones
        per call (2.1 us of a call hot, a one-process diagnostic; 0.1 refilled), more again
        when the caches are cold. (Threads calling one group at once share it too: each
        ``wait`` is right, ``result`` is the last call's.)"""
        if not done:
            return None
        if done.__class__ is not int:
            return TorchWork(done)
        self._future = None
        self._work.refill(opname, outputs, done)
        return self


class _SyncDone(CompletedWork):
    """The pyc10d side of a group's shared finished Work (``_LaneWork``): its outputs are held
    weakly, so that the Work torch dropped does not keep the last call's tensors alive."""

    def __init__(self) -> None:
        super().__init__("noop", None, -1)
        self._refs: list[weakref.ref] = []

    def refill(self, opname: str, outputs: list[torch.Tensor], seq: int) -> None:
        self.opname, self.seq, self._future = opname, seq, None
        self._refs = list(map(weakref.ref, outputs))

    @property
    def outputs(self) -> list[torch.Tensor]:  # type: ignore[override] - read by result and the future
        return [t for t in (r() for r in self._refs) if t is not None]

    @outputs.setter
    def outputs(self, value: Any) -> None:
        pass  # (CompletedWork's __init__ sets it; the weak references stand for it)


def _list(tensors: Any) -> list[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _translating_methods(cls: type) -> type:
    """Every operation of ``cls`` raises torch's error types (``errors.translating``)."""
    for name, fn in list(vars(cls).items()):
        if callable(fn) and not name.startswith("__") and name not in _IDENTITY:
            setattr(cls, name, translating(fn))
    return cls


#: torch backend name -> the pyc10d engine it builds.
BACKENDS: dict[str, str] = {"pyc10d": "auto", "pyc10d_shm": "shm", "pyc10d_tcp": "tcp"}

#: Methods that answer questions and never fail: left unwrapped.
_IDENTITY = frozenset({"getBackendName", "name", "getGroupName", "setGroupName", "getGroupDesc",
                       "setGroupDesc", "engine", "rank", "size", "getRank", "getSize"})


@_translating_methods
class TorchProcessGroup(tdist.ProcessGroup):
    """A torch process group whose collectives run on a pyc10d engine (shm or tcp); its
    failures are torch's types (``errors``)."""

    def __init__(self, engine: Any, rank: int, size: int, backend_name: str, store: Any = None) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size  # (``reconfigure`` changes them)
        self.meeting_store = store  # what the group met through: a reconfigure handle names it
        self._handle: str | None = None
        self._engine = engine
        # The engine when it has the lean lane's entries (``backends.lane``): a synchronous
        # call it serves runs there, and its Work is made finished.
        self._lane = engine if isinstance(engine, LaneOps) else None
        self._backend_label = backend_name
        self._group_name = engine.group_name
        self._group_desc = "undefined"
        # Every synchronous lane call's Work (``_LaneWork.laned``), for a group with a lane.
        self._done = _LaneWork() if self._lane is not None else None
        # Dropped by its last holder (torchft drops a failed group by reference), the group
        # shuts down as a Gloo group does in its destructor (``release_on_drop``).
        release_on_drop(self, engine)

    #: The group's collective hooks (``hooks.py``), made on its first registration.
    collective_hooks: hooks.CollectiveHooks | None = None

    @property
    def engine(self) -> Any:
        """The pyc10d engine (``ShmBackend`` / ``TCPBackend``) doing the work."""
        return self._engine

    # -- hooks: torch 2.14's, on the torches that have them (Gloo has none on 2.13) ---------
    if HAS_COLLECTIVE_HOOKS:
        register_pre_hook = hooks.register_pre_hook
        unregister_pre_hook = hooks.unregister_pre_hook
        register_post_hook = hooks.register_post_hook
        unregister_post_hook = hooks.unregister_post_hook

    if HAS_ABORT_HOOKS:
        def register_abort_hook(self, hook_id: int, hook: Any) -> None:
            """torch's ``ProcessGroup.register_abort_hook``: ``hook()`` once, when the group
            aborts (``abort()``, or a failed operation such as a lost peer)."""
            self._engine.register_abort_hook(hook_id, hook)

        def unregister_abort_hook(self, hook_id: int) -> None:
            self._engine.unregister_abort_hook(hook_id)

    # -- identity (torch asks for these through the trampoline) -----------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return self._backend_label

    def name(self) -> str:
        return self._backend_label

    # torch stores a group's name and description in its backends; a Python group has none,
    # so torch's trampoline asks these overrides instead (DeviceMesh and DTensor need the name).
    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - torch's name
        self._group_desc = desc

    def __repr__(self) -> str:
        return (f"<pyc10d TorchProcessGroup {self._backend_label} ({self._engine.backend_name}) "
                f"rank={self.rank()} size={self.size()}>")

    # -- all_reduce family ------------------------------------------------------------------
    def allreduce(self, tensors: Any, opts: Any = None) -> TorchWork:
        lane = self._lane
        if (lane is not None and tensors.__class__ is list and len(tensors) == 1
                and opt.lane_ok(opts, _AllreduceOptions)):
            red = opt.lane_op(opts)
            work = self._done.laned(lane.lean_allreduce(tensors[0], red, opts.asyncOp is False) if red is not None else 0,
                          "allreduce", tensors)
            if work is not None:
                return work
        o = opt.allreduce(opts)
        return TorchWork(self._engine.allreduce(_list(tensors), o, _sync=opt.is_sync(opts)))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        o = opt.allreduce_coalesced(opts)
        return TorchWork(self._engine.allreduce_coalesced(list(tensors), o, _sync=opt.is_sync(opts)))

    # -- broadcast / reduce -----------------------------------------------------------------
    def broadcast(self, tensors: Any, opts: Any = None) -> TorchWork:
        lane = self._lane
        if (lane is not None and tensors.__class__ is list and len(tensors) == 1
                and opt.lane_ok(opts, _BroadcastOptions) and opts.rootTensor == 0):
            work = self._done.laned(lane.lean_broadcast(tensors[0], opts.rootRank, opts.asyncOp is False), "broadcast", tensors)
            if work is not None:
                return work
        o = opt.broadcast(opts)
        return TorchWork(self._engine.broadcast(_list(tensors), o, _sync=opt.is_sync(opts)))

    def reduce(self, tensors: Any, opts: Any = None) -> TorchWork:
        o = opt.reduce(opts)
        return TorchWork(self._engine.reduce(_list(tensors), o, _sync=opt.is_sync(opts)))

    # -- all_gather family ------------------------------------------------------------------
    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> TorchWork:
        o = opt.allgather(opts)
        return TorchWork(self._engine.allgather(output_tensors, input_tensors, o, _sync=opt.is_sync(opts)))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TorchWork:
        lane = self._lane
        if lane is not None and opt.lane_ok(opts, _AllgatherOptions):
            work = self._done.laned(lane.lean_allgather(output, input, opts.asyncOp is False), "allgather_into_tensor", [output])
            if work is not None:
                return work
        o = opt.allgather(opts)
        return TorchWork(self._engine._allgather_base(output, input, o, _sync=opt.is_sync(opts)))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> TorchWork:
        o = opt.allgather(opts)
        work = self._engine.allgather_into_tensor_coalesced(list(outputs), list(inputs), o, _sync=opt.is_sync(opts))
        return TorchWork(work)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> TorchWork:
        o = opt.allgather(opts)
        return TorchWork(self._engine.allgather_coalesced(output_lists, list(inputs), o, _sync=opt.is_sync(opts)))

    # -- reduce_scatter family --------------------------------------------------------------
    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> TorchWork:
        o = opt.reduce_scatter(opts)
        return TorchWork(self._engine.reduce_scatter(output_tensors, input_tensors, o, _sync=opt.is_sync(opts)))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TorchWork:
        lane = self._lane
        if lane is not None and opt.lane_ok(opts, _ReduceScatterOptions):
            red = opt.lane_op(opts)
            done = lane.lean_reduce_scatter(output, input, red, opts.asyncOp is False) if red is not None else 0
            work = self._done.laned(done, "reduce_scatter_tensor", [output])
            if work is not None:
                return work
        o = opt.reduce_scatter(opts)
        return TorchWork(self._engine._reduce_scatter_base(output, input, o, _sync=opt.is_sync(opts)))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> TorchWork:
        o = opt.reduce_scatter(opts)
        work = self._engine.reduce_scatter_tensor_coalesced(list(outputs), list(inputs), o, _sync=opt.is_sync(opts))
        return TorchWork(work)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- all_to_all -------------------------------------------------------------------------
    def all_to_all_single(
        self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None,
        input_split_sizes: list[int] | None, opts: Any = None,
    ) -> TorchWork:
        lane = self._lane
        if (lane is not None and not output_split_sizes and not input_split_sizes
                and opt.lane_ok(opts, _AllToAllOptions)):
            work = self._done.laned(lane.lean_alltoall(output, input, opts.asyncOp is False), "alltoall_base", [output])
            if work is not None:
                return work
        o = opt.alltoall(opts)
        work = self._engine.alltoall_base(
            output, input, list(output_split_sizes or []), list(input_split_sizes or []), o,
            _sync=opt.is_sync(opts),
        )
        return TorchWork(work)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        o = opt.alltoall(opts)
        return TorchWork(self._engine.alltoall(list(output_tensors), list(input_tensors), o, _sync=opt.is_sync(opts)))

    # -- gather / scatter -------------------------------------------------------------------
    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> TorchWork:
        o = opt.gather(opts)
        return TorchWork(self._engine.gather(output_tensors, input_tensors, o, _sync=opt.is_sync(opts)))

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TorchWork:
        """torch 2.14's ``dist.gather_single`` (Gloo has none): a gather into one tensor."""
        o = opt.gather(opts)
        return TorchWork(self._engine.gather_single(output, input, o, _sync=opt.is_sync(opts)))

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> TorchWork:
        o = opt.scatter(opts)
        return TorchWork(self._engine.scatter(output_tensors, input_tensors, o, _sync=opt.is_sync(opts)))

    # -- point to point and barriers --------------------------------------------------------
    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> TorchWork:  # noqa: N803 - torch's name
        return TorchWork(self._engine.send(_list(tensors), dstRank, tag))

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> TorchWork:  # noqa: N803 - torch's name
        return TorchWork(self._engine.recv(_list(tensors), srcRank, tag))

    def recv_anysource(self, tensors: Any, tag: int = 0) -> TorchWork:
        return TorchWork(self._engine.recv_anysource(_list(tensors), tag))

    def barrier(self, opts: Any = None) -> TorchWork:
        lane = self._lane
        if lane is not None and opt.lane_ok(opts, _BarrierOptions) and not opts.device_ids:
            work = self._done.laned(lane.lean_barrier(opts.asyncOp is False), "barrier", [])
            if work is not None:
                return work
        return TorchWork(self._engine.barrier(opt.barrier(opts), _sync=opt.is_sync(opts)))

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """Rank 0 checks in every rank and names the ones that did not come (pyc10d's wording)."""
        self._engine.monitored_barrier(timeout, wait_all_ranks)

    def _get_backend(self, device: Any = None) -> Any:
        """torch's device-backend lookup, which ``torch.distributed.shrink_group`` starts with
        (``shrink.py``: a Python group has no C++ backend to answer)."""
        return backend_for(self, device)

    def get_backend(self, device: Any) -> Any:
        """torch 2.14's name of ``_get_backend`` (``dist.get_backend_impl`` asks it)."""
        return backend_for(self, device)

    @property
    def _device_types(self) -> list[torch.device]:
        """The devices the group serves, as torch's registry of device backends would list
        them: torch 2.14's ``monitored_barrier`` requires the CPU there."""
        return [torch.device("cpu")]

    # -- one-sided windows (torch 2.14's dist._new_window; ``window/``) ------------------------
    @property
    def supports_window(self) -> bool:
        return windows.supports(self._engine)

    def new_window(self, tensor: torch.Tensor | None = None) -> TorchWindow:
        return TorchWindow(windows.new_window(self._engine, tensor, self._backend_label))

    def shrunk(self, engine: Any) -> TorchProcessGroup:
        """The group of ``engine``, this group's shrink (``PluginBackend.shrink``)."""
        return TorchProcessGroup(engine, engine.rank(), engine.size(), self.getBackendName(), self.meeting_store)

    # -- reconfigure (torch 2.14's dist._reconfigure; ``backends/reconfigure.py``) -------------
    @property
    def supports_reconfigure(self) -> bool:
        return True

    def get_reconfigure_handle(self) -> str:
        if self._handle is None:
            self._handle = reconf.new_handle(self.meeting_store)
        return self._handle

    def reconfigure(self, opts: Any) -> TorchWork:
        """Re-form the group in place (a list of handles: ranks by position; a set: sorted);
        the old engine is aborted (its peers may be dead)."""
        # The abort hooks are the group's: the re-formed engine keeps them, and aborting the
        # old one (below) does not run them.
        abort_hooks = self._engine.take_abort_hooks()
        try:
            engine, rank, size, store = reconf.reform(
                self, self._engine, make_engine, BACKENDS[self._backend_label], opts, self.get_reconfigure_handle(),
                self._group_name, self.meeting_store)
        except BaseException:
            self._engine.adopt_abort_hooks(abort_hooks)
            raise
        engine.adopt_abort_hooks(abort_hooks)
        self._engine, self._lane = engine, engine if isinstance(engine, LaneOps) else None
        self._done = _LaneWork() if self._lane is not None else None
        self._rank, self._size, self.meeting_store, self._handle = rank, size, store, None
        return TorchWork(CompletedWork("reconfigure", []))

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    getRank, getSize = rank, size

    # -- lifetime ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        self._engine.shutdown()

    def abort(self) -> None:
        self._engine.abort()

    def _set_default_timeout(self, timeout: timedelta) -> None:
        self._engine._set_default_timeout(timeout)

    def set_timeout(self, timeout: timedelta) -> None:
        self._engine._set_default_timeout(timeout)


@_translating_methods
class TorchWindow:
    """The window torch's ``dist._new_window`` returns from this group: pyc10d's window
    (``window/``) with torch's error types and Works. (torch's ``Window`` cannot be made from
    Python; torch only calls the methods.)"""

    def __init__(self, window: Any) -> None:
        self.window = window

    def tensor_register(self, tensor: torch.Tensor, owning: bool = True) -> None:
        self.window.tensor_register(tensor, owning)

    def tensor_deregister(self) -> None:
        self.window.tensor_deregister()

    def put(self, tensor: torch.Tensor, dst_rank: int, target_offset_nelems: int, async_op: bool = False,
            opts: Any = None) -> TorchWork:
        return TorchWork(self.window.put(tensor, dst_rank, target_offset_nelems, async_op, opts))

    def signal(self, peer_rank: int, async_op: bool = False, opts: Any = None) -> TorchWork:
        return TorchWork(self.window.signal(peer_rank, async_op, opts))

    def wait_signal(self, peer_rank: int, async_op: bool = False, opts: Any = None) -> TorchWork:
        return TorchWork(self.window.wait_signal(peer_rank, async_op, opts))

    def map_remote_tensor(self, rank: int) -> torch.Tensor:
        return self.window.map_remote_tensor(rank)

    def get_attr(self, peer_rank: int) -> Any:
        ours = self.window.get_attr(peer_rank)  # (checks the rank)
        attr = getattr(_c10d, "WindowAttr", None)  # (torch 2.14)
        return attr() if attr is not None else ours


__all__ = ["BACKENDS", "PluginBackend", "ShrinkableBackend", "TorchProcessGroup", "TorchWindow", "TorchWork",
           "backend_for"]
