"""pyc10d as a c10d ``Backend`` inside torch's own ``ProcessGroup`` (torch 2.14, which lets
Python subclass ``Backend``; 2.13 binds it no constructor).

Code that builds torch's ``ProcessGroup`` itself and registers a device backend into it, as
torchft's native-reconfigure path does with ``ProcessGroupGloo``::

    pg = dist.ProcessGroup(store, rank, size)
    backend = TorchBackend(store, rank, size, enable_reconfigure=True)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)

gets pyc10d behind torch's C++ group: torch's trampoline finds each call here by name and it is
handed, unchanged, to a ``TorchProcessGroup`` over the pyc10d engine (``group.py``: the same
code ``init_process_group("pyc10d")`` runs). ``init_process_group`` itself keeps building a
``TorchProcessGroup`` on both torches: through it every call of torch's API reaches pyc10d,
where torch's C++ group reaches a ``Backend`` only for some (2.14's ``gather_single`` not).

With ``enable_reconfigure=True`` the backend is formed by its first ``reconfigure``, as Gloo's
is; a call before that raises as Gloo's does. One limit torch sets: its C++ group and backend
keep the rank and size they were built with (nothing in Python can change them), so a
reconfigure that would give this process another rank or the group another size is refused,
saying so, before anything changes; ``init_process_group("pyc10d")`` has no such limit.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from torch._C._distributed_c10d import Backend as _C10dBackend

from ..backends import reconfigure as reconf
from ..backends.work import CompletedWork
from ..process_group import make_engine
from ..torch_version import AT_LEAST_2_14
from .group import BACKENDS, TorchProcessGroup, TorchWork
from .store_adapter import TorchStoreAdapter

#: The calls torch's C++ group makes on its device backend, each with the name of the
#: ``TorchProcessGroup`` method that serves it.
CALLS = {name: name for name in (
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "_allgather_base",
    "allgather_coalesced", "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced", "alltoall_base", "alltoall", "gather", "scatter", "send", "recv",
    "recv_anysource", "barrier", "monitored_barrier", "set_timeout", "_set_default_timeout", "abort", "shutdown")}
CALLS["recvAnysource"] = "recv_anysource"


class _Unformed:
    """The group of a backend made with ``enable_reconfigure=True`` before its first reconfigure."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("ProcessGroupPyc10d has not been initialized. Call reconfigure() before "
                           "issuing collectives when enable_reconfigure=True.")


class TorchBackend(_C10dBackend):
    """torch's ``ProcessGroupGloo(store, rank, size, timeout, enable_reconfigure)``, on pyc10d."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta = timedelta(minutes=30),
                 enable_reconfigure: bool = False, backend: str = "pyc10d") -> None:
        if not AT_LEAST_2_14:
            raise RuntimeError("a Python c10d Backend needs torch 2.14 (2.13's binds it no constructor): "
                               "use init_process_group('pyc10d') there")
        super().__init__(rank, size)
        self._built = (rank, size)
        self._label, self._timeout = backend, timeout
        self._store = TorchStoreAdapter(store, timeout)
        self._handle: str | None = None
        self.group: Any = _Unformed()
        if not enable_reconfigure:
            engine = make_engine(BACKENDS[backend], self._store, rank, size, timeout, f"{backend}-native")
            self.group = TorchProcessGroup(engine, rank, size, backend, self._store)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return self._label

    def name(self) -> str:
        return self._label

    @property
    def supports_reconfigure(self) -> bool:
        return True

    def get_reconfigure_handle(self) -> str:
        if isinstance(self.group, TorchProcessGroup):
            return self.group.get_reconfigure_handle()
        if self._handle is None:
            self._handle = reconf.new_handle(self._store)
        return self._handle

    def reconfigure(self, opts: Any) -> Any:
        mine = self.get_reconfigure_handle()
        ordered = reconf.order(opts.handles, mine)
        if (ordered.index(mine), len(ordered)) != self._built:
            raise RuntimeError(
                f"reconfigure: these handles make this process rank {ordered.index(mine)} of {len(ordered)}, but "
                f"a pyc10d backend inside torch's own ProcessGroup keeps rank {self._built[0]} of "
                f"{self._built[1]} (torch fixes both when it builds them); list the handles in that order, "
                f"or use init_process_group('{self._label}'), whose groups re-form freely")
        if isinstance(self.group, TorchProcessGroup):
            return self.group.reconfigure(opts)
        engine, rank, size, store = reconf.build(
            make_engine, BACKENDS[self._label], ordered, mine, opts.uuid,
            reconf.timeout_of(opts, self._timeout), f"{self._label}-native", self._store)
        self.group = TorchProcessGroup(engine, rank, size, self._label, store)
        return TorchWork(CompletedWork("reconfigure", []))


def _forward(name: str, target: str) -> Any:
    def call(self: TorchBackend, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.group, target)(*args, **kwargs)

    call.__name__ = name
    return call


for _name, _target in CALLS.items():
    setattr(TorchBackend, _name, _forward(_name, _target))
