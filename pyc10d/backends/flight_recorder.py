"""Flight recorder: the last collectives of every group, kept in memory and dumped on failure.

Each engine keeps its last ``PYC10D_FLIGHT_RECORDER_ENTRIES`` (default 2,000; 0 turns it off)
operations in a ring buffer: sequence number, operation, element count and dtype of its
first tensor, when it was issued, started and ended, and its state (``issued``, ``running``,
``completed``, ``failed``). When an operation of the group fails (timeout, desync, a peer's
abort or death) the buffer is written to ``PYC10D_TRACE_DIR`` (default: a temporary
directory, named in the error) as ``pyc10d-trace-<group>-rank<r>.json``. Dumps of all
ranks merge with ``python -m pyc10d.flight_recorder DIR`` into one report: which rank is
behind and where the ranks disagree.

The same ring is the desync check's memory (``Engine._on_unexpected``): a message that
arrives before its receive is posted is compared with the fingerprint of the operation
this rank issued under its sequence number, computed from the ring's entry only then.
"""

from __future__ import annotations

import array
import json
import os
import socket
import tempfile
import time
from typing import Any

import torch

from .. import settings

_Tensor = torch.Tensor
FIELDS = ("seq", "op", "numel", "dtype", "issued", "started", "ended", "state")
#: Slots the ring has at least, so that the desync check can look back (and ahead) this far.
DESYNC_WINDOW = 1024


def capacity() -> int:
    return settings.FLIGHT_RECORDER_ENTRIES.get()


def first_tensor(outputs: Any) -> torch.Tensor | None:
    """The tensor an entry describes: the operation's first output (None: it has none)."""
    t = outputs[0] if outputs.__class__ is list and outputs else outputs
    if t.__class__ is _Tensor:
        return t
    while isinstance(outputs, (list, tuple)) and outputs:
        outputs = outputs[0]
    return outputs if isinstance(outputs, torch.Tensor) else None


class FlightRecorder:
    """One group's ring of recent operations.

    Writing it runs on every call, and every bytecode there shows: measured on vs off (8 B
    all_reduce on shm, back to back), each microsecond of bookkeeping is ~6% of the call. So
    an operation is written as one tuple when it is issued, ``(seq, op, red, root, numel,
    dtype, issued)`` in slot ``seq & mask`` (``issued`` below 0: it started at once, at
    ``-issued``), and the engine stores when a queued one started, and when each ended, in
    two float arrays (an ended time below 0: failed).
    The desync check reads the same tuple (``red`` and ``root`` are in it for that), so both
    features cost one tuple per call; text is made only when the ring is read.
    """

    def __init__(self, group_name: str, rank: int, global_rank: int, size: int, keep: int | None = None) -> None:
        self.group_name, self.rank, self.global_rank, self.size = group_name, rank, global_rank, size
        self.capacity = max(0, capacity() if keep is None else keep)  # entries a dump shows; 0: none
        slots = 1 << max(self.capacity - 1, DESYNC_WINDOW - 1).bit_length()
        self.mask = slots - 1
        self.ops: list[tuple | None] = [None] * slots
        self.started = array.array("d", bytes(8 * slots))
        self.ended = array.array("d", bytes(8 * slots))
        self.dumped: str | None = None

    def issue(self, seq: int, opname: str, outputs: Any, issued: float = 0.0, red: Any = None,
              root: int | None = None) -> int:
        """Write operation ``seq`` into its slot, the only writer of ``ops``; the slot.
        ``issued`` below 0: it started at once (at ``-issued``). A tensor or a list of them
        is described without a search (the engine's hot path)."""
        t = outputs[0] if outputs.__class__ is list and outputs else outputs
        if t.__class__ is not _Tensor:  # (no tensor at all, a barrier's ``[]``: no search)
            t = None if outputs.__class__ is list and not outputs else first_tensor(outputs)
        slot = seq & self.mask
        if t is None:
            self.ops[slot] = (seq, opname, red, root, 0, None, issued)
        else:
            self.ops[slot] = (seq, opname, red, root, t.numel(), t.dtype, issued)
        self.started[slot] = 0.0  # (one that started at issue says so in ``issued``)
        return slot

    def entries(self) -> list[dict[str, Any]]:
        """The last ``capacity`` operations issued, oldest first, as dicts of ``FIELDS``.

        An end time older than the start belongs to the operation the slot held before (the
        engine does not clear it; a queued operation's start is cleared at its issue)."""
        rows = []
        for slot, e in enumerate(self.ops):
            if e is None:
                continue
            seq, op, _red, _root, numel, dtype, issued = e
            started, ended = self.started[slot], self.ended[slot]
            if issued < 0:  # started at issue
                issued = started = -issued
            if not started or abs(ended) < started:
                ended = 0.0
            state = ("failed" if ended < 0 else "completed" if ended else "running" if started else "issued")
            rows.append(dict(zip(FIELDS, [seq, op, numel, str(dtype or "").replace("torch.", ""),
                                          issued or started, started, abs(ended), state])))
        rows.sort(key=lambda r: r["seq"])
        return rows[max(0, len(rows) - self.capacity):] if self.capacity else []

    def dump(self, reason: str) -> str | None:
        """Write the buffer (once per group); return the file's path (None: recording is off)."""
        if self.dumped is not None or not self.capacity:
            return self.dumped
        folder = settings.TRACE_DIR.get() or os.path.join(tempfile.gettempdir(), "pyc10d-traces")
        os.makedirs(folder, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.group_name)
        path = os.path.join(folder, f"pyc10d-trace-{safe}-rank{self.rank}.json")
        # times are monotonic seconds; ``dumped_monotonic`` lines them up with the wall clock
        record = {
            "dumped_monotonic": time.monotonic(),
            "group": self.group_name, "rank": self.rank, "global_rank": self.global_rank, "size": self.size,
            "host": socket.gethostname(), "pid": os.getpid(), "reason": reason, "dumped": time.time(),
            "entries": self.entries(),
        }
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
        self.dumped = path
        return path
