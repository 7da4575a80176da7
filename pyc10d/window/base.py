"""What every one-sided window does the same way: the checks, the collective exchange of the
registered tensors' shapes, and the Works.

A window is made and given a tensor collectively; after that it is one-sided: ``put`` writes
into a peer's registered tensor without that peer calling anything, and ``signal`` /
``wait_signal`` say when the writes have landed. What a caller may rely on (torch's
``Window`` states no more; NCCL's is the only other implementation):

* ``put(t, dst, off)`` writes ``t``'s elements, flat, into rank ``dst``'s registered tensor from
  element ``off``; ``t`` has the target's dtype. The Work it returns is complete: ``t`` may be
  reused at once. Puts from one rank to one target land in the order they were issued.
* Signals count: every ``signal(dst)`` from ``src`` releases exactly one ``wait_signal(src)``
  on ``dst``, whichever runs first. The puts ``src`` issued to ``dst`` before a signal have
  landed in ``dst``'s tensor when the ``wait_signal`` that signal releases returns.
* ``map_remote_tensor(r)``: rank ``r``'s registered tensor itself, in its shape and dtype (a
  write to it is a write into ``r``'s tensor; the caller orders reads and writes with
  signals), where the memory can be mapped: on one host's shared memory.
* Wrong use (no tensor registered, a rank outside the group, an offset past the end of the
  target, a dtype other than the target's, a tensor not on the CPU or not contiguous) raises
  ``DistInputError`` (a ``RuntimeError`` and a ``ValueError``) on the calling rank before any
  byte moves: the window and the group stay usable.

``mapped.py`` and ``messages.py`` say how each kind moves the bytes; a subclass supplies
``_register``, ``_deregister``, ``_put``, ``_signal``, ``_wait_signal``, ``_poll_signal``
and ``_map``.
"""

from __future__ import annotations

import enum
import threading
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

import torch

from .. import threads
from ..backends.work import CompletedWork, Work
from ..errors import DistInputError, DistTimeoutError


class WindowAccessType(enum.Enum):
    """torch's ``WindowAccessType``: UNIFIED, one coherent view of the memory (pyc10d's, always)."""

    UNIFIED = 0
    SEPARATE = 1


class WindowAttr:
    """torch's ``WindowAttr``."""

    def __init__(self, access_type: WindowAccessType = WindowAccessType.UNIFIED) -> None:
        self.access_type = access_type


