"""What a shared-memory algorithm sees: the group's arena, phases, and a reduction kernel.

A ``ShmComm`` is made per operation by the shm backend. Instead of send/recv, an algorithm
writes into its own slot of a phase, ``post``s the phase, waits for the ranks whose data it
needs, and reads their slots (``transport/shm/arena.py`` explains why two alternating
buffer parities are enough). ``start`` opens the operation: it publishes a descriptor
(collective, dtype, bytes, root) that every rank checks against the others' at the first
``wait_all``, so ranks that disagree fail with a message instead of reading garbage.
"""

from __future__ import annotations

import torch
from torch.autograd import profiler as torch_profiler

from ..errors import DistBackendError
from ..transport.shm.arena import Arena
from ..types import RedOpType, ReduceOp
from . import profiling
from .comm import dtype_code, dtype_name, flat
from .reduce_ops import kernel

OPCODES = {"allreduce": 1, "reduce": 2, "broadcast": 3, "allgather": 4, "reduce_scatter": 5,
           "alltoall": 6, "barrier": 7, "allreduce_symmetric": 8}
_NAMES = {v: k for k, v in OPCODES.items()}
ALIGN_BYTES = 64  # sub-slices that different ranks write start on their own cache line
# Descriptor heads by (collective, dtype, reduce op type, root): a dict look-up per operation
# instead of three codes and the shifts (``ShmComm.start``).
_HEADS: dict[tuple, int] = {}


