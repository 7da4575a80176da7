"""``python -m pyc10d.bench.placement``: one case, one round, its figure from the bench worker's
checked loops (a wrong result is a problem, not a figure: ``bench.worker``'s checks)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pyc10d.bench import placement


@pytest.mark.timeout(45)
def test_one_job_default_and_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert placement.main(["--cases", "1 job", "--configs", "default,none", "--rounds", "1", "--sizes", "65536",
                           "--iters", "20", "--lead", "2", "--timeout", "30", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^1 job +65536 B +default +[\d.]+ \( *[\d.]+\) +none +[\d.]+ \( *[\d.]+\) +/none [\d.]+$", out, re.M), out
    result = json.loads(next(tmp_path.glob("placement-*.json")).read_text())
    assert result["problems"] == [] and {r["config"] for r in result["rows"]} == {"default", "none"}
