"""The hierarchical backend: shm inside each host, tcp between one leader per host.

Why: across hosts every byte crosses the network, while inside a host shared memory moves
it several times faster than loopback TCP (docs/performance.md). So a group whose ranks span
hosts combines inside each host first (the shm arena), runs the cross-host step among one
*leader* per host (its lowest rank) over tcp, and hands the result back inside each host:
only the leaders talk across hosts, each sending its host's data once, and a flat ring's
2(n-1) network steps become 2(H-1) for H hosts.

It is a composition of engines, not a new transport. ``HierBackend`` *is* the flat tcp
engine over all ranks (point-to-point and the collectives it does not override run there),
plus two engines it drives through their public low-level collectives from inside its own
operation: ``local``, an ``ShmBackend`` over this host's ranks (None when alone on its host),
and ``cross``, a ``TCPBackend`` over the leaders that shares the flat tcp transport (None on
non-leaders). A sub-operation runs inline on the thread running the outer one (nobody else
uses the sub-engines, so they are always idle), under the outer one's remaining time.

Per collective (blocks of a host are padded to the fullest host when hosts are uneven):

=================  ===========================================================================
all_reduce         local reduce to the leader, leaders all_reduce, local broadcast
reduce             local reduce, leaders reduce to the root's host, its leader hands it to root
broadcast          local broadcast on the root's host, leaders broadcast, local broadcast
all_gather         local all_gather, leaders all_gather the host blocks, local broadcast
reduce_scatter     local reduce of every block, leaders reduce_scatter host blocks, local scatter
gather / scatter   local gather/scatter through the leader, leaders gather/scatter host blocks,
                   the leader and the root hand the whole over shared memory
barrier            local barrier, leaders barrier, local barrier
=================  ===========================================================================

Flat tcp instead: all_to_all (both variants: every block has a single destination, so
staging through the leaders would only add hops, and uneven splits do not pad well), sparse
all_reduce, monitored_barrier and send/recv.

A failure on either level fails the outer operation and every engine of the group, so the
ranks of a host waiting on their leader learn at once why it gave up; the error then names
the hosts whose connections are gone (``describe_lost``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch

from .. import algorithms as algo
from ..algorithms.comm import flat
from ..errors import DistNetworkError
from ..store.base import Store
from ..store.prefix import PrefixStore
from ..transport.base import Transport
from ..transport.tcp import TCPTransport
from ..types import (
    AllgatherOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    RedOpType,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)
from . import shm
from .base import EngineCore
from .engine import Engine
from .failures import reworded
from .options import Options
from .staging import host
from .tcp import TCPBackend
from .topology import HostLayout
from .work import Work

#: Tag of the local point-to-point hand-over between a host's leader and a root on that host.
_HANDOFF_TAG = 0x48494552
#: How long a failed operation waits for the rest of a host whose first connection closed.
_LOSS_SETTLE_S = 1.0


def _base_op(red: ReduceOp) -> Any:
    """The op the levels run: AVG and PREMUL_SUM are plain sums until the caller finishes."""
    return ReduceOp.SUM if red.op in (RedOpType.AVG, RedOpType.PREMUL_SUM) else red


class HierBackend(Engine):
    """A group spanning hosts: shm within each host, tcp among the hosts' leaders."""

    backend_name = "hier"

    def __init__(
        self, transport: Transport, ranks: list[int], rank: int, group_name: str,
        options: Options | None = None, owns_transport: bool = False, *,
        layout: HostLayout, local: Engine | None, cross: Engine | None,
    ) -> None:
        super().__init__(transport, ranks, rank, group_name, options, owns_transport)
        self.options.backend = "hier"
        self.layout = layout
        self.local = local
        self.cross = cross
        self._host = layout.host_of(rank)
        self._leader = layout.local_index(rank) == 0

    def _set_default_timeout(self, timeout: timedelta) -> None:
        """The group's timeout and its levels': a level on its lean lane runs under its own."""
        super()._set_default_timeout(timeout)
        for level in (self.local, self.cross):
            if level is not None:
                level._set_default_timeout(timeout)

    # -- running a level ------------------------------------------------------------------
    @staticmethod
    def _opts(comm: algo.Comm, cls: type, **kw: Any) -> Any:
        return cls(timeout=timedelta(seconds=max(comm.remaining(), 0.001)), **kw)

    @staticmethod
    def _done(work: Work) -> None:
        work.wait()

    def _handoff(self, comm: algo.Comm, t: torch.Tensor, src: int, dst: int) -> None:
        """Move ``t`` from local rank ``src`` to local rank ``dst`` of this host (shm p2p)."""
        me = self.layout.local_index(comm.rank)
        if me == src:
            self.local.send([t], dst, _HANDOFF_TAG)
        elif me == dst:
            self.local.recv([t], src, _HANDOFF_TAG).wait(timedelta(seconds=max(comm.remaining(), 0.001)))

    def _host_block(self, t: torch.Tensor, k: int) -> list[torch.Tensor]:
        """Views of ``t`` for each rank of this host, ``k`` elements each."""
        return [t[i * k:(i + 1) * k] for i in range(len(self.layout.hosts[self._host]))]

    def _host_blocks(self, t: torch.Tensor, k: int) -> list[torch.Tensor]:
        """Views of ``t`` (host-major, padded) for each host, ``max_local * k`` elements each."""
        w = self.layout.max_local * k
        return [t[j * w:(j + 1) * w] for j in range(self.layout.num_hosts)]

    # -- the collectives' steps ---------------------------------------------------------------
    def _allreduce_flat(self, comm: algo.Comm, t: torch.Tensor, red: ReduceOp) -> None:
        base = _base_op(red)
        if self.local:
            self._done(self.local.reduce([t], self._opts(comm, ReduceOptions, reduceOp=base), _sync=True))
        # The leaders' all_reduce and the hosts' broadcast on their engines' lean lanes when
        # they take them (tcp's reads the sockets on this thread: ``transport/tcp/direct``), the
        # general path else. (On a lane a level runs under its engine's own timeout, the
        # group's, rather than what is left of this operation's.)
        if self.cross and not self.cross.lean_allreduce(t, base.op):
            self._done(self.cross.allreduce([t], self._opts(comm, AllreduceOptions, reduceOp=base), _sync=True))
        if self.local and not self.local.lean_broadcast(t, 0):
            self._done(self.local.broadcast([t], self._opts(comm, BroadcastOptions), _sync=True))

    def _broadcast_flat(self, comm: algo.Comm, t: torch.Tensor, root: int) -> None:
        root_host = self.layout.host_of(root)
        if self.local and self._host == root_host:
            opts = self._opts(comm, BroadcastOptions, rootRank=self.layout.local_index(root))
            self._done(self.local.broadcast([t], opts, _sync=True))
        if self.cross:
            self._done(self.cross.broadcast([t], self._opts(comm, BroadcastOptions, rootRank=root_host), _sync=True))
        if self.local and self._host != root_host:
            self._done(self.local.broadcast([t], self._opts(comm, BroadcastOptions), _sync=True))

    def _reduce_flat(self, comm: algo.Comm, t: torch.Tensor, root: int, red: ReduceOp) -> None:
        root_host, base = self.layout.host_of(root), _base_op(red)
        buf = t if comm.rank == root else t.clone()  # only the root's tensor may change
        if self.local:
            self._done(self.local.reduce([buf], self._opts(comm, ReduceOptions, reduceOp=base), _sync=True))
        if self.cross:
            opts = self._opts(comm, ReduceOptions, reduceOp=base, rootRank=root_host)
            self._done(self.cross.reduce([buf], opts, _sync=True))
        if self._host == root_host and self.layout.local_index(root) != 0:
            self._handoff(comm, buf, 0, self.layout.local_index(root))

    def _barrier(self, comm: algo.Comm) -> None:
        if self.local:
            self._done(self.local.barrier(self._opts(comm, BarrierOptions), _sync=True))
        if self.cross:
            self._done(self.cross.barrier(self._opts(comm, BarrierOptions), _sync=True))
        if self.local:  # released only once the leader is back from the other hosts
            self._done(self.local.barrier(self._opts(comm, BarrierOptions), _sync=True))

    def _gather_into(self, comm: algo.Comm, out: torch.Tensor, inp: torch.Tensor) -> None:
        lay, k = self.layout, inp.numel()
        if k == 0:
            return
        src, dst = flat(host(inp)), flat(out)
        block = torch.empty(lay.max_local * k, dtype=src.dtype)
        mine = len(lay.hosts[self._host]) * k
        if self.local:
            self._done(self.local.allgather_into_tensor(block[:mine], src, self._opts(comm, AllgatherOptions), _sync=True))
        else:
            block[:k].copy_(src)
        if self.cross:
            every = dst if lay.host_major() else torch.empty(lay.num_hosts * lay.max_local * k, dtype=src.dtype)
            self._done(self.cross.allgather_into_tensor(every, block, self._opts(comm, AllgatherOptions), _sync=True))
            if every is not dst:
                rows = every.view(-1, k)
                for r in range(comm.size):
                    dst[r * k:(r + 1) * k].copy_(rows[lay.slot(r)])
        if self.local:
            self._done(self.local.broadcast([dst], self._opts(comm, BroadcastOptions), _sync=True))

    def _reduce_scatter_blocks(self, comm: algo.Comm, blocks: list[torch.Tensor], out: torch.Tensor, red: Any) -> None:
        lay, k, base = self.layout, out.numel(), _base_op(red)
        if k == 0:
            return
        every = torch.cat(blocks)  # a copy: the local reduce overwrites the leader's
        if self.local:
            self._done(self.local.reduce([every], self._opts(comm, ReduceOptions, reduceOp=base), _sync=True))
        chunk = torch.empty(lay.max_local * k, dtype=out.dtype)
        if self.cross:
            send = every
            if not lay.host_major():
                send = torch.zeros(lay.num_hosts * lay.max_local * k, dtype=out.dtype)
                rows = send.view(-1, k)
                for r in range(comm.size):
                    rows[lay.slot(r)].copy_(every[r * k:(r + 1) * k])
            opts = self._opts(comm, ReduceScatterOptions, reduceOp=base)
            self._done(self.cross.reduce_scatter_tensor(chunk, send, opts, _sync=True))
        if self.local:
            ins = [self._host_block(chunk, k)] if self._leader else []
            self._done(self.local.scatter([out], ins, self._opts(comm, ScatterOptions), _sync=True))
        else:
            out.copy_(chunk[:k])

    def _gather_to(self, comm: algo.Comm, inp: torch.Tensor, outs: list[torch.Tensor] | None, root: int) -> None:
        lay, k = self.layout, inp.numel()
        root_host = lay.host_of(root)
        if k == 0:
            return
        src = flat(inp)
        block = torch.empty(lay.max_local * k, dtype=src.dtype) if self._leader else None
        if self.local:
            outs_l = [self._host_block(block, k)] if self._leader else []
            self._done(self.local.gather(outs_l, [src], self._opts(comm, GatherOptions), _sync=True))
        elif self._leader:
            block[:k].copy_(src)
        every = None
        if self._host == root_host:
            every = torch.empty(lay.num_hosts * lay.max_local * k, dtype=src.dtype)
        if self.cross:
            outs_x = [self._host_blocks(every, k)] if self._host == root_host else []
            opts = self._opts(comm, GatherOptions, rootRank=root_host)
            self._done(self.cross.gather(outs_x, [block], opts, _sync=True))
        if self._host == root_host and lay.local_index(root) != 0:
            self._handoff(comm, every, 0, lay.local_index(root))
        if comm.rank == root:
            rows = every.view(-1, k)
            for r, o in enumerate(outs):
                flat(o).copy_(rows[lay.slot(r)])

    def _scatter_from(self, comm: algo.Comm, ins: list[torch.Tensor] | None, out: torch.Tensor, root: int) -> None:
        lay, k = self.layout, out.numel()
        root_host, root_local = lay.host_of(root), lay.local_index(root)
        if k == 0:
            return
        every = None
        if self._host == root_host and (comm.rank == root or self._leader):
            every = torch.zeros(lay.num_hosts * lay.max_local * k, dtype=out.dtype)
            if comm.rank == root:
                rows = every.view(-1, k)
                for r, i in enumerate(ins):
                    rows[lay.slot(r)].copy_(flat(i))
            if root_local != 0:
                self._handoff(comm, every, root_local, 0)
        block = torch.empty(lay.max_local * k, dtype=out.dtype) if self._leader else None
        if self.cross:
            ins_x = [self._host_blocks(every, k)] if self._host == root_host else []
            opts = self._opts(comm, ScatterOptions, rootRank=root_host)
            self._done(self.cross.scatter([block], ins_x, opts, _sync=True))
        dst = flat(out)
        if self.local:
            ins_l = [self._host_block(block, k)] if self._leader else []
            self._done(self.local.scatter([dst], ins_l, self._opts(comm, ScatterOptions), _sync=True))
        else:
            dst.copy_(block[:k])

    # -- subgroups ----------------------------------------------------------------------------
    def derive(self, ranks: list[int], rank: int, group_name: str, options: Options) -> Engine:
        """A subgroup reuses this group's transports: shm when its ranks share one host, flat
        tcp when no two of them do, else hierarchical again over the same two transports."""
        lay = self.layout.subset(ranks)
        tcp_ranks = [self.ranks[r] for r in ranks]

        def shm_ranks(members: list[int]) -> list[int]:
            return [self.local.ranks[self.layout.local_index(ranks[g])] for g in members]

        if lay.num_hosts == 1 and len(ranks) > 1:
            return shm.ShmBackend(self.local.transport, shm_ranks(list(range(len(ranks)))), rank, group_name, options)
        if lay.max_local == 1:
            return TCPBackend(self.transport, tcp_ranks, rank, group_name, options)

        def make_local(members: tuple[int, ...], index: int, name: str) -> Engine:
            return shm.ShmBackend(self.local.transport, shm_ranks(list(members)), index, name,
                                  Options(options._timeout))

        return compose(self.transport, tcp_ranks, rank, group_name, options, lay, make_local)

    # -- failure and shutdown -------------------------------------------------------------
    def _subs(self) -> list[Engine]:
        return [e for e in (self.local, self.cross) if e is not None]

    def components(self) -> list[EngineCore]:
        """This engine and its shm and leaders' engines (a shrink hands their transports on)."""
        return [self, *self._subs()]

    def fail_group(self, error: BaseException, reason: str | None = None) -> None:
        if self._broken is None:
            for e in self._subs():
                e.fail_group(error, reason)
        super().fail_group(error, reason)

    def _explain_failure(self, error: BaseException, work: Work) -> BaseException:
        """Say which collective failed when a step did (``allreduce (hierarchical): broadcast:
        ...``) and which hosts' connections are gone."""
        error = super()._explain_failure(error, work)
        text = str(error)
        if not text.startswith(work.opname):
            text = f"{work.opname} (hierarchical, group {self.group_name!r}): {text}"
        dead = self._lost_ranks(error)
        lost = self.layout.describe_lost(dead) if dead else ""
        if lost and lost not in text:
            text = f"{text} [connection lost to {lost}]"
        return error if text == str(error) else reworded(error, text)

    def _lost_ranks(self, error: BaseException) -> set[int]:
        """Ranks of this group whose tcp connection is gone. When one is, probe the rest of
        its host (they may never have been connected to) and wait briefly for them: a dead
        host's ranks go at once, but each is noticed on its own. A failure path only."""
        deadline = time.monotonic() + _LOSS_SETTLE_S
        probed = False
        while True:
            dead = {g for g, t in enumerate(self.ranks) if g != self._rank and not self.transport.is_alive(t)}
            if not dead and not isinstance(error, DistNetworkError):
                return dead
            if dead and not probed:  # connections open lazily: ask the rest of those hosts
                probed = True
                for members in map(set, self.layout.hosts):
                    if members & dead:
                        for g in members - dead:
                            self.transport.probe(self.ranks[g])
            settled = all(set(h) <= dead for h in self.layout.hosts if dead & set(h))
            if (dead and settled) or time.monotonic() > deadline:
                return dead
            time.sleep(0.02)

    def shutdown(self) -> None:
        # Sub-engines first: one with an operation in flight fails it, which frees the thread
        # the flat engine's shutdown joins.
        for e in self._subs():
            e.shutdown()
        super().shutdown()


