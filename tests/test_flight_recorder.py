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
    from pyc10d.backends.fake import FakeBackend
    from pyc10d.testing import FakeStore

    monkeypatch.setenv("PYC10D_FLIGHT_RECORDER_ENTRIES", "0")
    engine = FakeBackend.create(FakeStore(), 0, 2, __import__("datetime").timedelta(seconds=5), "x")
    assert engine.recorder is None
    monkeypatch.setenv("PYC10D_FLIGHT_RECORDER_ENTRIES", "3")
    engine = FakeBackend.create(FakeStore(), 0, 2, __import__("datetime").timedelta(seconds=5), "y")
    assert engine.recorder is not None and engine.recorder.capacity == 3


def test_ring_keeps_the_last_operations_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyc10d.backends.flight_recorder import FlightRecorder, live_entry

    monkeypatch.setenv("PYC10D_FLIGHT_RECORDER_ENTRIES", "3")
    rec = FlightRecorder("g", 0, 0, 2)
    assert rec.entries() == []
    for seq in range(1, 6):  # 5 operations through a ring of 3
        rec.record(seq, "allreduce", [torch.ones(seq, dtype=torch.float64)], 0.0, float(seq), seq == 5)
    live = [live_entry(6, "broadcast", torch.ones(2), 0.0, 6.5), live_entry(7, "barrier", [], 7.0, 0.0)]
    rows = rec.entries(live)
    assert [r["seq"] for r in rows] == [3, 4, 5, 6, 7]
    assert [r["state"] for r in rows] == ["completed", "completed", "failed", "running", "issued"]
    assert rows[0]["numel"] == 3 and rows[0]["dtype"] == "float64" and rows[0]["issued"] == 3.0
    assert rows[0]["ended"] >= rows[0]["started"] == 3.0
    assert rows[3]["op"] == "broadcast" and rows[4]["numel"] == 0 and rows[4]["issued"] == 7.0
