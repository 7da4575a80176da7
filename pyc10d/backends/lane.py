"""The lean lane: a synchronous collective that repeats an earlier call's shape, without the
general path's layers (all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast,
all_to_all_single split evenly, barrier).

An 8-byte all_reduce through the general path (``ops.allreduce`` -> ``_submit`` -> ``_run`` ->
the backend -> ``select_shm`` -> the algorithm -> ``ShmComm`` -> the arena) made 94 Python
calls, and on this kind of machine each costs about half a microsecond: 60-70 us a call
where the exchange itself (two processes, one shared page, a torch copy in and a kernel
out) takes about 12. Everything those layers decide for a given (reduce op, dtype, shape)
on a given group is decided again at every call and comes out the same. So a backend that
can may build, at the first call of each such key, a *step*: a closure of the algorithm's
phase exchange with every verdict made (dtype accepted for the op, no widening, the
algorithm for that size, the descriptor word, the arena rows); later calls run only it.

The public API (``collectives``) and the plugin (``torch_backend.group``) offer each
synchronous call to the entries below first; an entry either runs it or returns 0 having
done nothing, and the caller goes on to the general path. On the 2-core machine an 8-byte
all_reduce at n=2 made 34 Python calls on the lane (94 on the general path; cProfile) and
took 21.6-33.5 us against 64.9 the same day (`python -m pyc10d.bench.floor`, checked, Gloo
667-964 us beside it); a 64 KiB one, now a single flat exchange on the lane, 45 us against
178 for the general path's reduce-scatter + all-gather before (`bench --peer mpi`, checked).

What a call still does, in line here, is what makes it the same operation as on the general
path: the group's order (it runs only when nothing of the group is queued or running, else
the general path queues it), its sequence number, the flight recorder's entry and end time,
the watchdog's progress fields, the deadline, and a failure handled exactly as ``_run``
handles it (named, explained, recorded, the group aborted). Ranks check each other's
descriptors at every operation as before, so a rank on the lane and a rank on the general
path run the same exchange. The lane is taken only when nobody could tell the difference:
a profiler off (it shows the general path's ranges), a default timeout, the group usable
and idle.

An asynchronous call of such a key is *started* here (``_start_step``): a step of one post
and one wait (``shm_comm.split_step``) posts this rank's part on the issuing thread, and its
``finish`` (the peers' posts, the output) waits in ``_started`` until the result is needed
(``StartedWork``). Through the general path the same call is a job the progress thread is
woken for, then a second hand-off back to the waiter: 97-188 us an 8 B-64 KiB call at n=2
against 15-55 us synchronous, in ``python -m pyc10d.bench --mode async`` (checked); started
here, 28-123 us in the same benchmark (docs/performance.md, "Asynchronous calls").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.autograd import profiler as torch_profiler

from ..types import RedOpType, ReduceOp
from .accepts import MOVABLE, support
from .base import EngineCore, Job
from .work import StartedWork, Work

#: The reduce ops a lane serves, by the ``id`` of every object that names one (pyc10d's
#: ``ReduceOp.X`` and ``RedOpType.X`` members, which live for ever): one dict look-up a call,
#: no hashing of an Enum. PREMUL_SUM carries a factor per call: the general path keeps it.
LANE_OPS: dict[int, ReduceOp] = {}
for _t in RedOpType:
    if _t not in (RedOpType.PREMUL_SUM, RedOpType.UNUSED):
        LANE_OPS[id(_t)] = LANE_OPS[id(getattr(ReduceOp, _t.name))] = getattr(ReduceOp, _t.name)

_strided = torch.strided
_Tensor = torch.Tensor

#: A step: ``step(x, y, deadline, timeout)`` runs one operation's exchange; ``x`` is its
#: output (what the flight recorder describes; None for a barrier), ``y`` its input or None
#: (in place).
Step = Callable[[Any, Any, float, float], None]


class Started(NamedTuple):
    """An asynchronous call started on the lane and not finished (``LaneOps._started``)."""

    work: StartedWork
    step: Step  # its ``finish``, ``ready`` and ``wait`` (``shm_comm.split_step``)
    x: Any
    y: Any
    c: int  # the phase it posted
    deadline: float
    timeout: float
    red: ReduceOp | None
    root: int
    since: float  # when it started (monotonic)


def _plain(t: Any) -> bool:
    """A tensor the steps take as it is: a dense, contiguous CPU tensor needing no gradient
    (anything else is staged by the general path)."""
    return (t.__class__ is _Tensor and t.layout is _strided and t.is_cpu and not t.requires_grad
            and t.is_contiguous())


def _accepted(x: torch.Tensor | None, y: torch.Tensor | None, red: ReduceOp | None) -> bool:
    """What ``accepts`` promises for the call's tensors and reduction (one key's first call)."""
    for t in (x, y):
        if t is not None and t.dtype not in MOVABLE:
            return False
    return red is None or x is None or support((y if y is not None else x).dtype, red.op) is not False


class LaneOps(EngineCore):
    """The ``lean_*`` entries; a backend supplies the steps (``_lane_step``)."""

    _steps: dict | None = None
    #: An all_reduce of at least this many bytes is offered to ``_lane_declines`` first: a
    #: backend whose path for it depends on the tensor itself, not only on its key (shm:
    #: a tensor in symmetric memory is reduced out of the peers' memory instead).
    _lane_check_bytes = 1 << 62

    def _lane_declines(self, t: torch.Tensor) -> bool:
        return False

    def _lane_step(self, key: tuple, x: torch.Tensor | None, y: torch.Tensor | None, red: ReduceOp | None,
                   root: int) -> Step | bool | None:
        """The step for operations of ``key`` (its first field names the collective), asked
        once per key with the first call's tensors. False: never (the general path runs
        every such call); None: not yet, ask again next call."""
        return False

    def _lane(self, key: tuple, opname: str, x: torch.Tensor | None, y: torch.Tensor | None,
              red: ReduceOp | None, root: int, wait: bool = True) -> Any:
        steps = self._steps
        if steps is None:
            steps = self._steps = {}
        step = steps.get(key)
        if step is None:
            step = self._lane_step(key, x, y, red, root)
            if step is None:  # not yet (e.g. no arena before the group's first operation)
                return 0
            # The table, once per key that has a step: a call it refuses takes the general
            # path, which raises naming the argument (an empty tensor too: the lane would
            # move 0 bytes).
            if step is not False and not _accepted(x, y, red):
                step = False
            steps[key] = step
        if step is False or torch_profiler._is_profiler_enabled:  # the profiler shows the general path
            return 0
        if wait:
            return self._run_step(opname, red, root, x, y, step)
        return self._start_step(opname, red, root, x, y, step)

    # Each entry runs a synchronous call on the lane and returns its sequence number, or 0
    # having done nothing (the caller takes the general path). With ``wait=False`` (an
    # asynchronous call) it starts the operation and returns its ``StartedWork``, or 0. The
    # keys hold what the step depends on; what they leave out (contiguity, device, gradient)
    # is checked every call.
    def lean_allreduce(self, t: torch.Tensor, op: Any, wait: bool = True) -> Any:
        """In-place all_reduce of ``t`` with ``op`` (a pyc10d ``ReduceOp`` or ``RedOpType``)."""
        red = LANE_OPS.get(id(op))
        if red is None or not _plain(t) or (t.nbytes >= self._lane_check_bytes and self._lane_declines(t)):
            return 0
        # (an Enum's hash is a Python call: ``red`` lives for ever, its id does)
        return self._lane(("allreduce", id(red), t.dtype, t.shape), "allreduce", t, None, red, -1, wait)

    def lean_allgather(self, out: torch.Tensor, inp: torch.Tensor, wait: bool = True) -> Any:
        """all_gather_into_tensor of ``inp`` into ``out``."""
        if not (_plain(out) and _plain(inp)):
            return 0
        key = ("allgather", out.dtype, inp.dtype, out.numel(), inp.numel())
        return self._lane(key, "allgather_into_tensor", out, inp, None, -1, wait)

    def lean_reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any, wait: bool = True) -> Any:
        """reduce_scatter_tensor of ``inp`` into ``out`` with ``op``."""
        red = LANE_OPS.get(id(op))
        if red is None or not (_plain(out) and _plain(inp)):
            return 0
        key = ("reduce_scatter", id(red), out.dtype, inp.dtype, out.numel(), inp.numel())
        return self._lane(key, "reduce_scatter_tensor", out, inp, red, -1, wait)

    def lean_broadcast(self, t: torch.Tensor, root: int, wait: bool = True) -> Any:
        """broadcast of ``t`` from group rank ``root``."""
        if not _plain(t) or not 0 <= root < self._size:
            return 0  # (a root out of range: the general path says so)
        return self._lane(("broadcast", root, t.dtype, t.numel()), "broadcast", t, None, None, root, wait)

    def lean_alltoall(self, out: torch.Tensor, inp: torch.Tensor, wait: bool = True) -> Any:
        """all_to_all_single of ``inp`` into ``out``, split evenly (no split sizes given)."""
        if not (_plain(out) and _plain(inp)):
            return 0
        return self._lane(("alltoall", out.dtype, inp.dtype, out.shape, inp.shape), "alltoall_base", out, inp,
                          None, -1, wait)

    def lean_barrier(self, wait: bool = True) -> Any:
        """barrier."""
        return self._lane(("barrier",), "barrier", None, None, None, -1, wait)

    def _run_step(self, opname: str, red: ReduceOp | None, root: int, x: torch.Tensor | None,
                  y: torch.Tensor | None, step: Step) -> int:
        """Run ``step`` as the group's next operation, with the engine's bookkeeping."""
        if self._started is not None:
            self._settle_started(True)  # this call waits for its peers anyway: finish that one here
        full, now = self._claim(opname, red, root, x)
        if not full:
            return 0
        timeout = self.options.timeout_s  # (``timeout_s``, inlined)
        error = None
        try:
            if self._early:
                self._check_early(full, opname, red, root)
            step(x, y, now + timeout, timeout)
        except BaseException as e:  # noqa: BLE001 - raised below, as ``wait`` would raise it
            error = self._failed(e, Work(opname, [] if x is None else [x], full))
        finally:
            self._ended(full, opname, error)
            self._exec.release()
        if error is not None:
            raise error
        return full

    # -- asynchronous calls: started here, finished when needed -----------------------------
    def _start_step(self, opname: str, red: ReduceOp | None, root: int, x: torch.Tensor | None,
                    y: torch.Tensor | None, step: Step) -> StartedWork | int:
        """Start an asynchronous call on the lane: ``step.start`` posts this rank's part now,
        on the issuing thread; its ``finish`` is left for later (``StartedWork``).

        So an asynchronous call costs what a synchronous one does, with no hand-off to the
        progress thread and back, while still never blocking its caller on its peers (a
        peer that has not arrived delays only the finish). A previous started call still
        unfinished is finished first if its peers have all posted, else it goes to the
        progress thread and this call takes the general path behind it.
        """
        start = getattr(step, "start", None)
        if start is None:
            return 0  # a step that posts more than once (all_to_all): the general path queues it
        self._settle_started(False)
        full, now = self._claim(opname, red, root, x)
        if not full:
            return 0
        work = StartedWork(self, opname, [] if x is None else [x], full)
        timeout = self.options.timeout_s
        try:
            if self._early:
                self._check_early(full, opname, red, root)
            c = start(x, y, now + timeout, timeout)
        except BaseException as e:  # noqa: BLE001 - handed to the waiter, as ``_submit`` does
            error = self._failed(e, work)
            self._ended(full, opname, error)
            self._exec.release()
            work.finish(error)
            return work
        self._running_op = None
        self._started = Started(work, step, x, y, c, now + timeout, timeout, red, root, now)
        self._exec.release()
        return work

    def _settle_started(self, block: bool) -> None:
        """Before another operation of the group: finish the started one here (``block``, or
        its peers all post within the ordinary spin), else hand it to the progress thread.
        (Ranks issuing back to back are often a few microseconds apart; a hand-off costs the
        thread hop and sends the calls behind it down the general path until the queue is
        empty.)"""
        started = self._started
        if started is None:
            return
        if block or started.step.ready(started.c, True):
            self.finish_started(started.work)
        else:
            self.hand_off(started.work)

    def finish_started(self, work: StartedWork, block: bool = True) -> None:
        """Finish ``work`` on this thread if it is still the started one. ``block=False`` (a
        poll, ``is_completed``): only if that needs no waiting; else the progress thread
        takes it, so that a caller polling it still sees it complete, time out or name a
        dead peer, as it would had it been queued."""
        if not self._exec.acquire(block):
            return
        waiting = False
        try:
            started = self._started
            if started is not None and started.work is work:
                if block or started.step.ready(started.c):
                    self._complete_started()
                else:
                    waiting = True
        finally:
            self._exec.release()
        if waiting:
            self.hand_off(work)

    def _complete_started(self) -> None:
        """Run the started operation's finish; the caller holds ``_exec``. (Its Work has no
        future: asking for one hands the operation off first. So finishing it here, under
        ``_exec``, runs no callback that could issue the group's next operation.)"""
        started = self._started
        if started is None:
            return
        self._started = None
        work = started.work
        self._running_op = (work.seq, work.opname, started.since)
        error = None
        try:
            started.step.finish(started.x, started.y, started.c, started.deadline)
        except BaseException as e:  # noqa: BLE001 - handed to the waiter
            error = self._failed(e, work)
        self._ended(work.seq, work.opname, error)
        work.finish(error)

    def hand_off(self, work: StartedWork, block: bool = True) -> None:
        """Give ``work``'s finish to the progress thread, ahead of anything queued after it
        (``block=False``: not if another thread is running an operation of the group)."""
        if not self._exec.acquire(block):
            return
        try:
            with self._lock:
                s = self._started
                if s is None or s.work is not work:
                    return
                self._started = None

                def finish(_: Any) -> None:
                    s.step.wait(s.c, s.deadline)  # the ordinary spin: this thread may run beside the caller
                    s.step.finish(s.x, s.y, s.c, s.deadline)

                channel = (self.group_key << 32) | (work.seq & 0x7FFFFFFF)
                self._enqueue(Job(work, finish, channel, s.timeout, s.since, s.red, s.root), first=True)
        finally:
            self._exec.release()

    def hand_off_unattended(self, older_than: float) -> None:
        """The watchdog's look (``watchdog.unattended``): a started call older than
        ``older_than`` seconds that nobody came back to goes to the progress thread."""
        started = self._started
        if started is not None and time.monotonic() - started.since > older_than:
            self.hand_off(started.work, block=False)

    def shutdown(self) -> None:
        started = self._started
        if started is not None:
            self.hand_off(started.work)
        super().shutdown()
