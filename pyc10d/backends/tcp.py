"""The TCP backend: the collective engine over a ``TCPTransport`` (multi-host capable).

Its lean lane (``lane.py``) runs a synchronous collective with the calling thread reading
and writing the peers' sockets itself (``transport/tcp/direct.py``): the same algorithm,
chosen by the same ``select``, with the same channel and message words as the general path
(a rank on the lane and a rank on the general path exchange correctly), minus the general
path's layers and the hand-off from the receiver thread to the caller per message.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from .. import algorithms as algo
from ..algorithms.comm import Collective, Comm, flat
from ..errors import DistInputError
from ..store.base import Store
from ..transport.tcp import TCPTransport
from ..transport.tcp.direct import DirectIO
from ..types import RedOpType
from .accepts import reduction
from .engine import Engine
from .lane import Step
from .options import Options


class TCPBackend(Engine):
    backend_name = "tcp"
    _direct: DirectIO | None = None

    @classmethod
    def create(cls, store: Store, rank: int, size: int, timeout: timedelta, group_name: str) -> TCPBackend:
        transport = TCPTransport(store, rank, size, timeout)
        return cls(transport, list(range(size)), rank, group_name, Options(timeout), owns_transport=True)

    def _lane_step(self, key: tuple, x: torch.Tensor | None, y: torch.Tensor | None, red: Any,
                   root: int) -> Step | bool:
        """The step of each key the general path runs without staging or widening: the general
        path's own exchange (``_allreduce_dense``, ``_gather_into``, ``_alltoall_blocks``, ...)
        over a ``Comm`` whose transport is this thread's ``DirectIO``. False for the rest."""
        transport = self.transport
        if self._size == 1 or not isinstance(transport, TCPTransport):
            return False
        io = self._direct
        if io is None:
            io = self._direct = transport.direct()
            if io is None:
                return False
        kind, opname = key[0], _OPNAMES.get(key[0])
        if opname is None:
            return False
        if io.max_bytes is not None and max(0 if t is None else t.nbytes for t in (x, y)) > io.max_bytes:
            return False  # (an oversubscribed host: see ``OVERSUBSCRIBED_DIRECT_MAX``)
        if kind != "barrier":
            assert x is not None
            if x.is_complex() or (y is not None and y.is_complex()):
                return False  # the public API moves it as real pairs: so must every rank
            try:
                if red is not None and reduction(opname, red, x.dtype) is not None:
                    return False  # widened on the wire
            except DistInputError:
                return False  # refused: the general path says why, every call
        collective = Collective(red, None if root < 0 else root) if self.desync_check else None
        high = self.group_key << 32
        ranks, rank, scratch = self.ranks, self._rank, self._scratch
        if kind == "allreduce":
            def run(comm: Comm, x: Any, y: Any) -> None:
                self._allreduce_dense(comm, [x], red)
        elif kind == "broadcast":
            def run(comm: Comm, x: Any, y: Any) -> None:
                self._broadcast_flat(comm, flat(x), root)
        elif kind == "allgather":
            def run(comm: Comm, x: Any, y: Any) -> None:
                self._gather_into(comm, x, y)
        elif kind == "reduce_scatter":
            def run(comm: Comm, x: Any, y: Any) -> None:
                self._rs_one(comm, x, y, red)
        elif kind == "alltoall":  # split evenly by dim 0, as the general path splits it
            n = self._size
            assert y is not None
            if not (x.dim() and y.dim() and x.shape[0] % n == 0 and y.shape[0] % n == 0 and x.numel() == y.numel()):
                return False

            def run(comm: Comm, x: Any, y: Any) -> None:  # (sizes as a list: n empty blocks of an empty tensor)
                self._alltoall_blocks(comm, list(y.split([y.shape[0] // n] * n)), list(x.split([x.shape[0] // n] * n)))
        else:
            def run(comm: Comm, x: Any, y: Any) -> None:
                self._barrier(comm)
        if y is not None and (y.dtype != x.dtype or (kind == "allgather" and x.numel() != y.numel() * self._size)
                              or (kind == "reduce_scatter" and y.numel() != x.numel() * self._size)):
            return False  # the general path refuses it, every call

        def step(x: Any, y: Any, deadline: float, timeout: float) -> None:
            running = self._running_op
            assert running is not None  # set by ``EngineCore._claim`` for this operation
            comm = Comm(io, ranks, rank, high | (running[0] & 0x7FFFFFFF), timeout, opname)
            comm.scratch_pool = scratch
            comm.collective = collective
            try:
                run(comm, x, y)
            finally:
                io.end()

        if kind == "allreduce":
            return self._small_allreduce_step(io, x, red, collective, step) or step
        return step

    def _small_allreduce_step(self, io: DirectIO, x: torch.Tensor, red: Any, collective: Any,
                              general: Step) -> Step | None:
        """The step of an all_reduce that ``select`` gives ``allreduce_direct`` (every small one
        up to ``SMALL_WORLD`` ranks): ``allreduce_direct_step``, its buffers made once. Each
        call asks ``select`` again (a test, or a caller retuning the thresholds, may change
        the choice; every rank must run the same algorithm), else takes ``general``."""
        n, nbytes = self._size, x.numel() * x.element_size()
        if n > algo.SMALL_WORLD or algo.select("allreduce", n, nbytes) is not algo.allreduce_direct:
            return None
        template = Comm(io, self.ranks, self._rank, 0, self.timeout_s, "allreduce")
        template.collective = collective
        inner = algo.allreduce_direct_step(template, red, x.dtype, x.numel())
        high, avg = self.group_key << 32, red.op is RedOpType.AVG
        select, direct = algo.select, algo.allreduce_direct

        def step(x: Any, y: Any, deadline: float, timeout: float) -> None:
            if select("allreduce", n, nbytes) is not direct:
                return general(x, y, deadline, timeout)
            running = self._running_op
            assert running is not None
            try:
                inner(x if x.dim() == 1 else x.view(-1), high | (running[0] & 0x7FFFFFFF), deadline, timeout)
            finally:
                io.end()
            if avg:
                x.div_(n)

        return step


#: The general path's operation name of each lane key (its messages' fingerprint).
_OPNAMES = {"allreduce": "allreduce", "broadcast": "broadcast", "allgather": "allgather_into_tensor",
            "reduce_scatter": "reduce_scatter_tensor", "alltoall": "alltoall_base", "barrier": "barrier"}
