"""The shared-memory backend (``backend="shm"``) and the host identity ``"auto"`` groups ranks by.

``ShmBackend`` is the collective engine over a ``ShmTransport``: every collective works
through the transport's rings with the generic algorithms, and the hot ones run on the
group's *arena* instead — a segment of per-rank slots and phase counters where ranks copy
in, reduce with torch kernels straight out of each other's slots, and copy out (see
``algorithms.select_shm``): all_reduce, reduce, all_gather (every variant),
reduce_scatter_tensor, broadcast, all_to_all (both variants) and barrier. No tensor is ever
pickled.

The arena of a group is created on its first collective: group rank 0 creates the segment
and sends its name over the rings, the others map it, and the name is unlinked as soon as
the first phase shows that everyone has. Subgroups that share the world's transport get
arenas of their own the same way.
"""

from __future__ import annotations

import os
import socket
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from .. import algorithms as algo
from .. import settings
from ..algorithms.comm import flat
from ..algorithms.reduce_ops import finish, premultiply
from ..errors import DistBackendError, DistInputError
from ..store.base import Store
from ..transport import cpus
from ..transport.shm import ShmTransport, futex
from ..transport.shm.arena import Arena
from ..transport.shm.segment import Segment, new_name
from ..transport.shm.segment import available as shm_dir_available
from ..types import RedOpType
from .accepts import reduction
from .engine import Engine
from .options import Options
from .staging import host, writeback

_NAME_BYTES = 128
#: One rank's slot in bytes; None picks ``slot_bytes``'s default. Tests set it tiny to force
#: the multi-chunk paths.
SLOT_BYTES: int | None = None

#: All-reduces of at least this many bytes are offered to the group's symmetric memory, when
#: it has any (``ShmBackend.serve_symmetric``); smaller ones take the arena either way.
SYMMETRIC_MIN_BYTES = 64 << 10
_SYMMETRIC_OPS = {RedOpType.SUM: "sum", RedOpType.AVG: "avg", RedOpType.MAX: "max", RedOpType.MIN: "min",
                  RedOpType.PRODUCT: "product"}


