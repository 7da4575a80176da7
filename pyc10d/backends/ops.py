"""The low-level collectives of a process group (``pg.allreduce([t], opts)`` ...).

Each method validates its inputs (torch Gloo's messages; dtype × op, device and layout from
``accepts``'s table) on the calling rank, then hands a closure to the engine: a refused call
never reaches the engine, so it leaves the group usable. The closure stages tensors to contiguous host memory, picks an algorithm with
``algorithms.select`` and writes results back. Lists of several tensors per rank follow
torch Gloo's semantics (all tensors of all ranks take part).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import algorithms as algo
from ..algorithms.comm import flat
from ..algorithms.reduce_ops import finish, premultiply, reduce_into
from ..types import (
    AllreduceCoalescedOptions,
    AllreduceOptions,
    BroadcastOptions,
    RedOpType,
    ReduceOp,
    ReduceOptions,
    as_reduce_op,
)
from . import checks as ck
from .accepts import check_tensor, check_tensors, reduction
from .base import EngineCore
from .sparse import sparse_allreduce
from .staging import host, writeback
from .work import Work

_strided = torch.strided
_Tensor = torch.Tensor


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class CollectiveOps(EngineCore):
    """Collectives on top of the engine; see ``ProcessGroup`` for the user-facing docs."""

    # -- all_reduce family ----------------------------------------------------------------
    def allreduce(self, tensors: Any, opts: AllreduceOptions | None = None, op: Any = None, _sync: bool = False,
                  _src: torch.Tensor | None = None) -> Work:
        """``_src`` (pyc10d's functional all_reduce): read the input from ``_src``, a tensor of
        the single output's dtype and size, and write the result to the output only."""
        tensors = ck.as_list(tensors)  # a copy: a queued operation must not see the caller's edits
        if op is None:
            op = ReduceOp.SUM if opts is None else opts.reduceOp
        red = as_reduce_op(op)
        ck.check_non_empty("allreduce", tensors)
        t0 = tensors[0]
        # One strided CPU tensor, the common case, costs three reads here (its dtype is checked
        # by ``reduction``, whose table holds no dtype that cannot be moved).
        if len(tensors) != 1 or t0.__class__ is not _Tensor or t0.layout is not _strided or not t0.is_cpu:
            check_tensors("allreduce", tensors, sparse=True)
            if any(t.layout is not _strided for t in tensors):
                ck.check_same("allreduce", tensors)
                if red.op != RedOpType.SUM:
                    ck.fail("allreduce", f"unsupported reduction operation {red.name} for sparse tensors")
                if reduction("allreduce", red, t0.dtype) is not None or t0.dtype == torch.bool:
                    ck.fail("allreduce", f"sparse tensors of {t0.dtype} are not supported")
                return self._submit("allreduce", lambda c: sparse_allreduce(c, tensors), tensors, opts, _sync,
                                    red=red)
        ck.check_same("allreduce", tensors)
        plan = reduction("allreduce", red, t0.dtype)
        if _src is not None:
            check_tensor("allreduce", _src, "input")
        if self._size == 1 and _src is None and len(tensors) == 1 and red.op != RedOpType.PREMUL_SUM:
            work = self._done_locally("allreduce", tensors)  # the sum of one tensor (AVG: / 1)
            if work is not None:
                return work

        if plan is None:
            def run(comm: algo.Comm) -> None:
                self._allreduce_dense(comm, tensors, red, _src)
        else:
            def run(comm: algo.Comm) -> None:
                wires = [plan.to_wire(t) for t in tensors]
                self._allreduce_dense(comm, wires, red, None if _src is None else plan.to_wire(_src))
                for t, w in zip(tensors, wires):
                    plan.back(t, w)

        return self._submit("allreduce", run, tensors, opts, _sync, red=red)

    def _allreduce_dense(self, comm: algo.Comm, tensors: list[torch.Tensor], red: ReduceOp,
                         src: torch.Tensor | None = None) -> None:
        if src is not None:  # out of place: a backend that reads its input once overrides this
            tensors[0].detach().copy_(src)
        hs = [host(t) for t in tensors]
        acc = hs[0] if len(hs) == 1 else hs[0].clone()
        premultiply(acc, red)
        for h in hs[1:]:
            reduce_into(acc, premultiply(h.clone(), red), red)
        self._allreduce_flat(comm, flat(acc), red)
        finish(acc, red, comm.size * len(hs))
        for h, t in zip(hs, tensors):
            if h is not acc:
                h.copy_(acc)
            writeback(t, h)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions | None = None, _sync: bool = False) -> Work:
        tensors = ck.as_list(tensors)
        opts = opts if opts is not None else AllreduceCoalescedOptions()
        red = as_reduce_op(opts.reduceOp)
        ck.check_non_empty("allreduce_coalesced", tensors)
        for i, t in enumerate(tensors):
            if t.layout != tensors[0].layout:
                ck.fail("allreduce_coalesced", f"invalid tensor layout at index {i}")
        for t in tensors:
            if t.dtype != tensors[0].dtype:
                ck.fail("allreduce_coalesced", "tensors must all have the same type")
        check_tensors("allreduce_coalesced", tensors)
        self._check_device(tensors, "allreduce_coalesced")
        plan = reduction("allreduce_coalesced", red, tensors[0].dtype)

        def run(comm: algo.Comm) -> None:
            wires = tensors if plan is None else [plan.to_wire(t) for t in tensors]
            packed = torch.cat([t.detach().reshape(-1).cpu() for t in wires]) if wires else None
            premultiply(packed, red)
            self._allreduce_flat(comm, packed, red)
            finish(packed, red, comm.size)
            offset = 0
            for t, w in zip(tensors, wires):
                n = t.numel()
                w.detach().copy_(packed[offset:offset + n].view(t.shape))
                if plan is not None:
                    plan.back(t, w)
                offset += n

        return self._submit("allreduce_coalesced", run, tensors, opts, _sync, red=red)

    # -- broadcast / reduce ---------------------------------------------------------------
    def broadcast(self, tensors: Any, opts: BroadcastOptions | None = None, root: int | None = None, _sync: bool = False) -> Work:
        tensors = ck.as_list(tensors)
        opts = opts if opts is not None else BroadcastOptions()
        root_rank = opts.rootRank if root is None else root
        ck.check_root_rank("broadcast", root_rank, self._size)
        ck.check_root_tensor("broadcast", opts.rootTensor, len(tensors))
        check_tensors("broadcast", tensors)
        ck.check_same("broadcast", tensors)
        root_tensor = opts.rootTensor
        if self._size == 1 and len(tensors) == 1:
            work = self._done_locally("broadcast", tensors)
            if work is not None:
                return work

        def run(comm: algo.Comm) -> None:
            src = tensors[root_tensor] if comm.rank == root_rank else tensors[0]
            h = host(src)
            self._broadcast_flat(comm, flat(h), root_rank)
            for t in tensors:
                if t is src:
                    writeback(t, h)
                else:
                    t.detach().copy_(h)

        return self._submit("broadcast", run, tensors, opts, _sync, root=root_rank)

    def reduce(self, tensors: Any, opts: ReduceOptions | None = None, root: int | None = None, op: Any = None, _sync: bool = False) -> Work:
        tensors = ck.as_list(tensors)
        opts = opts if opts is not None else ReduceOptions()
        root_rank = opts.rootRank if root is None else root
        red = as_reduce_op(op if op is not None else opts.reduceOp)
        ck.check_root_rank("reduce", root_rank, self._size)
        ck.check_root_tensor("reduce", opts.rootTensor, len(tensors))
        ck.check_single("reduce", tensors)
        check_tensors("reduce", tensors)
        plan = reduction("reduce", red, tensors[0].dtype)

        def run(comm: algo.Comm) -> None:
            t = tensors[0] if plan is None else plan.to_wire(tensors[0])
            h = host(t)
            if comm.rank != root_rank and red.op == RedOpType.PREMUL_SUM:
                h = h.clone()
            premultiply(h, red)
            self._reduce_flat(comm, flat(h), root_rank, red)
            if comm.rank == root_rank:
                finish(h, red, comm.size)
                writeback(t, h)
                if plan is not None:
                    plan.back(tensors[0], t)

        return self._submit("reduce", run, tensors, opts, _sync, red=red, root=root_rank)

    # -- the algorithm hooks a transport-specific backend may replace --------------------
    def _allreduce_flat(self, comm: algo.Comm, t: torch.Tensor, red: ReduceOp) -> None:
        """Reduce the contiguous, premultiplied ``t`` across ranks in place (the caller finishes AVG)."""
        algo.select("allreduce", comm.size, _nbytes(t))(comm, t, red)

    def _broadcast_flat(self, comm: algo.Comm, t: torch.Tensor, root: int) -> None:
        algo.select("broadcast", comm.size, _nbytes(t))(comm, t, root)

    def _reduce_flat(self, comm: algo.Comm, t: torch.Tensor, root: int, red: ReduceOp) -> None:
        algo.select("reduce", comm.size, _nbytes(t))(comm, t, root, red)
