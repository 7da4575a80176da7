"""Symmetric allocations: one segment per rank, every rank mapping all of them.

``allocate`` is collective over a group: each rank creates a segment of the same size,
publishes its name (and pid) under ``symm_mem/<group>/<n>/`` in the default store, where
``n`` counts the group's allocations (every rank allocates in the same order, so the keys
line up), maps every peer's segment, says so, and — once every rank has said so — unlinks
every name. From then on nothing of the allocation is in ``/dev/shm``: a rank killed with
``kill -9`` leaks nothing, and the memory goes when the last process drops its mapping.

A rank's segment is its data (page-aligned, so the tensor's ``data_ptr`` is too) followed
by its *signal pad*: one 32-bit counter per (channel, source rank), each on its own cache
line. Rank ``s`` signals rank ``d`` on channel ``c`` by bumping the counter ``(c, s)`` in
``d``'s pad — one writer per word, so no atomics are needed — and waking its futex.

The tensor handed to the caller views the data through a small *pin* object; its views keep
the pin alive, and the pin keeps the ``Mapping`` alive. That is how ``rendezvous(t)``
finds the allocation behind any tensor on it (by storage address, while the pin lives), and
how a persistent allocation (``alloc_id``) knows whether it is still in use: the group keeps
its ``Mapping``, and a new pin over the same memory gives back the same ``data_ptr``.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from datetime import timedelta
from functools import lru_cache
from typing import Any

import torch

from ..errors import DistTimeoutError
from ..groups import _get_default_store
from ..store import PrefixStore, Store
from ..world import World, current_world
from . import _seam

PAGE = 4096
LINE = 64
#: Channels a user may signal on (``put_signal(dst, channel=c)``, ``0 <= c < USER_CHANNELS``).
USER_CHANNELS = 16
#: The internal channel of ``barrier`` (the fused ops use channels 0 and 1 of a workspace
#: allocation of their own).
BARRIER_CHANNEL = USER_CHANNELS
#: The internal channel of the chunked all-reduce ("my slice of chunk k is reduced").
REDUCE_CHANNEL = USER_CHANNELS + 1
CHANNELS = USER_CHANNELS + 2


def _align(x: int, a: int = PAGE) -> int:
    return (x + a - 1) // a * a


def pad_bytes(world_size: int) -> int:
    return _align(CHANNELS * world_size * LINE)


class Mapping:
    """Every rank's segment of one allocation as mapped by this rank, plus its signal counts."""

    def __init__(self, state: Members, segs: list[_seam.Segment], data_bytes: int) -> None:
        self.group_name, self.rank, self.world_size = state.group_name, state.rank, state.size
        self.members, self.timeout, self.watch = state.members, state.timeout, state.watch
        self.segs, self.data_bytes = segs, data_bytes
        self.spin_s, self.oversubscribed = _seam.spin_policy(state.size)
        #: posted[c][d]: signals this rank sent to d on channel c (the value of that word)
        self.posted = [[0] * state.size for _ in range(CHANNELS)]
        #: consumed[c][s]: signals from s on channel c this rank has waited for
        self.consumed = [[0] * state.size for _ in range(CHANNELS)]
        self.lease: weakref.ref | None = None

    def data(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s data region as uint8."""
        return self.segs[rank].view(0, self.data_bytes)

    def word(self, owner: int, channel: int, src: int) -> tuple[_seam.Segment, int]:
        """(segment, word index) of counter (``channel``, ``src``) in ``owner``'s signal pad."""
        off = self.data_bytes + (channel * self.world_size + src) * LINE
        return self.segs[owner], off // 4


class Members:
    """Who takes part in a symmetric allocation and how they meet (``exchange`` reads only
    this): a group with symmetric memory enabled (``GroupState``, through the store) or a
    one-sided window's group (``window/mapped.py``, through the group's own collectives)."""

    group_name: str
    rank: int
    size: int
    members: list[int]  # global rank of each group rank (for messages)
    timeout: float  # seconds
    count: int  # allocations made so far (every rank counts alike)
    watch: _seam.PeerWatch | None

    def meet(self, key: str, value: str, what: str) -> list[str]:
        """Every rank's ``value`` under ``key``, by group rank (collective; ``what`` says
        what a late rank is waited for)."""
        raise NotImplementedError


class GroupState(Members):
    """What symmetric memory keeps per enabled group: its store, ranks, timeout, counters.

    It hangs off the group object itself, so it goes (and with it the persistent
    allocations and the workspace) when ``destroy_process_group`` drops the group: memory
    is unmapped at once unless the caller still holds tensors or handles on it.
    """

    def __init__(self, group_name: str, pg: Any, world: World) -> None:
        self.group_name = group_name
        self.rank, self.size = pg.rank(), pg.size()
        by_global = world.pg_group_ranks.get(pg, {})
        self.members = sorted(by_global, key=by_global.get) or list(range(self.size))
        self.store: Store = PrefixStore(f"symm_mem/{group_name}", _get_default_store())
        options = getattr(pg, "options", None)
        timeout = getattr(options, "timeout", None) or world.timeout or timedelta(minutes=30)
        self.timeout: float = timeout.total_seconds()
        self.count = 0
        self.watch: _seam.PeerWatch | None = None
        self.persistent: dict[int, Mapping] = {}
        self.workspace: Any = None  # the fused ops' scratch handle (see fused)
        #: peers may still read this rank's workspace (their "done" signals are outstanding)
        self.workspace_busy = False

    def meet(self, key: str, value: str, what: str) -> list[str]:
        self.store.set(f"{key}/{self.rank}", value)
        keys = [f"{key}/{p}" for p in range(self.size)]
        _wait(self, keys, what)
        return [v.decode() for v in self.store.multi_get(keys)]


_ATTR = "_pyc10d_symm_mem"


def group_of(group_name: str) -> Any:
    """This rank's process group named ``group_name``; RuntimeError if it has none."""
    pg = current_world().pg_by_name.get(group_name)
    if pg is None or not hasattr(pg, "rank"):
        raise RuntimeError(f"symmetric memory: no process group named {group_name!r} on this rank")
    return pg


def enable(group_name: str) -> GroupState:
    """Create (or return) the state of ``group_name`` in this rank's world."""
    pg = group_of(group_name)
    state = vars(pg).get(_ATTR)
    if state is None:
        if not _seam.available():
            raise RuntimeError("symmetric memory needs Linux on x86-64 with a writable /dev/shm")
        state = GroupState(group_name, pg, current_world())
        vars(pg)[_ATTR] = state
    return state


def is_enabled(group_name: str) -> bool:
    pg = current_world().pg_by_name.get(group_name)
    return pg is not None and _ATTR in vars(pg)


def get_state(group_name: str) -> GroupState:
    """The state of an enabled group; RuntimeError (as torch) if it was never enabled."""
    state = vars(group_of(group_name)).get(_ATTR)
    if state is None:
        raise RuntimeError(
            f"symmetric memory is not enabled for group {group_name!r}: "
            f"call enable_symm_mem_for_group({group_name!r}) first")
    return state


# -- the collective exchange ------------------------------------------------------------------
def exchange(state: Members, nbytes: int) -> Mapping:
    """Allocate ``nbytes`` (rounded up to pages) on every rank of the group and map them all."""
    data_bytes = _align(max(nbytes, 1))
    total = data_bytes + pad_bytes(state.size)
    state.count += 1
    prefix = f"{state.count}/"
    me, n = state.rank, state.size
    seg = _seam.create_segment(total)
    names = [seg.name]
    try:
        entries = [v.split(":") for v in state.meet(f"{prefix}seg", f"{seg.name}:{total}:{os.getpid()}",
                                                   "every rank to create its segment")]
        names = [e[0] for e in entries]
        for p, (_, size, _) in enumerate(entries):
            if int(size) != total:
                raise RuntimeError(
                    f"symmetric memory: rank {state.members[me]} allocated {total} bytes but rank "
                    f"{state.members[p]} allocated {size} in the same collective allocation "
                    f"#{state.count} of group {state.group_name!r}")
        segs = [seg if p == me else _map(state, names[p], total, p) for p in range(n)]
        state.meet(f"{prefix}mapped", "1", "every rank to map the segments")
    finally:
        for name in names:  # mapped by all by now, or failed: no name may outlive this call
            _seam.unlink_segment(name)
    if state.watch is None:
        state.watch = _seam.PeerWatch([int(e[2]) for e in entries], me)
        weakref.finalize(state, state.watch.close)  # its pidfds go with the group
    return Mapping(state, segs, data_bytes)


def _map(state: Members, name: str, total: int, p: int) -> _seam.Segment:
    try:
        return _seam.map_segment(name, total)
    except OSError as e:
        raise RuntimeError(
            f"symmetric memory: rank {state.members[state.rank]} could not map the segment of rank "
            f"{state.members[p]} ({e}); every rank of the group must run on this host") from None


def _wait(state: GroupState, keys: list[str], what: str) -> None:
    try:
        state.store.wait(keys, timedelta(seconds=state.timeout))
    except (DistTimeoutError, TimeoutError) as e:
        late = [state.members[int(k.rsplit("/", 1)[1])] for k in keys if not state.store.check([k])]
        who = ", ".join(f"rank {r}" for r in late)
        raise DistTimeoutError(
            f"symmetric memory: rank {state.members[state.rank]} of group {state.group_name!r} timed "
            f"out after {state.timeout:.1f}s waiting for {what} (missing: {who})") from e


# -- tensors over a mapping -------------------------------------------------------------------
@lru_cache(maxsize=64)
def _pin_type(nbytes: int) -> type:
    """A ctypes array type that can carry attributes and weak references."""
    return type("SymmetricPin", (ctypes.c_char * nbytes,), {})


#: storage address -> weak reference to the pin of a live allocation
_live: dict[int, weakref.ref] = {}


def _forget(ptr: int, ref: weakref.ref) -> None:
    if _live.get(ptr) is ref:
        del _live[ptr]


def lease(mapping: Mapping, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``shape``/``stride`` over this rank's data of ``mapping``, tracked by a pin."""
    seg = mapping.segs[mapping.rank]
    pin = _pin_type(mapping.data_bytes).from_buffer(seg.mm)
    pin.mapping = mapping
    pin.handle = None
    ptr = ctypes.addressof(pin)
    ref = weakref.ref(pin, lambda r, ptr=ptr: _forget(ptr, r))
    _live[ptr] = mapping.lease = ref
    flat = torch.frombuffer(pin, dtype=torch.uint8).view(dtype)
    return flat.as_strided(shape, stride, 0)


def pin_of(t: torch.Tensor) -> Any:
    """The pin of the allocation ``t`` lives in, or None for an ordinary tensor."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
        return None
    ref = _live.get(t.untyped_storage().data_ptr())
    return ref() if ref is not None else None


def needed_bytes(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes a tensor of ``shape`` and ``stride`` spans from its first element."""
    if len(shape) != len(stride):
        raise RuntimeError(f"empty_strided_p2p: shape {shape} and stride {stride} differ in length")
    if any(s == 0 for s in shape):
        return 0
    span = 1 + sum((s - 1) * st for s, st in zip(shape, stride))
    return span * torch.empty((), dtype=dtype).element_size()
