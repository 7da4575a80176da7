"""The collective engine shared by every backend: ordering, progress thread, failure.

A backend owns a transport (or shares its world's) and runs one group's operations over
it. Operations get a sequence number at issue time; their messages travel on the channel
``(group key, sequence)``, so operations of different groups sharing one transport never mix.
Queued operations run one at a time on a per-group progress thread, in issue order, so
``async_op=True`` overlaps with the caller while completion order stays the issue order. A
synchronous call on an idle group runs on the caller's thread (no thread hop), and so does a
queued operation its issuing thread waits for before the progress thread took it up, when
nothing earlier of the group is queued or running (see ``_run_here``): the operation is not
handed to the progress thread and back when its caller waits at once.

When an operation fails mid-flight (a peer lost, a mismatch, a timeout), the group is
aborted: the other members are told why, their pending receives fail at once, and later
operations on the group raise the same error instead of hanging.
"""

from __future__ import annotations

import queue
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

import torch
from torch.autograd import profiler as torch_profiler

from .. import settings, threads
from ..algorithms import profiling
from ..algorithms.comm import Comm, fingerprint, fingerprint_collective
from ..errors import DistError, DistNetworkError, DistTimeoutError
from ..transport.base import Transport
from ..types import UNSET_TIMEOUT, ReduceOp
from . import failures, flight_recorder, watchdog
from .abort_hooks import AbortHooks
from .flight_recorder import FlightRecorder
from .options import Options
from .work import CompletedWork, Work

_now = time.monotonic
_P2P_BIT = 1 << 31
_UNCLAIMED = (0, 0.0)  # ``_claim``: nothing taken


def group_key(name: str) -> int:
    """32-bit namespace of a group's messages, equal on every member (from its name)."""
    return zlib.crc32(name.encode()) or 1


class Job(NamedTuple):
    """One issued operation, as the engine runs it (``_run``): ``fn(comm)`` moves the bytes."""

    work: Work
    fn: Callable[[Comm], Any]
    channel: int  # (group key << 32) | sequence number: the operation's messages
    timeout: float  # seconds
    started: float  # when it started (monotonic); 0.0: queued, it starts when it runs
    red: Any  # the reduce op and root, in every message's fingerprint (``Comm.fingerprint``)
    root: int | None


#: Builds a ``Job`` without the Python frame of its generated ``__new__`` (0.3 us of the 0.5
#: a ``Job(...)`` costs here; every operation of the general path makes one).
_new_job = tuple.__new__


