"""The flight recorder: every rank of a failed group dumps its last collectives; the dumps
merge into a report naming the rank out of step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _multirank import run_ranks

import pyc10d as dist
from pyc10d import flight_recorder


def _skip_one(rank: int, ws: int) -> str:
    g = dist.new_group(list(range(ws)))
    try:
        for _ in range(3 if rank == ws - 1 else 4):  # the last rank skips one all_reduce
            dist.all_reduce(torch.ones(4), group=g)
        dist.barrier(group=g)
    except RuntimeError as e:
        assert "flight recorder:" in str(e), e
        return "failed"
    return "no error"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["tcp", "threaded"])
def test_desync_dumps_merge_into_a_report(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYC10D_TRACE_DIR", str(tmp_path))
    assert run_ranks(backend, 4, _skip_one, timeout=40) == ["failed"] * 4
    dumps = sorted(tmp_path.glob("pyc10d-trace-*.json"))
    assert len(dumps) == 4, dumps
    one = json.loads(dumps[0].read_text())
    assert one["entries"][-1]["state"] == "failed" and one["entries"][0]["op"] == "allreduce"
    text = flight_recorder.report(tmp_path)
    assert "ranks disagree at #4" in text and "rank 3 ran barrier" in text, text
    assert "out of step: ranks [3]" in text, text
    assert flight_recorder.main([str(tmp_path)]) == 0


def test_recorder_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyc10d.backends.engine import Engine
    from pyc10d.backends.fake import FakeBackend
    from pyc10d.testing import FakeStore

    def engine(name: str) -> Engine:
        return FakeBackend.create(FakeStore(), 0, 2, __import__("datetime").timedelta(seconds=5), name)

    monkeypatch.setenv("PYC10D_FLIGHT_RECORDER_ENTRIES", "0")
    e = engine("x")  # the ring stays for the desync check, but is never dumped
    assert e.recorder is not None and e.recorder.capacity == 0
    assert e.recorder.dump("why") is None and e.recorder.entries() == []
    monkeypatch.setenv("PYC10D_DESYNC_CHECK", "0")
    assert engine("y").recorder is None  # both off: no ring
    monkeypatch.setenv("PYC10D_FLIGHT_RECORDER_ENTRIES", "3")
    e = engine("z")
    assert e.recorder is not None and e.recorder.capacity == 3


def test_ring_keeps_the_last_operations_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyc10d.backends.flight_recorder import FlightRecorder

    monkeypatch.setenv("PYC10D_FLIGHT_RECORDER_ENTRIES", "5")
    rec = FlightRecorder("g", 0, 0, 2)
    assert rec.entries() == []
    for seq in range(1, 6):  # 5 operations, then two more: the ring shows the last 5
        slot = rec.issue(seq, "allreduce", [torch.ones(seq, dtype=torch.float64)])
        rec.started[slot] = float(seq)
        rec.ended[slot] = -(seq + 0.5) if seq == 5 else seq + 0.5
    rec.started[rec.issue(6, "broadcast", torch.ones(2))] = 6.5  # running
    rec.issue(7, "barrier", [], issued=7.0)  # queued
    rows = rec.entries()
    assert [r["seq"] for r in rows] == [3, 4, 5, 6, 7]
    assert [r["state"] for r in rows] == ["completed", "completed", "failed", "running", "issued"]
    assert rows[0]["numel"] == 3 and rows[0]["dtype"] == "float64" and rows[0]["issued"] == 3.0
    assert rows[0]["started"] == 3.0 and rows[0]["ended"] == 3.5 and rows[2]["ended"] == 5.5
    assert rows[3]["op"] == "broadcast" and rows[3]["ended"] == 0.0
    assert rows[4]["numel"] == 0 and rows[4]["issued"] == 7.0 and rows[4]["started"] == 0.0


def test_a_slot_reused_does_not_show_its_old_times() -> None:
    from pyc10d.backends.flight_recorder import FlightRecorder

    rec = FlightRecorder("g", 0, 0, 2, keep=4)
    slot = rec.issue(1, "allreduce", torch.ones(1))
    rec.started[slot], rec.ended[slot] = 1.0, 2.0
    again = rec.issue(1 + rec.mask + 1, "allreduce", torch.ones(1), issued=3.0)  # same slot, queued
    assert again == slot
    assert [r["state"] for r in rec.entries()] == ["issued"]
    rec.started[slot] = 4.0  # it runs: the old end time is older than its start
    assert [(r["state"], r["ended"]) for r in rec.entries()] == [("running", 0.0)]


def test_a_ring_not_yet_full_shows_every_operation() -> None:
    from pyc10d.backends.flight_recorder import FlightRecorder

    rec = FlightRecorder("g", 0, 0, 2, keep=5)
    for seq in range(1, 5):  # 4 of the 5 it keeps
        rec.ended[rec.issue(seq, "allreduce", torch.ones(1), issued=-float(seq))] = seq + 0.5
    rows = rec.entries()
    assert [r["seq"] for r in rows] == [1, 2, 3, 4]
    assert all(r["state"] == "completed" and r["started"] == r["issued"] for r in rows)