def compose(
    transport: Transport, ranks: list[int], rank: int, group_name: str, options: Options,
    layout: HostLayout, make_local: Any, owns_transport: bool = False,
) -> HierBackend:
    """Put a ``HierBackend`` together: ``ranks`` are the group's ranks on the tcp
    ``transport``, ``make_local(members, index, name)`` makes this host's shm engine."""
    j = layout.host_of(rank)
    members = layout.hosts[j]
    timeout = options._timeout
    local = make_local(members, layout.local_index(rank), f"{group_name}/local{j}") if len(members) > 1 else None
    cross = None
    if layout.local_index(rank) == 0:
        leaders = [ranks[g] for g in layout.leaders]
        cross = TCPBackend(transport, leaders, j, f"{group_name}/leaders", Options(timeout))
    return HierBackend(transport, ranks, rank, group_name, options, owns_transport,
                       layout=layout, local=local, cross=cross)


def host_layout(store: Store, rank: int, size: int, timeout: timedelta) -> HostLayout:
    """Every rank publishes ``shm.host_identity()``; ranks with equal ones share a host."""
    store.set(f"auto/host/{rank}", shm.host_identity())
    keys = [f"auto/host/{p}" for p in range(size)]
    store.wait(keys, timeout)
    values = store.multi_get(keys)
    return HostLayout.from_identities([v.decode() if isinstance(v, bytes) else str(v) for v in values])


