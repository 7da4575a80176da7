"""What an algorithm sees: its rank and size in the group, and tensor send/receive to peers.

A ``Comm`` is made per operation by a backend. It maps group ranks to transport ranks, puts
the operation's channel on every message, tags each message with the tensor's dtype, and turns
transport failures into errors that name the operation, the ranks and the mismatch.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, NamedTuple

import torch
from torch.autograd import profiler as torch_profiler

from ..errors import (
    DistBackendError,
    DistNetworkError,
    DistTimeoutError,
    with_message,
    with_torch_phrase,
)
from ..transport.base import ANY_SOURCE, RecvHandle, Transport
from ..types import RedOpType, ReduceOp
from . import profiling

DTYPES: list[torch.dtype] = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
    torch.complex32, torch.uint16, torch.uint32, torch.uint64,
    torch.float8_e4m3fn, torch.float8_e5m2,
]
_CODE = {dt: i + 1 for i, dt in enumerate(DTYPES)}
_EMPTY = memoryview(bytearray(0))


def dtype_code(dtype: torch.dtype) -> int:
    return _CODE.get(dtype, 0)


def dtype_name(code: int) -> str:
    return str(DTYPES[code - 1]).replace("torch.", "") if 0 < code <= len(DTYPES) else "bytes"


# -- fingerprints: what a message says about the collective that sent it --------------------
# Every message of a collective carries, above its dtype code, the collective, reduce op and
# root of its sender; a receiver running something else raises, naming both, instead of
# using the bytes (a desync would otherwise return wrong results as success).
_COLLECTIVES = [
    "allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "allgather_coalesced",
    "gather", "scatter", "reduce_scatter", "alltoall", "barrier", "monitored_barrier",
]
_ALIASES = {
    "allgather_into_tensor": "allgather", "_allgather_base": "allgather",
    "allgather_into_tensor_coalesced": "allgather_coalesced", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall_base": "alltoall",
}
_COLL_CODE = {name: i + 1 for i, name in enumerate(_COLLECTIVES)}
_RED_NAMES = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"]


_FP_CACHE: dict[tuple, int] = {}


def fingerprint(opname: str, red: object = None, root: int | None = None) -> int:
    """24 bits: collective (5), reduce op (4, 0 = none), root + 1 (15, 0 = none).

    Runs on every collective: the cache key uses the ``id`` of the reduce op's enum member
    because ``RedOpType`` hashes in Python. Only enum members and None are cached: they live
    for ever, so no other object can have a cached id, and a lookup needs no type test.
    """
    op = red.op if red.__class__ is ReduceOp else red
    fp = _FP_CACHE.get((opname, id(op), root))
    if fp is None:
        fp = _fingerprint(opname, red, root)
        if op is None or op.__class__ is RedOpType:
            _FP_CACHE[(opname, id(op), root)] = fp
    return fp


def _fingerprint(opname: str, red: object, root: int | None) -> int:
    code = _COLL_CODE.get(_ALIASES.get(opname, opname), 0)
    if not code:
        return 0
    red_code = 0
    if red is not None:
        name = getattr(getattr(red, "op", red), "name", str(red)).upper()
        red_code = _RED_NAMES.index(name) + 1 if name in _RED_NAMES else 15
    root_code = 0 if root is None else (root + 1) & 0x7FFF
    return code | (red_code << 5) | (root_code << 9)


def fingerprint_collective(fp: int) -> str:
    """The collective a fingerprint names, by its canonical name (``allgather_into_tensor``
    is ``allgather``)."""
    code = fp & 0x1F
    return _COLLECTIVES[code - 1] if 0 < code <= len(_COLLECTIVES) else f"collective {code}"


def describe_fingerprint(fp: int) -> str:
    red, root = (fp >> 5) & 0xF, fp >> 9
    text = fingerprint_collective(fp)
    if red:
        text += f" {_RED_NAMES[red - 1] if red <= len(_RED_NAMES) else 'custom op'}"
    if root:
        text += f" (root {root - 1})"
    return text


def flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` as one dimension, without a new tensor when it has one already: a view costs
    as much as a small copy does (about 2 us on the 2-core VM), and the lean lane's steps
    (``backends/lane.py``) pay every one of them per call."""
    return t if t.dim() == 1 else t.view(-1)


def byte_view(t: torch.Tensor) -> memoryview:
    """Writable bytes of a contiguous CPU tensor's memory.

    The view keeps ``t`` alive: a receive posted into it may outlive the operation that
    posted it (the operation failed, or a point-to-point receive timed out), and the
    transport's receiver thread may still write into it; without the reference that write
    would land in freed memory.
    """
    n = t.numel() * t.element_size()
    if n == 0:
        return _EMPTY
    raw = (ctypes.c_char * n).from_address(t.data_ptr())
    raw.owner = t  # type: ignore[attr-defined]
    return memoryview(raw).cast("B")


