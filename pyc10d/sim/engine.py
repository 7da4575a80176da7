"""A discrete-event run of the real algorithm functions over a simulated ``Comm``.

Every rank is a thread running the algorithm unchanged, but only one runs at a time: a rank
runs until it waits for a message that has not been sent yet, or is about to send while
another rank that can go on is behind it in simulated time; then it hands over to the rank
with the smallest clock, so that sends reach the NICs in time order. Each rank has its own clock; CPU work
(per-message overhead, copies, reductions) runs on the host's least busy simulated core,
bytes between hosts queue on the sender's and receiver's NIC. Messages carry real data (of
a scaled-down tensor: ``scale`` simulated bytes per real byte), so a run also checks that
the algorithm computed the right thing.

Reductions are charged by wrapping ``reduce_ops.kernel`` for the duration of a run: the
algorithms call torch kernels directly and this is the one place they all go through.
"""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ..algorithms import reduce_ops, segments
from .network import Net


class SimDeadlock(RuntimeError):
    pass


class _Recv:
    __slots__ = ("sim", "rank", "peer", "buf", "arrive", "nbytes", "done")

    def __init__(self, sim: Sim, rank: int, peer: int, buf: torch.Tensor) -> None:
        self.sim, self.rank, self.peer, self.buf = sim, rank, peer, buf
        self.done = False
        self.arrive = 0.0
        self.nbytes = 0.0

    def wait(self) -> torch.Tensor:
        self.sim.wait(self)
        return self.buf


class SimComm:
    """What an algorithm sees (``algorithms.comm.Comm``'s interface), over the simulator."""

    def __init__(self, sim: Sim, rank: int) -> None:
        self.sim, self.rank, self.size = sim, rank, sim.n

    def send(self, peer: int, t: torch.Tensor) -> None:
        self.sim.send(self.rank, peer, t)

    def irecv(self, peer: int, t: torch.Tensor) -> _Recv:
        return self.sim.irecv(self.rank, peer, t)

    def recv(self, peer: int, t: torch.Tensor) -> torch.Tensor:
        return self.irecv(peer, t).wait()


    def scratch(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype)