def slot_bytes(size: int) -> int:
    """One rank's slot: ``PYC10D_SHM_SLOT_BYTES`` (default 1 MiB), less for big groups."""
    if SLOT_BYTES is not None:
        return max(64, SLOT_BYTES // 64 * 64)
    want = settings.SHM_SLOT_BYTES.get()
    cap = settings.SHM_ARENA_BUDGET.get() // (2 * size + 2)
    return max(64 << 10, min(want, cap) // 4096 * 4096)


class ShmBackend(Engine):
    """Every collective of a group of ranks on one host, over shared memory."""

    backend_name = "shm"

    def __init__(
        self, transport: Any, ranks: list[int], rank: int, group_name: str,
        options: Options | None = None, owns_transport: bool = False,
    ) -> None:
        super().__init__(transport, ranks, rank, group_name, options, owns_transport)
        self.options.backend = "shm"
        self._arena: Arena | None = None
        self._sc: algo.ShmComm | None = None  # the arena's view, refreshed for each operation
        #: Set by ``serve_symmetric`` once the group has symmetric memory: ``symmetric_allreduce(t,
        #: reduce_op_name, group_name)`` returns a function reducing ``t`` in place straight out
        #: of the peers' memory when ``t`` lives in this group's symmetric memory, else None.
        self.symmetric_allreduce: Callable[[torch.Tensor, str, str], Callable[[], Any] | None] | None = None

    @classmethod
    def create(cls, store: Store, rank: int, size: int, timeout: timedelta, group_name: str,
               place_as: tuple[int, int] | None = None) -> ShmBackend:
        """``place_as``: this rank's index among the job's ranks on this machine's kernel and
        their number, where other hosts of the job share it (hier: ``kernel_slot``)."""
        transport = ShmTransport(store, rank, size, timeout)
        # Each rank of the host on CPUs of its own (``cpus.place``; ``PYC10D_BIND=none`` not):
        # left to the kernel, some jobs ran large collectives at half speed throughout.
        ref = weakref.ref(transport)
        mine = cpus.place(*(place_as or (rank, size)), transport.pids,
                          alive=lambda: (t := ref()) is not None and not t.closed)
        if mine is not None and torch.get_num_threads() > len(mine):
            torch.set_num_threads(len(mine))  # (torch sized its pool for the whole machine)
        return cls(transport, list(range(size)), rank, group_name, Options(timeout), owns_transport=True)

    # -- the arena ----------------------------------------------------------------------
    def _shm(self, comm: algo.Comm) -> algo.ShmComm:
        sc = self._sc
        if sc is not None and sc.arena is self._arena:  # one operation at a time: reuse it
            sc.reset(comm.deadline, comm.op, comm.timeout)
            return sc
        if self._arena is None:
            self._arena = self._open_arena(comm)
            mailbox, key = self.transport.mailbox, self.group_key
            self._arena.poll_error = lambda: mailbox.aborted.get(key)
        sc = self._sc = algo.ShmComm(self._arena, comm.deadline, comm.op, comm.timeout)
        return sc

    def _open_arena(self, comm: algo.Comm) -> Arena:
        """Group rank 0 creates the segment and sends its name through the op's channel; the
        name is unlinked once a first phase shows that every member mapped it."""
        n = comm.size
        msg = torch.zeros(_NAME_BYTES, dtype=torch.uint8)
        if comm.rank != 0:
            comm.recv(0, msg)
            name, slot = bytes(msg.tolist()).rstrip(b"\0").decode().split(":")
            try:
                seg = Segment(name, Arena.nbytes(n, int(slot)), create=False)
            except OSError as e:
                raise self._setup_error(comm, name, e) from None
            return Arena(seg, comm.rank, n, int(slot), self.transport.watch, self.ranks)
        seg, slot = self._create_segment(n)
        try:
            text = f"{seg.name}:{slot}".encode()
            msg[:len(text)] = torch.tensor(list(text), dtype=torch.uint8)
            for p in range(1, n):
                comm.send(p, msg)
        except BaseException:
            seg.unlink()
            raise
        return Arena(seg, 0, n, slot, self.transport.watch, self.ranks)

    def _setup_error(self, comm: algo.Comm, name: str, error: OSError) -> BaseException:
        """Why the segment could not be mapped: usually rank 0 already gave up (its abort
        message follows the name on the same ring, so wait for it briefly)."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            why = self.transport.mailbox.aborted.get(self.group_key)
            if why is not None:
                return type(why)(f"{comm.op}: rank {self.ranks[comm.rank]}: {why}")
            time.sleep(0.01)
        return DistBackendError(
            f"{comm.op}: rank {self.ranks[comm.rank]} could not map shared memory {name}: {error}")

    def _create_segment(self, n: int) -> tuple[Segment, int]:
        slot = slot_bytes(n)
        while True:
            try:
                return Segment(new_name("g"), Arena.nbytes(n, slot), create=True), slot
            except OSError:
                if slot <= 64 << 10:
                    raise
                slot = slot // 2 // 64 * 64

    # -- collectives on the arena -----------------------------------------------------------
    def _allreduce_dense(self, comm: algo.Comm, tensors: list[torch.Tensor], red: Any,
                         src: torch.Tensor | None = None) -> None:
        t = tensors[0]
        h = host(t)
        # Out of place (``src``): the arena reads the input straight from ``src``; the other
        # paths below work in place, on a copy of it.
        direct_src = (src is not None and red.op != RedOpType.PREMUL_SUM and t.is_cpu and t.is_contiguous()
                      and src.is_cpu and src.is_contiguous())
        if comm.size == 1 or len(tensors) != 1 or (src is not None and not direct_src):
            return super()._allreduce_dense(comm, tensors, red, src)
        premultiply(h, red)
        sc = self._shm(comm)
        nbytes = h.nbytes
        direct = None
        symmetric = self.symmetric_allreduce
        if nbytes >= SYMMETRIC_MIN_BYTES and symmetric is not None and red.op in _SYMMETRIC_OPS:
            if src is not None:
                h.copy_(src)
                src = None
            direct = symmetric(h, _SYMMETRIC_OPS[red.op], self.group_name)
        if direct is not None:
            # Every rank must take this path: a phase whose descriptors say so fails, naming
            # the ranks, when one of them passed an ordinary tensor instead.
            c = sc.start("allreduce_symmetric", h.dtype, nbytes, red=red)
            sc.post(c)
            sc.wait_all(c)
            direct()
        else:
            fn = algo.select_shm("allreduce", comm.size, nbytes, sc.arena.slot_bytes)
            fn(sc, flat(h), red, src=None if src is None else flat(src))
            finish(h, red, comm.size)
        writeback(t, h)

    def serve_symmetric(self, plan: Callable[[torch.Tensor, str, str], Callable[[], Any] | None]) -> None:
        """This group has symmetric memory (``enable_symm_mem_for_group``): from now on its
        all_reduces of ``SYMMETRIC_MIN_BYTES`` and more ask ``plan`` whether the tensor is one
        of the group's symmetric tensors, which are reduced out of the peers' memory. Groups
        without symmetric memory never ask (the state is this engine's, not a module's)."""
        self.symmetric_allreduce = plan
        self._lane_check_bytes = SYMMETRIC_MIN_BYTES

    def _lane_declines(self, t: torch.Tensor) -> bool:
        """A symmetric tensor of this group takes ``_allreduce_dense``, which reduces it out
        of the peers' memory; an ordinary one stays on the lane."""
        symmetric = self.symmetric_allreduce
        return symmetric is not None and symmetric(t, "sum", self.group_name) is not None

    def _lane_step(self, key: tuple, x: torch.Tensor | None, y: torch.Tensor | None, red: Any, root: int) -> Any:
        """The lean lane's steps (``lane.py``): the single-phase exchange of each collective,
        for calls that take it on the general path too (one slot's worth, no widening, not
        complex); False for every other key of the collective."""
        sc = self._sc
        if sc is None or sc.arena is not self._arena:
            return None  # the group's first operation opens the arena
        if key[0] == "barrier":
            return algo.barrier_shm_step(sc) if self._size > 1 else False
        assert x is not None
        n, slot, dtype = self._size, sc.arena.slot_bytes, x.dtype
        if n == 1 or x.numel() == 0 or x.is_complex() or (y is not None and y.dtype != dtype):
            return False
        try:
            if red is not None and reduction(key[0], red, dtype) is not None:
                return False  # widened on the wire
        except DistInputError:
            return False  # refused: the general path says why, every call
        kind = key[0]
        if kind == "allreduce":
            if algo.select_shm("allreduce", n, x.numel() * dtype.itemsize, slot) is not algo.allreduce_shm_flat:
                return False
            return algo.allreduce_shm_flat_step(sc, red, dtype, x.shape)
        if kind == "broadcast":
            return algo.broadcast_shm_flat_step(sc, dtype, x.numel(), root)
        assert y is not None
        if kind == "allgather":
            k = y.numel()
            return algo.allgather_shm_flat_step(sc, dtype, k) if x.numel() == k * n else False
        if kind == "reduce_scatter":
            k = x.numel()
            return algo.reduce_scatter_shm_flat_step(sc, red, dtype, k) if y.numel() == k * n else False
        if kind == "alltoall":  # even split by dim 0: k elements to and from every rank
            even = x.dim() and y.dim() and x.shape[0] % n == 0 and y.shape[0] % n == 0 and x.numel() == y.numel()
            return algo.alltoall_shm_even_step(sc, dtype, y.numel() // n) if even else False
        return False

    def _gather_into(self, comm: algo.Comm, out: torch.Tensor, inp: torch.Tensor) -> None:
        if comm.size == 1:
            return super()._gather_into(comm, out, inp)
        k = inp.numel()
        sc = self._shm(comm)
        fn = algo.select_shm("allgather", comm.size, k * inp.element_size(), sc.arena.slot_bytes)
        fn(sc, flat(host(inp)), flat(out).view(comm.size, k))

    def _rs_one(self, comm: algo.Comm, output: torch.Tensor, input: torch.Tensor, red: Any) -> None:
        if comm.size == 1:
            return super()._rs_one(comm, output, input, red)
        hin = host(input)
        if red.op == RedOpType.PREMUL_SUM:
            hin = premultiply(hin.clone(), red)
        h = host(output)
        k = h.numel()
        sc = self._shm(comm)
        fn = algo.select_shm("reduce_scatter", comm.size, hin.numel() * hin.element_size(),
                             sc.arena.slot_bytes)
        fn(sc, flat(hin).view(comm.size, k), flat(h), red)
        finish(h, red, comm.size)
        writeback(output, h)

    def _alltoall_blocks(self, comm: algo.Comm, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        if comm.size == 1:
            return super()._alltoall_blocks(comm, ins, outs)
        sc = self._shm(comm)
        fn = algo.select_shm("alltoall", comm.size, 0, sc.arena.slot_bytes)
        fn(sc, [t.reshape(-1) for t in ins], [t.view(-1) for t in outs])

    def _broadcast_flat(self, comm: algo.Comm, t: torch.Tensor, root: int) -> None:
        if comm.size == 1:
            return
        sc = self._shm(comm)
        algo.select_shm("broadcast", comm.size, t.numel() * t.element_size(), sc.arena.slot_bytes)(sc, t, root)

    def _reduce_flat(self, comm: algo.Comm, t: torch.Tensor, root: int, red: Any) -> None:
        if comm.size == 1:
            return
        sc = self._shm(comm)
        algo.select_shm("reduce", comm.size, t.numel() * t.element_size(), sc.arena.slot_bytes)(sc, t, red, root)

    def _barrier(self, comm: algo.Comm) -> None:
        if comm.size == 1:
            return
        sc = self._shm(comm)
        algo.select_shm("barrier", comm.size, 0, sc.arena.slot_bytes)(sc)

    # -- failure and shutdown -----------------------------------------------------------
    def fail_group(self, error: BaseException, reason: str | None = None) -> None:
        if self._broken is None and self._arena is not None:
            self._arena.abort(reason or str(error))  # its error says "aborted by rank N: ..."
        super().fail_group(error, reason)

    def shutdown(self) -> None:
        arena = self._arena
        if arena is not None and not self._closed and self._pending:
            arena.cancel(DistBackendError(
                f"process group {self.group_name!r} was destroyed with operations pending"))
        super().shutdown()
        # Two threads may shut one group down at once (torchft aborts from a watchdog thread
        # while the owner shuts down): exactly one of them takes the arena and closes it.
        with self._lock:
            arena, self._arena = self._arena, None
        if arena is not None:
            arena.close()


def host_identity() -> str:
    """Equal on two processes exactly when they can share memory through ``/dev/shm``."""
    if not (futex.available() and shm_dir_available()):
        return f"no-shm:{os.getpid()}:{socket.gethostname()}"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}/{os.stat('/dev/shm').st_dev}"

