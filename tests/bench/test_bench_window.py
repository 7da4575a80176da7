"""``python -m pyc10d.bench.window``: put+signal and send/recv ping-pongs, every message's
stamps checked; and the check fails when one put does nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pyc10d.bench import sabotage, window


@pytest.mark.timeout(45)
def test_one_round(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert window.main(["--rounds", "1", "--loops", "1", "--iters", "30", "--sizes", "8,65536",
                        "--jobs", "shm,tcp,gloo", "--timeout", "30", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for impl, op in (("shm", "put_signal"), ("shm", "send_recv"), ("tcp", "put_signal"), ("tcp", "send_recv"),
                     ("gloo", "send_recv")):
        for size in (8, 65536):
            assert re.search(rf"^ +{size} B +{impl} +{op} +[\d.]+ ", out, re.M), (impl, op, size, out)
    result = json.loads(next(tmp_path.glob("window-*.json")).read_text())
    assert result["problems"] == [] and len(result["rows"]) == 10


@pytest.mark.timeout(40)
@pytest.mark.parametrize("impl", ["tcp"])
def test_a_put_that_does_nothing_is_caught(tmp_path: Path, impl: str) -> None:
    records = sabotage.run_sabotaged("pyc10d.bench.window", "pyc10d.window.base:Window.put:3:drop", 2,
                                     ["--impl", impl, "--sizes", "8", "--iters", "20", "--loops", "1"],
                                     tmp_path / "out.json", 35)
    assert not isinstance(records, str), records
    wrong = {r["op"]: r["wrong"] for r in records}
    assert wrong["put_signal"] >= 1 and wrong["send_recv"] == 0, wrong