class EngineCore(AbortHooks):
    """The issue/run machinery under every engine: sequence numbers, the group's order, the
    progress thread, the flight recorder's feed, desync checks, failure and shutdown.

    ``engine.Engine`` is the class backends use: this core with the operations on top
    (``ops``, ``ops_gather``, ``p2p``, ``lane``), which call into it through ``_submit``.
    """

    backend_name = "tcp"
    #: An asynchronous operation started on the lean lane and not finished (``lane.LaneOps``
    #: sets it; it counts in ``_pending``): every later operation of the group settles it
    #: first (``_settle_started``), since this rank may post nothing more before it is done.
    _started: Any = None
    #: Shrinks of this group so far: the next one's name (``shrink_name``).
    _shrinks = 0

    def __init__(
        self,
        transport: Transport,
        ranks: list[int],
        rank: int,
        group_name: str,
        options: Options | None = None,
        owns_transport: bool = False,
    ) -> None:
        self.transport = transport
        self.ranks = ranks
        self._rank = rank
        self._size = len(ranks)
        self.group_name = group_name
        self.group_key = group_key(group_name)
        self.options = Options.of(options) if options is not None else Options()
        self._owns_transport = owns_transport
        #: Fingerprint every collective's messages (``PYC10D_DESYNC_CHECK=0`` turns it off),
        #: as the variable says when the group is made.
        self.desync_check: bool = settings.DESYNC_CHECK.get()
        #: Seconds a receive waits while its sender's messages sit on other tags of the group
        #: before the mismatch is reported (``PYC10D_P2P_MISMATCH_S``; 0 turns the check off).
        self.tag_mismatch_s: float = settings.P2P_MISMATCH_S.get()
        self._seq = 0
        self._lock = threading.Lock()
        # Whoever runs an operation holds ``_exec`` and takes it off the head of ``_jobs``
        # (under ``_lock``) while holding it: so every job runs exactly once, one at a time, in
        # issue order, whether the progress thread or a waiter runs it (``_run_here``).
        self._exec = threading.Lock()
        self._pending = 0  # issued and not finished
        self._jobs: deque[Job] = deque()  # issued, not yet taken up, in issue order
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # one token per queued job; None stops
        self._worker: threading.Thread | None = None
        self._broken: BaseException | None = None
        self._closed = False
        self._scratch: dict = {}
        self._box = getattr(transport, "mailbox", None)  # abort reasons peers sent (``_abort_reason``)
        self._desync: BaseException | None = None
        # Progress, for the watchdog (backends.watchdog): the operation running now and the
        # last entered/completed ones; the store where ranks publish theirs.
        self.progress_store: Any = None
        self._running_op: tuple[int, str, float] | None = None
        self._entered: tuple[int, str] = (0, "")
        self._completed: tuple[int, str] = (0, "")
        # The recent operations by sequence number: the flight recorder's ring, and what
        # desync detection checks every message against that arrives before its receive is
        # posted (``_on_unexpected``). None when both are off.
        self.recorder = (FlightRecorder(group_name, rank, ranks[rank], len(ranks))
                         if flight_recorder.capacity() > 0 or self.desync_check else None)
        # Messages of operations not issued here yet, by sequence number: (peer, fingerprint),
        # checked when the operation is issued (``_on_unexpected``).
        self._early: dict[int, list[tuple[int, int]]] = {}
        if self.desync_check:
            transport.watch_unexpected(self.group_key, self._on_unexpected)
            early = {c for i, g in enumerate(ranks) if i != rank  # sent before it watched
                     for c in transport.unexpected_from(g, self.group_key)}
            for channel in early:
                for peer, meta in transport.unexpected_on(channel):
                    self._on_unexpected(peer, channel, meta)

    # -- identity --------------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def name(self) -> str:
        return self.backend_name

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return self.backend_name

    @property
    def timeout_s(self) -> float:
        """The group's timeout in seconds (``options`` is always an ``Options``: see ``of``)."""
        return self.options.timeout_s

    def _set_default_timeout(self, timeout: timedelta) -> None:
        self.options._timeout = timeout

    def _get_sequence_number_for_group(self) -> int:
        return self._seq

    def _set_sequence_number_for_group(self) -> None:
        pass

    def failure(self) -> BaseException | None:
        """The error that aborted this group (its first failed operation, or ``abort()``);
        None while it is healthy. Every later operation of the group raises it."""
        return self._broken

    # -- running operations --------------------------------------------------------------
    def op_timeout(self, opts: Any) -> float:
        """Seconds an operation given ``opts`` may take: ``opts.timeout`` when it names one
        (torch's options hold a negative one when unset), else the group's."""
        t = getattr(opts, "timeout", UNSET_TIMEOUT)
        if t is UNSET_TIMEOUT:  # the common case: no isinstance
            return self.timeout_s
        if isinstance(t, timedelta) and t.total_seconds() > 0:
            return t.total_seconds()
        return self.timeout_s

    def _submit(
        self, opname: str, fn: Callable[[Comm], Any], outputs: Any, opts: Any = None, sync: bool = False,
        *, red: Any = None, root: int | None = None,
    ) -> Work:
        """Give ``fn`` a channel and run it in issue order; return its Work.

        ``red`` and ``root`` go into the fingerprint every message of the operation carries
        (with ``opname``), so that ranks running different collectives fail instead of mixing.
        """
        if self._started is not None:  # (only the lane sets it)
            self._settle_started(sync)
        # The group's timeout unless ``opts`` names one (``timeout_s`` inlined: a Python call
        # less on every operation).
        timeout = (self.options.timeout_s if getattr(opts, "timeout", UNSET_TIMEOUT) is UNSET_TIMEOUT
                   else self.op_timeout(opts))
        log = self.recorder
        with self._lock:
            if self._closed:
                raise failures.destroyed(opname, self.group_name)
            self._seq += 1
            seq = self._seq & 0x7FFFFFFF
            # Taking ``_exec`` here, under ``_lock``, keeps a job issued meanwhile by another
            # thread from running first; when only a stale token holds it, queue instead.
            inline = sync and self._pending == 0 and self._exec.acquire(blocking=False)
            if inline:  # it starts now; its entry says so with a negative time (one store less)
                now = _now()
                if log is not None:
                    log.issue(seq, opname, outputs, -now, red, root)
            else:
                now = 0.0  # it starts when it runs
                if log is not None:
                    log.issue(seq, opname, outputs, _now(), red, root)
            early = self._early.pop(seq, None) if self._early else None
            self._pending += 1
            # An inline operation's handle is made finished (no latch to build and release);
            # only a failure gets a Work, to carry the error to ``wait``.
            work = CompletedWork(opname, outputs, self._seq) if inline else Work(opname, outputs, self._seq)
            channel = (self.group_key << 32) | seq
            job = _new_job(Job, (work, fn, channel, timeout, now, red, root))  # (``Job(...)``, no Python frame)
            if not inline:
                self._enqueue(job)
                work.runner = self._run_here
                work.issuer = threading.get_ident()
        if not inline and torch_profiler._is_profiler_enabled:  # see ``profiling.queued``
            profiling.queued(opname, outputs, seq, self.group_name, self.backend_name)
        try:
            if early and self.desync_check:  # messages of peers that ran ahead to this operation
                fp = fingerprint(opname, red, root)
                for peer, theirs in early:
                    self._check_fingerprint(peer, seq, theirs, fp, opname)
            error = self._run(job) if inline else None
        finally:
            if inline:
                self._exec.release()
        if error is not None:
            work = Work(opname, outputs, work.seq)
            work.finish(error)
        return work

    def _enqueue(self, job: Job, first: bool = False) -> None:
        """Queue ``job`` for the progress thread (started at the first); ``first``: ahead of
        every queued job. The caller holds ``_lock``."""
        if first:
            self._jobs.appendleft(job)
        else:
            self._jobs.append(job)
        self._queue.put(True)
        if self._worker is None:
            self._worker = threads.start(self._progress, f"pyc10d-progress-{self.group_name}")

    def _done_locally(self, opname: str, outputs: Any) -> Work | None:
        """World size 1, an operation with nothing to move or compute (the caller knows):
        count it, record it and return it finished, without a channel, a job or a thread.
        None when the group has operations pending (this one must follow them) or is
        unusable; the caller then submits it as usual."""
        with self._lock:
            if self._pending or self._closed or self._broken is not None:
                return None
            self._seq += 1
            seq = self._seq
        self._entered = self._completed = (seq, opname)
        log = self.recorder
        if log is not None:
            now = _now()
            log.ended[log.issue(seq & 0x7FFFFFFF, opname, outputs, -now)] = now
        return CompletedWork(opname, outputs, seq)

    def _on_unexpected(self, peer: int, channel: int, meta: int) -> None:
        """A message nobody received yet (the transport's thread calls this as it arrives):
        if it belongs to an operation issued here with another fingerprint, the ranks have
        desynchronised; fail the group with both sides. One for an operation not issued here
        yet waits in ``_early`` for the issue (no scan of the mailbox at every call)."""
        theirs, seq = meta >> 8, channel & 0x7FFFFFFF
        log = self.recorder
        if not theirs or channel & _P2P_BIT or log is None:
            return
        slot = seq & log.mask
        # No lock (taking the engine's on this thread for every message cost the caller more
        # than the scan it replaces): ``_submit`` writes the slot, then pops ``_early``; here
        # ``_early`` is written, then the slot read again. Each step is atomic under the GIL,
        # so one side or both see the other; a fingerprint checked twice is harmless.
        entry = log.ops[slot]
        if entry is None or entry[0] != seq:
            if not 0 < (seq - self._seq) & 0x7FFFFFFF <= log.mask:  # not ahead of this rank
                return
            self._early.setdefault(seq, []).append((peer, theirs))
            entry = log.ops[slot]
            if entry is None or entry[0] != seq:
                return
            self._early.pop(seq, None)  # issued meantime: check it here
        mine = fingerprint(entry[1], entry[2], entry[3])
        self._check_fingerprint(peer, seq, theirs, mine, fingerprint_collective(mine))

    def _check_fingerprint(self, peer: int, seq: int, theirs: int, mine: int, opname: str) -> None:
        if mine == theirs or self._desync is not None:
            return
        who = self.ranks.index(peer) if peer in self.ranks else peer
        error = failures.desync(opname, seq, self.group_name, who, theirs, self._rank, mine)
        self._desync = error
        self.transport.cancel(self.group_key, error)  # the operation waiting here fails with it

    def _progress(self) -> None:
        while self._queue.get() is not None:
            # A token per queued job, put after the job: by the time this token comes up, its
            # job is either at the head of ``_jobs`` or was already run by a waiter.
            if not self._jobs:  # taken by a waiter: do not queue up behind it for nothing
                continue
            with self._exec:
                with self._lock:
                    job = self._jobs.popleft() if self._jobs else None
                error = self._run(job) if job is not None else None
            if job is not None:
                job.work.finish(error)

    def _run_here(self, work: Work) -> bool:
        """Run ``work``'s queued job on the calling thread, if that keeps the group's order.

        Only when the job is next (nothing earlier of the group queued or running: ``_exec``
        is free and the job heads ``_jobs``) and the caller issued it. The issuer, because a
        job is one rank's part of a collective: on the threaded backend another thread is
        another rank, which would block in this rank's part instead of doing its own. False
        when the job is the progress thread's to run; the caller then waits for it.
        """
        if work.issuer != threading.get_ident() or not self._exec.acquire(blocking=False):
            return False
        try:
            with self._lock:
                if not self._jobs or self._jobs[0].work is not work:
                    return False
                job = self._jobs.popleft()
            error = self._run(job)  # its token, when the progress thread gets to it, finds nothing
        finally:
            self._exec.release()
        work.finish(error)
        return True

    def attach_progress_store(self, store: Any) -> None:
        """Publish this rank's progress in ``store`` and watch for stuck ranks (watchdog)."""
        self.progress_store = store
        watchdog.WATCHDOG.register(self)

    def progress(self) -> tuple[int, str, int, str]:
        return (*self._entered, *self._completed)

    def running(self) -> tuple[int, str, float] | None:
        return self._running_op

    def _run(self, job: Job) -> BaseException | None:
        """Run ``job``; its error, if any. The caller holds ``_exec`` and finishes the Work
        after releasing it (a Future's callbacks may issue the group's next operation).

        The operation's profiler range (``pyc10d:<op>``) is opened here rather than in the
        public API's preamble (``_preamble.invoke``): the torch plugin calls engine methods
        directly, and an operation issued asynchronously runs later, on whichever thread
        takes it up; ``_run`` is the one place every collective of both paths passes, on
        the thread that runs it, when it runs. (An operation the progress thread runs shows
        only when the profiler follows every thread: torch.profiler records the threads it
        was started on unless ``_ExperimentalConfig(profile_all_threads=True)``; ``_submit``
        marks every queued operation on its issuing thread for that reason.)
        """
        work, fn, channel, timeout, now, _, _ = job
        started = self._started
        if started is not None and started.work is not work:  # (an issue that raced the lane's start)
            self._complete_started()
        error: BaseException | None = None
        log = self.recorder
        if not now:  # it was queued (an inline one started at issue)
            now = _now()
            if log is not None:
                log.started[work.seq & log.mask] = now
        self._running_op = (work.seq, work.opname, now)
        self._entered = (work.seq, work.opname)
        try:
            if self._broken is not None:
                raise failures.unusable(self._broken)
            if self._desync is not None:  # found after an earlier operation had returned
                raise self._desync
            comm = Comm(self.transport, self.ranks, self._rank, channel, timeout, work.opname)
            comm.scratch_pool = self._scratch
            if self.desync_check:  # its fingerprint is made when a message needs it
                comm.collective = job
            if torch_profiler._is_profiler_enabled:  # one attribute read when off (``profiling``)
                with profiling.op_range(work.opname, work.outputs, work.seq, self.group_name, self.backend_name):
                    fn(comm)
            else:
                fn(comm)
        except BaseException as e:  # noqa: BLE001 - handed to the waiter
            error = self._failed(e, work)
        finally:
            self._ended(work.seq, work.opname, error)
        return error

    # -- the sequencer and the bookkeeping every path shares --------------------------------
    # ``_submit`` issues (and queues, or runs inline) an operation; ``_claim`` takes (and records) the next
    # one for a caller that runs it at once when the group is idle (the lane); both end in
    # ``_ended``. ``_run`` and the lane record entry and end through the same fields.
    def _claim(self, opname: str, red: ReduceOp | None, root: int, x: torch.Tensor | None) -> tuple[int, float]:
        """The group's next sequence number, taken for an operation run at once on the
        calling thread (the lane's: ``_exec`` held, one operation pending), and the operation
        recorded as issued and running; (its number, its start time). ``(0, 0.0)`` having
        taken nothing: something of the group is queued or running, or it is closed, broken
        or desynchronised (the caller then submits it, which queues it or raises what it must).
        One call for both: the lane pays every Python call it makes (``lane.py``)."""
        lock = self._lock
        lock.acquire()
        if (self._pending or self._closed or self._broken is not None or self._desync is not None
                or not self._exec.acquire(False)):
            lock.release()
            return _UNCLAIMED
        self._seq = full = self._seq + 1
        self._pending = 1
        lock.release()
        seq = full & 0x7FFFFFFF
        now = _now()
        log = self.recorder
        if log is not None:
            log.issue(seq, opname, x, -now, red, None if root < 0 else root)
        self._running_op = (full, opname, now)
        self._entered = (full, opname)
        return full, now

    def _check_early(self, full: int, opname: str, red: ReduceOp | None, root: int) -> None:
        """Check the messages peers sent for operation ``full`` before it was issued here, as
        ``_submit`` does (a peer running ahead is common on tcp, where the lane reads ahead;
        a fingerprint that differs fails the operation: ``_check_fingerprint``)."""
        seq = full & 0x7FFFFFFF
        early = self._early.pop(seq, None)
        if early and self.desync_check:
            fp = fingerprint(opname, red, None if root < 0 else root)
            for peer, theirs in early:
                self._check_fingerprint(peer, seq, theirs, fp, opname)

    def _ended(self, full: int, opname: str, error: BaseException | None) -> None:
        """Operation ``full`` is over: its end recorded (``error`` None: it succeeded; a failed
        one's end was marked by ``_failed``), counted done. Every path that runs one ends here."""
        self._running_op = None
        log = self.recorder
        if error is None and log is not None:
            log.ended[full & 0x7FFFFFFF & log.mask] = _now()
        self._completed = (full, opname)
        lock = self._lock
        lock.acquire()
        self._pending -= 1
        lock.release()

    def _failed(self, e: BaseException, work: Work) -> BaseException:
        """What ``work`` failing with ``e`` means for the group (every path that runs an
        operation ends here): its end marked failed in the flight recorder, the error named,
        explained and dumped, the group aborted. Returns the error to hand the caller."""
        log = self.recorder
        if log is not None:  # before the dump, which it is part of
            log.ended[work.seq & log.mask] = -_now()
        error = self._with_trace(self._explain_failure(self._annotate(e, work), work))
        self.fail_group(error, None if isinstance(error, DistError) else self._cause(error, work))
        return error

    def _annotate(self, error: BaseException, work: Work) -> BaseException:
        """Name the group and the operation's sequence number in pyc10d's own errors, so that
        the logs of different ranks line up (``failures.annotated``)."""
        return failures.annotated(error, work.opname, work.seq, self.group_name)

    def _explain_failure(self, error: BaseException, work: Work) -> BaseException:
        """A lost peer is reported with the reason a member gave when it aborted (the root
        cause); a timeout names the ranks that never entered the operation, when it can tell
        (a backend may add what it knows, e.g. which hosts are gone)."""
        if isinstance(error, DistNetworkError):
            return self._abort_reason(error)
        if not isinstance(error, DistTimeoutError) or self.progress_store is None:
            return error
        try:
            watchdog.publish(self)
            text = watchdog.describe_stuck(self, work.seq, work.opname)
        except Exception:  # noqa: BLE001 - the store may be gone too; keep the original error
            return error
        return DistTimeoutError(f"{error}; {text}") if text else error

    def _abort_reason(self, error: DistNetworkError) -> BaseException:
        """A member that fails tells the others why, then exits: its exit can be seen (shm
        watches pids) a moment before its abort message is read. Give that message 0.2 s."""
        box = self._box
        if box is None:
            return error
        peers = [g for i, g in enumerate(self.ranks) if i != self._rank]
        deadline = time.monotonic() + 0.2
        while True:
            said = [(p, box.abort_reasons[p]) for p in peers if p in box.abort_reasons]
            if said or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        if not said or said[0][1] in str(error):
            return error
        who, reason = said[0]
        return failures.peer_aborted(error, self.ranks.index(who), reason)

    def _with_trace(self, error: BaseException) -> BaseException:
        """Dump the flight recorder and say where (pyc10d's own errors only)."""
        if self.recorder is None or not isinstance(error, DistError):
            return error
        try:
            path = self.recorder.dump(str(error))
        except OSError:
            return error
        if path is None:
            return error
        return failures.with_trace(error, path)

    def _cause(self, error: BaseException, work: Work) -> str:
        """What the peers are told when an error not of pyc10d's own fails ``work`` here."""
        return failures.foreign_cause(error, work.opname, work.seq, self.group_name, self._rank)

    def fail_group(self, error: BaseException, reason: str | None = None) -> None:
        """Mark the group failed with ``error`` and abort it, telling the peers ``reason``
        (default: the error's text, which names the group, the operation and this rank)."""
        if self._broken is not None:
            return
        self._broken = error
        if reason is None:
            reason = str(error)  # names the group, the operation and this rank (``_annotate``)
        peers = [g for i, g in enumerate(self.ranks) if i != self._rank]
        self.transport.abort(self.group_key, reason, peers)
        # Receives the failed operation left posted would wait for ever (their buffers are kept
        # alive by their views, see ``byte_view``): fail them, and any later ones of the group.
        self.transport.cancel(self.group_key, error)
        self._run_abort_hooks(self.group_name, self._rank)

    def derive(self, ranks: list[int], rank: int, group_name: str, options: Options) -> EngineCore:
        """The engine of a subgroup of this group (``ranks``: ranks of this group; ``rank``:
        this process's rank in the subgroup) that shares this engine's transport, so that a
        ``new_group`` costs no new connections. A backend that composes engines overrides it."""
        return type(self)(self.transport, [self.ranks[r] for r in ranks], rank, group_name, options)

    # -- shrinking (``shrink.py``) -----------------------------------------------------------
    def shrink_name(self) -> str:
        """The name of this group's next shrink: the parent's, and how many shrinks of it came
        before, which every survivor counts alike (so the shrunk group's channels are its own)."""
        count = self._shrinks
        self._shrinks = count + 1
        return f"{self.group_name}.shrink{count}"

    def components(self) -> list[EngineCore]:
        """This engine and the engines it is composed of (hier overrides it)."""
        return [self]

    def hand_transport_to(self, heir: EngineCore) -> None:
        """Let ``heir`` close this engine's transport when it shuts down, if this engine owns it
        (a shrunk group keeps its parent's connections when the parent is destroyed)."""
        if self._owns_transport:
            self._owns_transport = False
            heir._owns_transport = True

    # -- the lane's hooks (``lane.LaneOps`` overrides them) --------------------------------------
    def _settle_started(self, block: bool) -> None:
        """Finish or hand off the operation started on the lane (none here)."""

    def _complete_started(self) -> None:
        """Finish the operation started on the lane; the caller holds ``_exec`` (none here)."""

    # -- point to point ---------------------------------------------------------------------
    def _p2p_channel(self, tag: int) -> int:
        return (self.group_key << 32) | _P2P_BIT | (tag & 0x7FFFFFFF)

    def _p2p_comm(self, opname: str) -> Comm:
        return Comm(self.transport, self.ranks, self._rank, 0, self.timeout_s, opname)

    # -- shutdown --------------------------------------------------------------------------
    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            worker = self._worker
        self.transport.watch_unexpected(self.group_key, None)
        watchdog.WATCHDOG.unregister(self)
        if worker is not None:
            self._queue.put(None)
            if self._pending:
                # An operation peers never joined would hold the thread until its timeout.
                self.transport.cancel(self.group_key, failures.destroyed_pending(self.group_name))
            worker.join(timeout=5.0)
        if self._owns_transport:
            self.transport.close()

    def abort(self) -> None:
        self.fail_group(failures.aborted_by(self.group_name, self._rank), "it called abort()")
        self.shutdown()

    def _check_device(self, tensors: list[torch.Tensor], opname: str) -> None:
        """CPU tensors, and CUDA ones, which ``staging`` copies through host memory."""
        for t in tensors:
            if t.device.type not in ("cpu", "cuda", "meta"):
                raise RuntimeError(f"{opname}: unsupported device type {t.device.type}")
