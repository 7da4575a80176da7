"""Flight-recorder dumps drawn: ``--trace`` writes valid Chrome trace JSON (schema-checked),
``--plot`` a PNG with a row per rank, from the dumps of a real desync test and chaos trial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chaos import Trial, run_trial

from pyc10d import flight_recorder, timeline
from tests._multirank import run_ranks
from tests.backends.test_flight_recorder import _skip_one


def _check_chrome_trace(trace: dict) -> list[dict]:
    """The schema of Chrome's trace format (the JSON object form); the complete events."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    slices = []
    for e in trace["traceEvents"]:
        assert isinstance(e["ph"], str) and isinstance(e["name"], str), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], float | int) and isinstance(e["dur"], float | int) and e["dur"] >= 0, e
            slices.append(e)
        elif e["ph"] == "i":
            assert isinstance(e["ts"], float | int) and e["s"] in ("g", "p", "t"), e
        else:
            assert e["ph"] == "M" and isinstance(e["args"]["name" if "name" in e["args"] else "sort_index"],
                                                  str | int), e
    return slices


@pytest.mark.timeout(60)
def test_desync_dumps_as_trace_and_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYC10D_TRACE_DIR", str(tmp_path))
    assert run_ranks("tcp", 4, _skip_one, timeout=40) == ["failed"] * 4
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    assert flight_recorder.main([str(tmp_path), "--trace", str(out), "--plot", str(png)]) == 0
    slices = _check_chrome_trace(json.loads(out.read_text()))
    assert {e["pid"] for e in slices} == {0, 1, 2, 3}  # one track per rank
    # a rank aborted by a peer before it issued #4 (possible under load) ends at #3
    at4 = {e["pid"]: e for e in slices if e["args"]["seq"] == 4}
    assert at4[3]["name"] == "barrier" and len(at4) >= 2, at4
    assert all(e["name"] == "allreduce" for r, e in at4.items() if r != 3), at4
    assert all(e["args"]["state"] == "failed" for e in at4.values())
    assert all(sum(e["pid"] == r and e["args"]["state"] == "completed" for e in slices) >= 2 for r in range(4))
    groups = flight_recorder.load(tmp_path)
    (dumps,) = groups.values()
    mismatch = timeline.first_mismatch(dumps)
    assert mismatch is not None and mismatch[0] == 4
    ax = timeline.plot(groups)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 4 and labels[3].startswith("rank 3"), labels
    if len(at4) >= 3:  # a majority ran all_reduce: rank 3 is the odd one
        assert timeline.out_of_step(mismatch) == [3] and "out of step" in labels[3], labels
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(60)
def test_chaos_dumps_plot_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYC10D_TRACE_DIR", str(tmp_path))
    verdict = run_trial(Trial.make(90_001, "shm"))  # 4 ranks, rank 2 SIGKILLed
    assert verdict["ok"], verdict
    groups = flight_recorder.load(tmp_path)
    (dumps,) = groups.values()
    victim = verdict["victim"]
    assert victim not in dumps and len(dumps) == verdict["world"] - 1
    png = tmp_path / "chaos.png"
    ax = timeline.plot(groups, str(png))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert [lab.split()[1] for lab in labels] == [str(r) for r in range(verdict["world"])], labels
    assert "no dump" in labels[victim] and "slowest" in labels[victim], labels  # the dead rank is marked
    assert timeline.slowest(dumps, verdict["world"])[0] == victim
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    _check_chrome_trace(timeline.to_trace(groups))
