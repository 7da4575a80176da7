"""Point-to-point operations and barriers.

``send`` and ``recv`` do not go through the group's ordered queue: like torch's Gloo they
run beside collectives, so a posted receive never blocks a later collective. Messages
match per (peer, tag) in FIFO order on their own channel.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import torch
from torch.autograd import profiler as torch_profiler

from .. import algorithms as algo
from .. import threads
from ..algorithms import profiling
from ..errors import DistBackendError, DistError, DistTimeoutError
from ..types import BarrierOptions
from . import checks as ck
from .accepts import check_tensors
from .base import _P2P_BIT, EngineCore
from .staging import host, writeback
from .work import CompletedWork, Work


class RecvWork(Work):
    """Completes when the posted receive has its data; copies back if the tensor was staged."""

    def __init__(self, pending: algo.comm.PendingRecv, dst: torch.Tensor, staged: torch.Tensor, src: int,
                 engine: P2POps | None = None, tag: int = 0) -> None:
        super().__init__("recv", [dst])
        self._pending = pending
        self._dst, self._staged = dst, staged
        self._source_rank = src
        self._settle_lock = threading.Lock()
        self._engine, self._tag = engine, tag

    def _watch_tags(self) -> None:
        """Wait for the message; raise (and abort the group) if meanwhile the sender's only
        messages here are on other tags: a tag mismatch would otherwise wait out the timeout."""
        pending, engine = self._pending, self._engine
        if engine is None or self._source_rank < 0 or engine.tag_mismatch_s <= 0:
            return  # (a program that really sends the tag later than that is told it mismatched)
        handle, comm, waited = pending.handle, pending.comm, 0.0
        peer = comm.ranks[self._source_rank]
        while not handle.settle(min(0.25, max(comm.remaining(), 0.0))):
            waited += 0.25
            if comm.remaining() <= 0:
                return
            if waited < engine.tag_mismatch_s:
                continue
            tags = sorted(c & 0x7FFFFFFF for c in comm.transport.unexpected_from(peer, engine.group_key)
                          if c & _P2P_BIT)
            if tags:
                error = DistBackendError(
                    f"recv in group {engine.group_name!r}: desync: rank {comm.rank} waited {waited:.1f}s "
                    f"for tag {self._tag} from rank {self._source_rank}, which sent tag(s) "
                    f"{', '.join(map(str, tags))} instead (p2p tag mismatch)")
                engine.fail_group(error)
                raise error

    def _resolve(self, timeout: float | None) -> None:
        with self._settle_lock:
            if self._finished:
                return
            try:
                self._pending.comm.deadline = float("inf") if timeout is None else _now() + timeout
                if torch_profiler._is_profiler_enabled and self._engine is not None:
                    self._profiled_wait()
                else:
                    self._watch_tags()
                    self._pending.wait()
                self._source_rank = self._pending.peer
                writeback(self._dst, self._staged)
                self.finish(None)
            except DistTimeoutError:
                raise
            except BaseException as e:  # noqa: BLE001
                self.finish(e)

    def _profiled_wait(self) -> None:
        """``_resolve``'s wait inside a ``pyc10d:recv`` range (``algorithms.profiling``); its
        ``seq`` counts the group's receives that waited while a profiler ran."""
        engine = self._engine
        with profiling.op_range("recv", [self._dst], engine.count_profiled_recv(), engine.group_name, engine.backend_name,
                                peer=self._source_rank, tag=self._tag):
            with profiling.wait_range(self._source_rank):
                self._watch_tags()
            self._pending.wait()

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        self._resolve(secs if secs and secs > 0 else self._pending.comm.timeout)
        return super().wait()

    def is_completed(self) -> bool:
        if not self._finished and self._pending.handle.done():
            self._resolve(None)
        return self._finished

    def get_future(self) -> torch.futures.Future:
        fut = super().get_future()
        if not self._finished:
            threads.start(self._resolve_quietly, f"pyc10d-recv-future-{self._engine.group_name}")
        return fut

    def _resolve_quietly(self) -> None:
        try:
            self._resolve(self._pending.comm.timeout)
        except BaseException as e:  # noqa: BLE001
            self.finish(e)


def _now() -> float:
    import time

    return time.monotonic()