class PendingRecv:
    __slots__ = ("comm", "handle", "tensor", "peer")

    def __init__(self, comm: Comm, handle: RecvHandle, tensor: torch.Tensor, peer: int) -> None:
        self.comm, self.handle, self.tensor, self.peer = comm, handle, tensor, peer

    def wait(self) -> torch.Tensor:
        c = self.comm
        try:
            if torch_profiler._is_profiler_enabled:  # the wait as its own range (``profiling``)
                with profiling.wait_range(self.peer):
                    nbytes, meta = self.handle.wait(c.remaining())
            else:
                nbytes, meta = self.handle.wait(c.remaining())
        except DistTimeoutError as e:
            if isinstance(e, DistNetworkError):  # a silent peer (``keepalive``), not this wait's timeout
                raise with_message(e, f"{c.op}: rank {c.rank}: {with_torch_phrase(e, str(e))}") from None
            source = "any rank" if self.peer == ANY_SOURCE else f"rank {self.peer}"
            detail = f"rank {c.rank} timed out after {c.timeout:.1f}s waiting for data from {source}"
            raise DistTimeoutError(f"{c.op}: {with_torch_phrase(e, detail)}") from None
        except Exception as e:  # noqa: BLE001 - a point-to-point receive's error is not annotated later
            text = str(e)
            if not text.startswith(f"rank {c.rank}: "):  # (a transport's own error names it)
                text = f"rank {c.rank}: {text}"
            raise with_message(e, f"{c.op}: {with_torch_phrase(e, text)}") from None
        if self.peer == ANY_SOURCE:  # the transport matched a sender: name it by group rank
            self.peer = c.ranks.index(self.handle.peer)
        theirs = meta >> 8
        if theirs and c.fingerprint and theirs != c.fingerprint:
            raise DistBackendError(
                f"{c.op}: desync: rank {self.peer} is running {describe_fingerprint(theirs)}, rank "
                f"{c.rank} is running {describe_fingerprint(c.fingerprint)} (the ranks called different "
                f"collectives, or one with a different reduce op or root)"
            )
        expected = len(self.handle.buf)
        want = dtype_code(self.tensor.dtype)
        got = meta & 0xFF
        if nbytes != expected or (got and want and got != want):
            raise DistBackendError(
                f"{c.op}: rank {self.peer} sent {nbytes} bytes of {dtype_name(got)}, rank {c.rank} "
                f"expected {expected} bytes of {dtype_name(want)} (shape or dtype differs between ranks)"
            )
        return self.tensor


class Collective(NamedTuple):
    """What a collective's fingerprint says besides its name: its reduce op and root."""

    red: Any
    root: int | None


class Comm:
    """Per-operation view of a group: ``rank``/``size`` are group-local."""

    #: The operation's reduce op and root (a ``Collective``, or the engine's job, which has
    #: both fields), set while desync detection is on; None (point to point, or the check
    #: off): no fingerprint to carry.
    collective: Any = None
    _fp = -1

    def __init__(
        self, transport: Transport, ranks: list[int], rank: int, channel: int, timeout: float, op: str
    ) -> None:
        self.transport = transport
        self.ranks = ranks
        self.rank = rank
        self.size = len(ranks)
        self.channel = channel
        self.timeout = timeout
        self.op = op
        self.deadline = time.monotonic() + timeout
        self.scratch_pool: dict | None = None

    @property
    def fingerprint(self) -> int:
        """See ``fingerprint()``; made on first use: most operations on shm send no message."""
        fp = self._fp
        if fp < 0:
            c = self.collective
            fp = self._fp = 0 if c is None else fingerprint(self.op, c.red, c.root)
        return fp

    def scratch(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A reusable buffer (fresh pages cost a page fault each; large ones are kept per group)."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        pool = self.scratch_pool
        if pool is None or nbytes < (1 << 20):
            return torch.empty(numel, dtype=dtype)
        buf = pool.get(slot)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8)
            pool[slot] = buf
        return buf[:nbytes].view(dtype)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def send(self, peer: int, t: torch.Tensor) -> None:
        self.transport.send(self.ranks[peer], self.channel, byte_view(t),
                            dtype_code(t.dtype) | (self.fingerprint << 8))

    def irecv(self, peer: int, t: torch.Tensor) -> PendingRecv:
        handle = self.transport.irecv(self.ranks[peer], self.channel, byte_view(t))
        return PendingRecv(self, handle, t, peer)

    def swap_all(self, order: list[int], view: memoryview, dtype: torch.dtype, bufs: list[torch.Tensor],
                 views: list[memoryview]) -> None:
        """Send ``view`` (bytes of a tensor of ``dtype``) to every peer of ``order`` and receive
        each one's message into ``views[p]`` (the bytes of ``bufs[p]``): every receive posted,
        then the sends, then the waits. What a ``PendingRecv`` checks is checked in one
        comparison (same length, same message word); anything else, or a failure, goes
        through ``PendingRecv.wait``, which says what differs."""
        tr, ranks, ch = self.transport, self.ranks, self.channel
        word = _CODE.get(dtype, 0) | (self.fingerprint << 8)
        handles = [tr.irecv(ranks[p], ch, views[p]) for p in order]
        for p in order:
            tr.send(ranks[p], ch, view, word)
        deadline = self.deadline
        for h, p in zip(handles, order):
            try:
                nbytes, meta = h.wait(deadline - time.monotonic())
            except Exception:  # noqa: BLE001 - said below, in the words of every receive
                nbytes = meta = -1
            if nbytes != len(views[p]) or meta != word:
                PendingRecv(self, h, bufs[p], p).wait()

    def irecv_any(self, t: torch.Tensor) -> PendingRecv:
        """A receive from whichever group member sends first on this channel."""
        handle = self.transport.irecv(ANY_SOURCE, self.channel, byte_view(t))
        return PendingRecv(self, handle, t, ANY_SOURCE)

    def recv(self, peer: int, t: torch.Tensor) -> torch.Tensor:
        return self.irecv(peer, t).wait()