class Shape(NamedTuple):
    """What a rank registered: its tensor's dtype and shape (exchanged as text)."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def encode(self) -> bytes:
        return f"{str(self.dtype).removeprefix('torch.')}|{','.join(map(str, self.shape))}".encode()

    @staticmethod
    def decode(data: bytes) -> Shape:
        dtype, dims = data.decode().split("|")
        return Shape(getattr(torch, dtype), tuple(int(d) for d in dims.split(",") if d))


def gather_bytes(engine: Any, data: bytes) -> list[bytes]:
    """Every rank's ``data``, by group rank, through the group's own all_gather (collective:
    in order with the group's other operations, failing as they fail)."""
    n = engine.size()
    sizes = torch.zeros(n, dtype=torch.int64)
    engine.allgather_into_tensor_coalesced([sizes], [torch.tensor([len(data)], dtype=torch.int64)]).wait()
    width = max(1, int(sizes.max()))
    mine = torch.zeros(width, dtype=torch.uint8)
    if data:
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = torch.empty(width * n, dtype=torch.uint8)
    engine.allgather_into_tensor_coalesced([out], [mine]).wait()
    return [out[i * width: i * width + int(sizes[i])].numpy().tobytes() for i in range(n)]


#: engine -> windows made on it so far (every rank makes them in the same order, so the count
#: names a window alike on every rank).
_made: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _check_tensor(op: str, tensor: Any) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise DistInputError(f"Window.{op}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu" or tensor.layout != torch.strided:
        raise DistInputError(f"Window.{op}: pyc10d's windows hold dense CPU tensors, got a "
                             f"{tensor.layout} tensor on {tensor.device}")
    if not tensor.is_contiguous():
        raise DistInputError(f"Window.{op}: the tensor must be contiguous")


class Window:
    """One rank's handle on a group's one-sided window (``_new_window``)."""

    kind = ""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.rank, self.size, self.group_name = engine.rank(), engine.size(), engine.group_name
        self.number = _made.get(engine, 0)
        _made[engine] = self.number + 1
        self.peers: list[Shape] | None = None  # what each rank registered, by group rank
        self._held: Any = None  # the registered tensor (``owning``) or a weak reference to it

    def __repr__(self) -> str:
        return (f"<Window #{self.number} of group {self.group_name!r} ({self.kind}) rank={self.rank} "
                f"size={self.size} registered={self.peers is not None}>")

    # -- collective ----------------------------------------------------------------------------
    def tensor_register(self, tensor: torch.Tensor, owning: bool = True) -> None:
        """Register ``tensor`` as this rank's part of the window (collective). With ``owning``
        the window keeps the tensor alive as long as the window is."""
        if self.peers is not None:
            raise DistInputError("Window.tensor_register: a tensor is already registered with this "
                                 "window; tensor_deregister it first")
        _check_tensor("tensor_register", tensor)
        self.peers = self._register(tensor)
        self._held = tensor if owning else weakref.ref(tensor)

    def tensor_deregister(self) -> None:
        """Give the registered tensor back (collective): after it, no peer writes into it."""
        self._need("tensor_deregister")
        self._deregister()
        self.peers, self._held = None, None

    def shape_exchange(self, tensor: torch.Tensor) -> list[Shape]:
        """What every rank registers (collective)."""
        mine = Shape(tensor.dtype, tuple(tensor.shape))
        return [Shape.decode(b) for b in gather_bytes(self.engine, mine.encode())]

    @property
    def tensor(self) -> torch.Tensor | None:
        """The registered tensor (None when not registered, or gone when not owned)."""
        held = self._held
        return held() if isinstance(held, weakref.ref) else held

    # -- one-sided -----------------------------------------------------------------------------
    def put(self, tensor: torch.Tensor, dst_rank: int, target_offset_nelems: int, async_op: bool = False,
            opts: Any = None) -> Work:
        """Write ``tensor``'s elements into rank ``dst_rank``'s registered tensor from element
        ``target_offset_nelems``."""
        peers = self._need("put")
        dst = self._rank_arg("put", dst_rank)
        _check_tensor("put", tensor)
        target = peers[dst]
        if tensor.dtype != target.dtype:
            raise DistInputError(f"Window.put: the tensor is {tensor.dtype} but rank {dst} registered "
                                 f"{target.dtype}")
        off, n = int(target_offset_nelems), tensor.numel()
        if off < 0 or off + n > target.numel:
            raise DistInputError(f"Window.put: {n} elements at offset {off} do not fit in rank {dst}'s "
                                 f"window of {target.numel} elements")
        if n:
            self._put(tensor.reshape(-1), dst, off)
        return CompletedWork("put", [tensor])

    def signal(self, peer_rank: int, async_op: bool = False, opts: Any = None) -> Work:
        """Release one ``wait_signal`` for this rank on ``peer_rank`` (never blocks)."""
        self._need("signal")
        self._signal(self._rank_arg("signal", peer_rank))
        return CompletedWork("signal", [])

    def wait_signal(self, peer_rank: int, async_op: bool = False, opts: Any = None) -> Work:
        """Wait for one more signal from ``peer_rank`` than waited for so far; with
        ``async_op`` the returned Work waits (``wait``, ``is_completed``, its future)."""
        self._need("wait_signal")
        src = self._rank_arg("wait_signal", peer_rank)
        timeout = self.engine.op_timeout(opts)
        if not async_op:
            self._wait_signal(src, timeout)
            return CompletedWork("wait_signal", [])
        return SignalWork(self.group_name, lambda: self._wait_signal(src, timeout),
                          lambda: self._poll_signal(src), timeout)

    def map_remote_tensor(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s registered tensor, mapped into this process."""
        self._need("map_remote_tensor")
        return self._map(self._rank_arg("map_remote_tensor", rank))

    def get_attr(self, peer_rank: int) -> WindowAttr:
        self._rank_arg("get_attr", peer_rank)
        return WindowAttr()

    # -- checks --------------------------------------------------------------------------------
    def _need(self, op: str) -> list[Shape]:
        if self.peers is None:
            raise DistInputError(f"Window.{op}: no tensor is registered with this window of group "
                                 f"{self.group_name!r} (call tensor_register, or pass a tensor to _new_window)")
        return self.peers

    def _rank_arg(self, op: str, rank: Any) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.size:
            raise DistInputError(f"Window.{op}: rank {rank!r} is not in group {self.group_name!r} "
                                 f"(its ranks are 0..{self.size - 1})")
        return rank

    def timed_out(self, src: int, timeout: float) -> DistTimeoutError:
        return DistTimeoutError(f"Window.wait_signal: rank {self.rank} of group {self.group_name!r}: "
                                f"Timed out after {timeout:.1f}s waiting for a signal from rank {src}")

    # -- what a kind of window supplies ---------------------------------------------------------
    def _register(self, tensor: torch.Tensor) -> list[Shape]:
        raise NotImplementedError

    def _deregister(self) -> None:
        raise NotImplementedError

    def _put(self, flat: torch.Tensor, dst: int, offset: int) -> None:
        raise NotImplementedError

    def _signal(self, dst: int) -> None:
        raise NotImplementedError

    def _wait_signal(self, src: int, timeout: float) -> None:
        raise NotImplementedError

    def _poll_signal(self, src: int) -> bool:
        """Take one signal from ``src`` if one is there, without waiting."""
        raise NotImplementedError

    def _map(self, rank: int) -> torch.Tensor:
        raise NotImplementedError


class SignalWork(Work):
    """An asynchronous ``wait_signal``: it waits when asked (``wait``), looks without waiting
    (``is_completed``), or on a thread of its own once a future must complete by itself."""

    def __init__(self, group_name: str, take: Callable[[], None], poll: Callable[[], bool],
                 timeout: float) -> None:
        super().__init__("wait_signal", [])
        self._group_name, self._wait_for, self._poll, self._timeout = group_name, take, poll, timeout
        self._taking = threading.Lock()  # one taker of the signal

    def _take(self, block: bool) -> None:
        with self._taking:
            if self._finished:
                return
            if not block:
                if self._poll():
                    self.finish()
                return
            try:
                self._wait_for()
            except BaseException as e:  # noqa: BLE001 - kept in the Work, raised by wait
                self.finish(e)
            else:
                self.finish()

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        if not self._finished:
            secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
            if secs is not None and 0 < secs < self._timeout:
                self.get_future()  # a bounded wait must be able to give up: a thread takes it
                return super().wait(timeout)
            self._take(block=True)
        return super().wait(timeout)

    def is_completed(self) -> bool:
        if not self._finished:
            self._take(block=False)
        return self._finished

    def get_future(self) -> torch.futures.Future:
        if not self._finished and not self._taking.locked():
            threads.start(self._take, f"pyc10d-window-{self._group_name}", args=(True,))
        return super().get_future()
