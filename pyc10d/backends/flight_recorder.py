"""Flight recorder: the last collectives of every group, kept in memory and dumped on failure.

Each engine keeps its last ``PYC10D_FLIGHT_RECORDER_ENTRIES`` (default 2,000; 0 turns it off)
operations in a ring buffer: sequence number, operation, element count and dtype of its
first tensor, when it was issued, started and ended, and its state (``issued``, ``running``,
``completed``, ``failed``). When an operation of the group fails (timeout, desync, a peer's
abort or death) the buffer is written to ``PYC10D_TRACE_DIR`` (default: a temporary
directory, named in the error) as ``pyc10d-trace-<group>-rank<r>.json``. Dumps of all
ranks merge with ``python -m pyc10d.flight_recorder DIR`` into one report: which rank is
behind and where the ranks disagree.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import tempfile
import time
from typing import Any

import torch

_now = time.monotonic
FIELDS = ("seq", "op", "numel", "dtype", "issued", "started", "ended", "state")


def capacity() -> int:
    return int(os.environ.get("PYC10D_FLIGHT_RECORDER_ENTRIES", "2000"))


def _first_tensor(outputs: Any) -> torch.Tensor | None:
    while isinstance(outputs, (list, tuple)) and outputs:
        outputs = outputs[0]
    return outputs if isinstance(outputs, torch.Tensor) else None


class FlightRecorder:
    """One group's ring buffer of recent operations (lists, updated in place: cheap)."""

    def __init__(self, group_name: str, rank: int, global_rank: int, size: int) -> None:
        self.group_name, self.rank, self.global_rank, self.size = group_name, rank, global_rank, size
        self.entries: collections.deque[list[Any]] = collections.deque(maxlen=max(1, capacity()))
        self.dumped: str | None = None

    def issued(self, seq: int, opname: str, outputs: Any) -> list[Any]:
        """A new entry (a plain list, written in place by the engine: this runs on every call;
        the size and dtype of its first tensor are read from it now, as text only at dump)."""
        t = outputs[0] if type(outputs) is list and outputs else outputs
        if type(t) is not torch.Tensor:
            t = _first_tensor(outputs)
        if t is None:
            entry = [seq, opname, 0, None, _now(), 0.0, 0.0, False]
        else:
            entry = [seq, opname, t.numel(), t.dtype, _now(), 0.0, 0.0, False]
        self.entries.append(entry)
        return entry

    @staticmethod
    def failed(entry: list[Any]) -> None:
        """(The engine writes start and end times inline; the state follows from them.)"""
        entry[6], entry[7] = time.monotonic(), True

    @staticmethod
    def _row(e: list[Any]) -> dict[str, Any]:
        state = "failed" if e[7] else "completed" if e[6] else "running" if e[5] else "issued"
        return dict(zip(FIELDS, [*e[:3], str(e[3] or "").replace("torch.", ""), *e[4:7], state]))

    def dump(self, reason: str) -> str:
        """Write the buffer (once per group); return the file's path."""
        if self.dumped is not None:
            return self.dumped
        folder = os.environ.get("PYC10D_TRACE_DIR") or os.path.join(tempfile.gettempdir(), "pyc10d-traces")
        os.makedirs(folder, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.group_name)
        path = os.path.join(folder, f"pyc10d-trace-{safe}-rank{self.rank}.json")
        # times are monotonic seconds; ``dumped_monotonic`` lines them up with the wall clock
        record = {
            "dumped_monotonic": time.monotonic(),
            "group": self.group_name, "rank": self.rank, "global_rank": self.global_rank, "size": self.size,
            "host": socket.gethostname(), "pid": os.getpid(), "reason": reason, "dumped": time.time(),
            "entries": [self._row(e) for e in list(self.entries)],
        }
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
        self.dumped = path
        return path
