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
    assert engine.recorder is not None and engine.recorder.entries.maxlen == 3
