"""``python -m pyc10d.bench.shrink``: one round per method on tcp, each recovery checked (the
worker asserts the survivors' all_reduce sum) and reported."""

from __future__ import annotations

import re

import pytest

from pyc10d.bench import shrink


@pytest.mark.timeout(60)
def test_one_round_of_each_method(capsys: pytest.CaptureFixture[str]) -> None:
    assert shrink.main(["--rounds", "1", "--backends", "tcp"]) == 0
    out = capsys.readouterr().out
    for method in ("shrink", "rebuild"):
        assert re.search(rf"^tcp +{method} +[\d.]+ ms \(.*\) +[\d.]+ ms \(.*\)$", out, re.M), out