def create_hier(
    store: Store, rank: int, size: int, timeout: timedelta, group_name: str, layout: HostLayout | None = None,
) -> HierBackend:
    """``backend="hier"``: hierarchical whatever the layout (``auto`` picks it when it pays)."""
    layout = layout or host_layout(store, rank, size, timeout)
    transport = TCPTransport(store, rank, size, timeout)
    j = layout.host_of(rank)
    try:
        def make_local(members: tuple[int, ...], index: int, name: str) -> Engine:
            # placed among every rank on this machine's kernel: two namespace hosts (or
            # containers) of one machine placing their ranks apart would pin them together
            return shm.ShmBackend.create(PrefixStore(f"hier/local{j}/", store), index, len(members), timeout, name,
                                         place_as=layout.kernel_slot(rank))

        return compose(transport, list(range(size)), rank, group_name, Options(timeout), layout, make_local,
                       owns_transport=True)
    except BaseException:
        transport.close()
        raise


def create_auto(store: Store, rank: int, size: int, timeout: timedelta, group_name: str) -> Any:
    """``backend="auto"``: shm when every rank of the group is on this host, flat tcp when no
    two ranks share a host, else hierarchical (shm within hosts, tcp between them)."""
    layout = host_layout(store, rank, size, timeout)
    if layout.num_hosts == 1 and size > 1:
        return shm.ShmBackend.create(store, rank, size, timeout, group_name)
    if layout.max_local == 1:
        return TCPBackend.create(store, rank, size, timeout, group_name)
    return create_hier(store, rank, size, timeout, group_name, layout)


__all__ = ["HierBackend", "compose", "create_auto", "create_hier", "host_layout"]