class Sim:
    """One run of ``fn(comm)`` on ``n`` simulated ranks; see the module docstring."""

    def __init__(self, n: int, net: Net, scale: float = 1.0) -> None:
        self.n, self.net, self.scale = n, net, scale
        self.clock = [0.0] * n
        hosts = (n + net.ranks_per_host - 1) // net.ranks_per_host
        self.cores = [[0.0] * net.cores_per_host for _ in range(hosts)]
        self.last_core = [r % net.ranks_per_host % net.cores_per_host for r in range(n)]
        self.nic_out = [0.0] * hosts
        self.nic_in = [0.0] * hosts
        self.sent_bytes = [0.0] * n
        self.sent_msgs = [0] * n
        self.peers: list[set[int]] = [set() for _ in range(n)]
        self.posted: dict[tuple[int, int], deque[_Recv]] = {}
        self.unexpected: dict[tuple[int, int], deque[tuple[torch.Tensor, float, float]]] = {}
        self.ready: list[tuple[float, int, int]] = []
        self.seq = 0
        self.turn = [threading.Lock() for _ in range(n)]
        self.waiting: list[_Recv | None] = [None] * n
        self.current = 0
        self.finished = 0
        self.error: BaseException | None = None

    # -- costs ---------------------------------------------------------------------------
    def _cpu(self, rank: int, seconds: float) -> None:
        """``seconds`` of CPU for ``rank`` on its host's earliest free core."""
        if seconds <= 0:
            return
        self._in_time_order(rank)  # (a rank that can run earlier takes the cores first)
        cores = self.cores[self.net.host(rank)]
        now, last = self.clock[rank], self.last_core[rank]
        # the core where it starts first; of equals the one it ran on last (a scheduler keeps
        # a thread where it was: a tiny piece of work must not push another rank off its core)
        i = min(range(len(cores)), key=lambda c: (max(now, cores[c]), c != last))
        start = max(now, cores[i])
        cores[i] = self.clock[rank] = start + seconds
        self.last_core[rank] = i

    def _in_time_order(self, rank: int) -> None:
        """Let every rank that can run at an earlier time than ``rank`` run first: each core
        and each NIC then serves its work in time order (a conservative discrete-event run)."""
        ready = self.ready
        if ready and ready[0][0] < self.clock[rank]:
            self._push(self.clock[rank], rank)
            self._switch(rank)

    def reduced(self, nbytes: float) -> None:
        """Charge the running rank the CPU time of reducing ``nbytes``."""
        self._cpu(self.current, nbytes * self.net.gamma)

    # -- messages --------------------------------------------------------------------------
    def send(self, src: int, dst: int, t: torch.Tensor) -> None:
        net = self.net
        self._in_time_order(src)  # (what a rank behind sends takes the NICs first)
        b = t.numel() * t.element_size() * self.scale
        self._cpu(src, net.o)
        # Between ranks of one host the receiver copies out while the sender still copies in
        # (the kernel's socket buffer pipelines them): the message is there once the sender's
        # per-message work is done, and the receiver's own copy takes as long as the sender's.
        first_byte = self.clock[src] + net.local_latency
        self._cpu(src, b * net.cpu_beta)
        self.sent_bytes[src] += b
        self.sent_msgs[src] += 1
        self.peers[src].add(dst)
        self.peers[dst].add(src)
        hs, hd = net.host(src), net.host(dst)
        if hs == hd:
            arrive = first_byte
        else:
            depart = max(self.clock[src], self.nic_out[hs])
            self.nic_out[hs] = depart + b * net.nic_beta
            start = max(depart + net.latency, self.nic_in[hd])
            self.nic_in[hd] = arrive = start + b * net.nic_beta
        queue = self.posted.get((dst, src))
        if queue:
            h = queue.popleft()
            self._deliver(h, t, arrive, b)
        else:
            self.unexpected.setdefault((dst, src), deque()).append((t.clone(), arrive, b))

    def _deliver(self, h: _Recv, data: torch.Tensor, arrive: float, b: float) -> None:
        if h.buf.numel() != data.numel() or h.buf.dtype != data.dtype:
            raise RuntimeError(f"sim: rank {h.peer} sent {data.numel()} x {data.dtype}, rank {h.rank} "
                               f"expected {h.buf.numel()} x {h.buf.dtype}")
        h.buf.copy_(data.view(h.buf.shape))
        h.arrive, h.nbytes, h.done = arrive, b, True
        if self.waiting[h.rank] is h:
            self.waiting[h.rank] = None
            self._push(max(self.clock[h.rank], arrive), h.rank)

    def irecv(self, rank: int, peer: int, buf: torch.Tensor) -> _Recv:
        h = _Recv(self, rank, peer, buf)
        queue = self.unexpected.get((rank, peer))
        if queue:
            data, arrive, b = queue.popleft()
            self._deliver(h, data, arrive, b)
        else:
            self.posted.setdefault((rank, peer), deque()).append(h)
        return h

    def wait(self, h: _Recv) -> None:
        r = h.rank
        if not h.done:
            self.waiting[r] = h
            self._switch(r)
        self.clock[r] = max(self.clock[r], h.arrive)
        self._cpu(r, self.net.o + h.nbytes * self.net.cpu_beta)

    # -- scheduling --------------------------------------------------------------------------
    def _push(self, when: float, rank: int) -> None:
        self.seq += 1
        heapq.heappush(self.ready, (when, self.seq, rank))

    def _next(self) -> int | None:
        if not self.ready:
            return None
        when, _, r = heapq.heappop(self.ready)
        self.clock[r] = max(self.clock[r], when)
        return r

    def _switch(self, me: int) -> None:
        """Hand the run to the next rank and block until this one is resumed."""
        nxt = self._next()
        if nxt is None:
            stuck = [r for r in range(self.n) if self.waiting[r] is not None]
            raise SimDeadlock(f"sim: ranks {stuck[:8]} wait for messages nobody sends")
        self._resume(nxt)
        self.turn[me].acquire()
        if self.error is not None:
            raise SimDeadlock("sim: another rank failed")
        self.current = me

    def _resume(self, r: int) -> None:
        self.current = r
        self.turn[r].release()

    def run(self, fn: Callable[[SimComm], Any]) -> list[Any]:
        results: list[Any] = [None] * self.n
        done = threading.Event()

        def body(r: int) -> None:
            self.turn[r].acquire()
            self.current = r
            try:
                results[r] = fn(SimComm(self, r))
            except BaseException as e:  # noqa: BLE001 - reported by run()
                if self.error is None:
                    self.error = e
            self.finished += 1
            if self.error is not None or self.finished == self.n:
                done.set()
                for lock in self.turn:  # wake everyone so that their threads end
                    if lock.locked():
                        lock.release()
                return
            nxt = self._next()
            if nxt is None:
                self.error = SimDeadlock("sim: ranks wait for messages nobody sends")
                done.set()
                for lock in self.turn:
                    if lock.locked():
                        lock.release()
                return
            self._resume(nxt)

        for lock in self.turn:
            lock.acquire()
        old_stack = threading.stack_size(512 * 1024)
        try:
            threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.n)]
            for t in threads:
                t.start()
        finally:
            threading.stack_size(old_stack)
        for r in range(self.n - 1, -1, -1):
            self._push(0.0, r)
        _charging.sim = self
        self._resume(self._next())
        done.wait()
        _charging.sim = None
        if self.error is not None:
            raise self.error
        return results


class _Charging:
    """The wrapper around ``reduce_ops.kernel`` while a simulation runs."""

    sim: Sim | None = None

    def __init__(self) -> None:
        self.real = reduce_ops.kernel

    def kernel(self, op: Any, dtype: torch.dtype) -> Any:
        k = self.real(op, dtype)
        sim = self.sim
        if sim is None:
            return k

        def charged(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            sim.reduced(out.numel() * out.element_size() * sim.scale)
            return k(a, b, out=out)

        return charged


_charging = _Charging()


def simulate(n: int, net: Net, fn: Callable[[SimComm], Any], scale: float = 1.0) -> tuple[Sim, list[Any]]:
    """Run ``fn`` on ``n`` simulated ranks; returns the finished ``Sim`` (clocks, bytes,
    messages and peers per rank) and each rank's result."""
    sim = Sim(n, net, scale)
    old_kernel, old_seg = reduce_ops.kernel, segments.SEGMENT_BYTES
    reduce_ops.kernel = _charging.kernel
    segments.SEGMENT_BYTES = max(1, int(old_seg / scale))
    try:
        return sim, sim.run(fn)
    finally:
        reduce_ops.kernel, segments.SEGMENT_BYTES = old_kernel, old_seg