class ShmComm:
    """Per-operation view of a group's arena; ``rank``/``size`` are group-local."""

    def __init__(self, arena: Arena, deadline: float, op: str, timeout: float) -> None:
        self.arena = arena
        self.rank, self.size = arena.rank, arena.size
        self.reset(deadline, op, timeout)

    def reset(self, deadline: float, op: str, timeout: float) -> None:
        """Make this view the next operation's (a backend keeps one per arena)."""
        self.deadline = deadline
        self.op = op
        self.arena.timeout = timeout
        self._check: int | None = None
        self._exact = True

    def elems(self, dtype: torch.dtype) -> int:
        """Capacity of one rank's slot in elements of ``dtype``."""
        return self.arena.slot_bytes // dtype.itemsize

    def align(self, dtype: torch.dtype) -> int:
        return max(1, ALIGN_BYTES // dtype.itemsize)

    def start(self, collective: str, dtype: torch.dtype | None, nbytes: int, root: int = 0,
              exact: bool = True, red: ReduceOp | None = None) -> int:
        """Open the operation: the first phase number, with this rank's descriptor published.

        ``nbytes`` must agree between ranks when ``exact`` (else only the collective, dtype,
        reduce op and root are compared).
        """
        c = self.arena.next_phase(self.deadline, self.op)
        self.arena.set_descriptor(c, descriptor_head(collective, dtype, red, root), nbytes)
        self._check, self._exact = c, exact
        return c

    def next_phase(self) -> int:
        return self.arena.next_phase(self.deadline, self.op)

    def post(self, c: int) -> None:
        self.arena.post(c)

    def wait_all(self, c: int) -> None:
        if torch_profiler._is_profiler_enabled:  # the wait as its own range (``profiling``)
            with profiling.wait_range("all"):
                self.arena.wait_all(c, self.deadline, self.op)
        else:
            self.arena.wait_all(c, self.deadline, self.op)
        if self._check is not None:
            self._verify(self._check)

    def slots(self, c: int, dtype: torch.dtype) -> torch.Tensor:
        return self.arena.slots(c, dtype)

    def result(self, c: int, dtype: torch.dtype) -> torch.Tensor:
        return self.arena.result(c, dtype)

    def set_meta(self, c: int, values: list[int]) -> None:
        self.arena.set_meta(c, values)

    def meta(self, c: int) -> list[list[int]]:
        return self.arena.meta(c)

    def rows(self, c: int, dtype: torch.dtype, numel: int) -> list[torch.Tensor]:
        """The first ``numel`` elements of every rank's slot of phase ``c``."""
        return self.arena.rows(c, dtype, numel)

    def _verify(self, c: int) -> None:
        self._check = None
        p = self.arena.disagreeing(c, self._exact)
        if p >= 0:
            raise disagreement(self.arena, p, c, self.op)


# -- the lean lane's phase (``backends/lane.py``): what ``start``/``post``/``wait_all`` do, on
# the arena directly, for a step that made every other decision once (the ``*_step`` builders).
def open_phase(arena: Arena, head: int, nbytes: int, deadline: float, timeout: float, op: str) -> int:
    """The operation's phase, its descriptor published (``ShmComm.start`` with ``exact``)."""
    arena.timeout = timeout
    c = arena.phase + 1
    if arena.known < c - 1:
        arena.wait_all(c - 1, deadline, op, arena.caller_spin_s)
    arena.set_descriptor(c, head, nbytes)
    return c


def close_phase(arena: Arena, c: int, deadline: float, op: str) -> None:
    """Post phase ``c``, then ``await_phase``."""
    arena.post(c)
    await_phase(arena, c, deadline, op)


def await_phase(arena: Arena, c: int, deadline: float, op: str) -> None:
    """Wait for every rank's post of phase ``c`` (spinning as long as a blocked caller may,
    ``Arena.caller_spin_s``), and check their descriptors agree."""
    arena.wait_all(c, deadline, op, arena.caller_spin_s)
    p = arena.disagreeing(c, True)
    if p >= 0:
        raise disagreement(arena, p, c, op)


def split_step(arena: Arena, op: str, start, finish):  # closures of a step builder
    """A lane step made of two halves, for a collective whose phase is one post and one wait:
    ``start(x, y, deadline, timeout) -> c`` publishes this rank's part (its descriptor, its
    copy in) and posts phase ``c``; ``finish(x, y, c, deadline)`` waits for every rank's
    post, checks the descriptors and writes the output. Once a rank has posted, its peers
    need nothing more from it for this operation: what ``finish`` does is local.

    ``step(x, y, deadline, timeout)`` runs both (a synchronous call). An asynchronous call
    runs ``start`` on the issuing thread and leaves ``finish`` to whoever needs the result
    first (``backends/lane.py``: the caller's ``wait``, its next operation on the group, or
    the progress thread); ``ready(c, spin)`` says whether ``finish`` would return without
    waiting, looking for up to ``spin`` seconds (``ready(c, True)``: the ordinary spin), and
    ``wait(c, deadline)`` waits with the ordinary spin, as a progress thread should.
    """

    def step(x, y, deadline: float, timeout: float) -> None:
        finish(x, y, start(x, y, deadline, timeout), deadline)

    def wait(c: int, deadline: float) -> None:
        arena.wait_all(c, deadline, op)

    def ready(c: int, spin: bool = False) -> bool:
        return arena.reached_by_all(c, arena.spin_s if spin else 0.0)

    step.start, step.finish, step.ready, step.wait = start, finish, ready, wait
    return step


def input_start(arena: Arena, head: int, nbytes: int, op: str, mine: list[torch.Tensor]):
    """The ``start`` half (``split_step``) of a step whose part is its whole input ``y``,
    copied into this rank's span of the phase's slots (``mine[parity]``, contiguous)."""

    def start(x: torch.Tensor, y: torch.Tensor, deadline: float, timeout: float) -> int:
        c = open_phase(arena, head, nbytes, deadline, timeout, op)
        mine[c & 1].copy_(flat(y))
        arena.post(c)
        return c

    return start


def descriptor_head(collective: str, dtype: torch.dtype | None, red: ReduceOp | None = None, root: int = 0) -> int:
    """The first word of an operation's descriptor (see ``_describe``), cached."""
    key = (collective, dtype, red.op if red is not None else None, root)
    head = _HEADS.get(key)
    if head is None:
        code = 0 if dtype is None else dtype_code(dtype)
        red_code = 0 if red is None else red.op.value + 1
        head = _HEADS[key] = OPCODES[collective] | (code << 8) | (red_code << 16) | (root << 32)
    return head


def disagreement(arena: Arena, p: int, c: int, op: str) -> DistBackendError:
    """The error of rank ``p``'s descriptor of phase ``c`` differing from this rank's."""
    return DistBackendError(
        f"{op}: rank {arena.members[p]} called {_describe(arena.descriptor(p, c))}, rank "
        f"{arena.members[arena.rank]} called {_describe(arena.descriptor(arena.rank, c))} (collective, "
        f"reduce op, root, shape or dtype differs between ranks)"
    )


def _describe(d: tuple[int, int]) -> str:
    """Words of a descriptor: opcode | dtype << 8 | (reduce op + 1) << 16 | root << 32; nbytes."""
    code, nbytes = d
    root, op = code >> 32, code & 0xFF
    name = _NAMES.get(op, f"op {op}")
    red = (code >> 16) & 0xFF
    if red:
        name += f" {RedOpType(red - 1).name}"
    rooted = f" (root {root})" if _NAMES.get(op) in ("broadcast", "reduce") else ""
    return f"{name}{rooted} with {nbytes} bytes of {dtype_name((code >> 8) & 0xFF)}"


def reduce_many(out: torch.Tensor, xs: list[torch.Tensor], op: ReduceOp) -> None:
    """``out = xs[0] (op) xs[1] (op) ...`` elementwise, left to right, one kernel per input.

    The fixed order makes every rank that reduces the same inputs get identical bytes.
    ``out`` may be ``xs[0]`` but no other input.
    """
    if len(xs) == 1:
        if out.data_ptr() != xs[0].data_ptr():
            out.copy_(xs[0])
        return
    reduce_rows(kernel(op, out.dtype), out, xs)


def reduce_rows(fn, out: torch.Tensor, xs: list[torch.Tensor]) -> None:  # a torch kernel
    """``out = xs[0] fn xs[1] fn ...`` with the kernel ``fn`` (``reduce_ops.kernel``), left to
    right: the one order every reader uses (``reduce_many`` and the lean lane's steps)."""
    fn(xs[0], xs[1], out=out)
    for x in xs[2:]:
        fn(out, x, out=out)


#: Up to this many bytes per rank, a lane step gathers the n rows of a phase into a
#: contiguous output with one ``torch.cat(rows, out=...)`` instead of a strided copy into an
#: (n, k) view of it: on the 2-core VM (one process, back to back, diagnostic) 1.8-3.1 us
#: against 3.2-4.7 us from 64 B to 32 KiB a row, level at 64 KiB, slower from 256 KiB.
CAT_BYTES = 32 << 10


def nbytes_of(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
