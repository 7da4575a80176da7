"""torchft on pyc10d: ``ProcessGroupPyc10d``, a reconfigurable torchft process group.

torchft (fault-tolerant training: replica groups under a Lighthouse quorum) rebuilds its
process group whenever the quorum changes, under a new store prefix, and must be able to
stop a group that hangs on a dead peer. Gloo cannot be stopped from another thread, which is
why torchft runs it in a subprocess (``ProcessGroupBabyGloo``) to kill it. A pyc10d engine
can: ``abort`` from any thread fails the group's pending operations at once and tells the
peers why, so this group runs in the training process itself::

    from torchft import Manager
    from pyc10d.integrations.torchft import ProcessGroupPyc10d

    manager = Manager(pg=ProcessGroupPyc10d(timeout=timedelta(seconds=10)), ...)

Each reconfiguration builds a fresh pyc10d engine (``_create_pg``) over the store torchft
gives and shuts the previous one down explicitly: peers of a group that is dropped hear a
goodbye ("Connection closed by peer") instead of waiting out their timeout.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as tdist
from torchft.process_group import ProcessGroupWrapper

from ..backends.lifetime import keep_in_forked_children
from ..errors import DistBackendError, with_message
from ..process_group import make_engine
from ..torch_backend import BACKENDS, TorchProcessGroup, TorchStoreAdapter
from ..torch_backend.errors import to_torch

__all__ = ["ProcessGroupPyc10d"]


class ProcessGroupPyc10d(ProcessGroupWrapper):
    """A torchft process group whose collectives run on pyc10d, aborted in process.

    Args:
        timeout: the default timeout of the group's operations and of its rendezvous.
        backend: which of the plugin's names to build each group with: ``"pyc10d"`` (shared
            memory on one host, tcp across hosts), ``"pyc10d_shm"`` or ``"pyc10d_tcp"``.

    ``errored()`` answers the failure that aborted the current group (a lost peer, a timeout,
    an ``abort()``) until the next reconfiguration: torchft's Manager then skips the step's
    commit and rebuilds the group on its next quorum.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60), backend: str = "pyc10d") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"ProcessGroupPyc10d: unknown backend {backend!r}; one of {sorted(BACKENDS)}")
        super().__init__(timeout=timeout)
        self._backend = backend
        self._error: BaseException | None = None
        # torchft's base hosts a master TCPStore here (``get_reconfigure_handle``), whose
        # destructor joins the parent's server thread: fatal in a forked child.
        keep_in_forked_children(self)

    # -- reconfiguration ---------------------------------------------------------------------
    def _create_pg(self, store: Any, rank: int, world_size: int) -> tdist.ProcessGroup:
        """The group of one quorum: a new engine over torchft's per-quorum ``PrefixStore``."""
        self._error = None
        name = f"torchft:{self._uuid}" if self._uuid is not None else "torchft"
        adapter = TorchStoreAdapter(store, self._timeout)
        engine = make_engine(BACKENDS[self._backend], adapter, rank, world_size, self._timeout, name)
        return TorchProcessGroup(engine, rank, world_size, self._backend)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return f"torchft-{self._backend}"

    # -- failure and lifetime ----------------------------------------------------------------
    def abort(self, errored: bool = True) -> None:
        """Fail the current group's operations now (from any thread) and drop it.

        ``errored=False`` is torchft's call before a planned reconfiguration: the group is
        shut down (its peers hear a goodbye) rather than aborted, and ``errored()`` stays
        clear."""
        pg = self._pg
        if not isinstance(pg, TorchProcessGroup):
            super().abort(errored=errored)
            return
        if not errored:
            self.shutdown()
            return
        if self._error is None:
            self._error = self._failure(pg.engine) or to_torch(
                DistBackendError(f"process group {pg.engine.group_name!r} aborted by rank {pg.rank()}"))
        super().abort(errored=True)  # logs torchft's abort event, then pg.abort(): the engine's

    def shutdown(self) -> None:
        """Shut the current group down: its threads end, its memory and sockets are released
        and its peers hear a goodbye at once (torchft's wrapper only drops the reference)."""
        pg = self._pg
        self._pg = None
        if isinstance(pg, TorchProcessGroup):
            pg.shutdown()

    def errored(self) -> Exception | None:
        """The failure that aborted the current group (None while it is healthy)."""
        if self._error is None:
            pg = self._pg
            if isinstance(pg, TorchProcessGroup):
                self._error = self._failure(pg.engine)
        return self._error  # type: ignore[return-value]

    @staticmethod
    def _failure(engine: Any) -> BaseException | None:
        """The engine's failure as torch's type, worded as the abort it caused (pyc10d aborts
        a group on its first failure; torchft's callers look for "aborted")."""
        error = engine.failure()
        if error is None:
            return None
        if "aborted" not in str(error):
            error = with_message(error, f"process group aborted: {error}")
        return to_torch(error)

    def set_timeout(self, timeout: timedelta) -> None:
        """The timeout of later operations of the current group, and of the groups to come."""
        super().set_timeout(timeout)
        pg = self._pg
        if isinstance(pg, TorchProcessGroup):
            pg.set_timeout(timeout)
