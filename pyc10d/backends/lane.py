"""The lean lane: a small synchronous all_reduce without the general path's layers.

An 8-byte all_reduce through the general path (``ops.allreduce`` -> ``_submit`` -> ``_run`` ->
the backend -> ``select_shm`` -> the algorithm -> ``ShmComm`` -> the arena) made 94 Python
calls, and on this kind of machine each costs about half a microsecond: 60-70 us a call
where the exchange itself (two processes, one shared page, a torch copy in and a kernel
out) takes about 12. Everything those layers decide for a given (reduce op, dtype, shape)
on a given group is decided again at every call and comes out the same. So a backend that
can may build, at the first call of each such key, a *step*: a closure of the algorithm's
phase exchange with every verdict made (dtype accepted for the op, no widening, the
algorithm for that size, the descriptor word, the arena rows); later calls run only it.

What a call still does, in line here, is what makes it the same operation as on the general
path: the group's order (it runs only when nothing of the group is queued or running, else
the general path queues it), its sequence number, the flight recorder's entry and end time,
the watchdog's progress fields, the deadline, and a failure handled exactly as ``_run``
handles it (named, explained, recorded, the group aborted). Ranks check each other's
descriptors at every operation as before, so a rank on the lane and a rank on the general
path run the same exchange. The lane is taken only when nobody could tell the difference:
a profiler off (it shows the general path's ranges), a default timeout, the group usable
and idle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import profiler as _torch_profiler

from ..types import RedOpType, ReduceOp
from .base import Engine, _now
from .work import Work

#: The reduce ops a lane serves, by the ``id`` of every object that names one (pyc10d's
#: ``ReduceOp.X`` and ``RedOpType.X`` members, which live for ever): one dict look-up a call,
#: no hashing of an Enum. PREMUL_SUM carries a factor per call: the general path keeps it.
LANE_OPS: dict[int, ReduceOp] = {}
for _t in RedOpType:
    if _t not in (RedOpType.PREMUL_SUM, RedOpType.UNUSED):
        LANE_OPS[id(_t)] = LANE_OPS[id(getattr(ReduceOp, _t.name))] = getattr(ReduceOp, _t.name)

_strided = torch.strided

#: A step: ``step(t, deadline, timeout)`` runs the operation's exchange on ``t``.
Step = Callable[[torch.Tensor, float, float], None]


class LaneOps(Engine):
    """``lean_allreduce``; a backend supplies the steps (``_allreduce_step``)."""

    _steps: dict | None = None

    def _allreduce_step(self, red: ReduceOp, t: torch.Tensor) -> Step | bool | None:
        """The step of an all_reduce of tensors like ``t`` with ``red``, asked once per (op,
        dtype, shape) (``t``: a contiguous CPU tensor that needs no gradient). False: never
        (the general path runs every such call); None: not yet, ask again next call."""
        return False

    def lean_allreduce(self, t: torch.Tensor, op: Any) -> int:
        """Run a synchronous in-place all_reduce of ``t`` on the lane: its sequence number,
        or 0 when it cannot (nothing was done: the caller takes the general path)."""
        red = LANE_OPS.get(id(op))
        if (red is None or t.__class__ is not torch.Tensor or t.layout is not _strided or not t.is_cpu
                or t.requires_grad or _torch_profiler._is_profiler_enabled or not t.is_contiguous()):
            return 0
        steps = self._steps
        if steps is None:
            steps = self._steps = {}
        key = (id(red), t.dtype, t.shape)  # (an Enum's hash is a Python call; ``red`` lives for ever)
        step = steps.get(key)
        if step is None:
            step = self._allreduce_step(red, t)
            if step is None:  # not yet (e.g. no arena before the group's first operation)
                return 0
            steps[key] = step
        if step is False:  # never: the general path runs every call of this key
            return 0
        return self._run_step("allreduce", red, t, step)

    def _run_step(self, opname: str, red: ReduceOp, t: torch.Tensor, step: Step) -> int:
        lock = self._lock
        lock.acquire()
        if (self._pending or self._closed or self._broken is not None or self._desync is not None
                or self._early or not self._exec.acquire(False)):
            lock.release()
            return 0  # the general path queues it, or raises what it must
        self._seq = full = self._seq + 1
        self._pending = 1
        lock.release()
        seq = full & 0x7FFFFFFF
        now = _now()
        log = self.recorder
        if log is not None:
            log.ops[seq & log.mask] = (seq, opname, red, None, t.numel(), t.dtype, -now)
        self._running_op = (full, opname, now)
        self._entered = (full, opname)
        timeout = self.timeout_s
        error = None
        try:
            step(t, now + timeout, timeout)
        except BaseException as e:  # noqa: BLE001 - raised below, as ``wait`` would raise it
            error = self._failed(e, Work(opname, [t], full))
        finally:
            self._running_op = None
            if error is None and log is not None:
                log.ended[seq & log.mask] = _now()
            self._completed = (full, opname)
            lock.acquire()
            self._pending -= 1
            lock.release()
            self._exec.release()
        if error is not None:
            raise error
        return full