class P2POps(EngineCore):
    #: Sends / receives counted while a profiler ran: the ``seq`` of their profiler ranges.
    _p2p_sends = 0
    _p2p_recvs = 0

    def count_profiled_recv(self) -> int:
        """Count a receive that waits while a profiler runs; its ``seq`` (``RecvWork``)."""
        self._p2p_recvs += 1
        return self._p2p_recvs

    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> Work:  # noqa: N803
        t = ck.as_list(tensors)
        ck.check_single("send", t)
        check_tensors("send", t)
        if not 0 <= dstRank < self._size or dstRank == self._rank:
            raise ValueError(f"send: invalid destination rank {dstRank} (group size {self._size}, rank {self._rank})")
        comm = self._p2p_comm("send")
        comm.channel = self._p2p_channel(tag)
        if torch_profiler._is_profiler_enabled:  # ``algorithms.profiling``; seq: this group's sends
            self._p2p_sends += 1
            with profiling.op_range("send", t, self._p2p_sends, self.group_name, self.backend_name,
                                    peer=dstRank, tag=tag):
                comm.send(dstRank, host(t[0]))
        else:
            comm.send(dstRank, host(t[0]))
        return CompletedWork("send", t)

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> Work:  # noqa: N803
        t = ck.as_list(tensors)
        ck.check_single("recv", t)
        check_tensors("recv", t)
        if not 0 <= srcRank < self._size or srcRank == self._rank:
            raise ValueError(f"recv: invalid source rank {srcRank} (group size {self._size}, rank {self._rank})")
        comm = self._p2p_comm("recv")
        comm.channel = self._p2p_channel(tag)
        staged = host(t[0])
        return RecvWork(comm.irecv(srcRank, staged), t[0], staged, srcRank, self, tag)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Work:
        """Receive from whichever rank sends first with ``tag``; ``source_rank()`` names it."""
        t = ck.as_list(tensors)
        ck.check_single("recv", t)
        check_tensors("recv", t)
        if self._size == 1:
            raise ValueError("recv: no other rank to receive from in a group of size 1")
        comm = self._p2p_comm("recv")
        comm.channel = self._p2p_channel(tag)
        staged = host(t[0])
        return RecvWork(comm.irecv_any(staged), t[0], staged, -1, self)

    def barrier(self, opts: BarrierOptions | None = None, _sync: bool = False) -> Work:
        if self._size == 1:
            work = self._done_locally("barrier", [])
            if work is not None:
                return work
        return self._submit("barrier", self._barrier, [], opts, _sync)

    def _barrier(self, comm: algo.Comm) -> None:
        algo.select("barrier", comm.size, 0)(comm)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """Rank 0 collects a token from every rank, then releases them; names the missing ranks.

        The wording is Gloo's (``Rank 1 failed to pass monitoredBarrier``, ``Rank 0 timed out in
        monitoredBarrier``, ``Rank 2 successfully reached monitoredBarrier, but received errors
        ...``), which torch's tests and users' scripts match; pyc10d's cause follows it. A rank
        that fails in any way (late, dead) has failed to pass, as in Gloo.
        """
        secs = timeout.total_seconds() if timeout is not None else self.timeout_s
        opts = BarrierOptions(timeout=timedelta(seconds=secs))
        ms = int(secs * 1000)

        def run(comm: algo.Comm) -> None:
            token = torch.zeros(1, dtype=torch.uint8)
            if comm.rank != 0:
                try:
                    comm.send(0, token)
                    comm.recv(0, token)
                except DistError as e:
                    raise type(e)(
                        f"monitored_barrier: Rank {comm.rank} successfully reached monitoredBarrier, "
                        f"but received errors while waiting for send/recv from rank 0 ({e})") from None
                return
            deadline = time.monotonic() + secs  # its own: a zero timeout means "none left"
            missing: list[int] = []
            causes: list[str] = []
            pending = {p: comm.irecv(p, torch.empty(1, dtype=torch.uint8)) for p in range(1, comm.size)}
            for p, pr in pending.items():
                if not wait_all_ranks and time.monotonic() >= deadline:
                    left = ", ".join(str(q) for q in pending if q >= p)
                    raise DistTimeoutError(
                        f"monitored_barrier: Rank 0 timed out in monitoredBarrier after {ms} ms; "
                        f"ranks not yet checked in: {left}")
                try:
                    pr.wait()
                except DistError as e:
                    missing.append(p)
                    causes.append(str(e))
                    if not wait_all_ranks:
                        break
            if missing:
                which = ", ".join(str(p) for p in missing)
                raise DistBackendError(
                    f"monitored_barrier: Rank{'s' if len(missing) > 1 else ''} {which} failed to pass "
                    f"monitoredBarrier in {ms} ms ({'; '.join(causes)})"
                )
            for p in range(1, comm.size):
                comm.send(p, token)

        self._submit("monitored_barrier", run, [], opts, True).wait()
