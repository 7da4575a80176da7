"""``pyc10d.bench.compare``: the base / head summary of alternated fresh jobs."""

from __future__ import annotations

import pytest

from pyc10d.bench import compare


def test_summary_ratios_and_spread() -> None:
    key = ("pyc10d-shm", "all_reduce", 2, 65536)
    other = ("pyc10d-shm", "all_reduce", 2, 8)
    base = [{key: 10.0, other: 5.0}, {key: 12.0, other: 5.0}, {key: 11.0}]
    head = [{key: 11.0, other: 6.0}, {key: 20.0, other: 4.0}, {key: 13.0}]
    rows = {(r["bytes"]): r for r in compare.summarize(base, head)}
    r = rows[65536]
    assert r["base_us"] == [10.0, 11.0, 12.0] and r["head_us"] == [11.0, 13.0, 20.0]
    assert r["ratio_min"] == pytest.approx(1.1) and r["ratio_median"] == pytest.approx(13 / 11)
    assert r["spread_base"] == pytest.approx(1.2) and r["spread_head"] == pytest.approx(20 / 11)
    assert rows[8]["ratio_min"] == pytest.approx(0.8)
    text = compare.table(compare.summarize(base, head))
    assert "64KiB" in text and "1.100" in text
