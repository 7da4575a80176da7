"""``python -m pyc10d.bench.floor``: every layer runs and checks every op; a skipped op fails."""

from __future__ import annotations

import pytest

from pyc10d.bench import floor

pytestmark = pytest.mark.timeout(30)


def test_every_layer_runs_checked() -> None:
    records = floor.measure(list(floor.LAYERS + floor.PEERS), k=40, loops=2)
    assert [r["layer"] for r in records] == list(floor.LAYERS + floor.PEERS)
    for r in records:
        assert r["correct"], r
        assert r["us"] > 0 and len(r["loops_us"]) == 2 and r["ops_per_loop"] == 40
    assert records[0]["x_floor"] == 1.0 and records[0]["adds_us"] is None
    assert all(r["adds_us"] is not None for r in records[1:len(floor.LAYERS)])
    assert records[-1]["adds_us"] is None and records[-1]["x_floor"] > 0  # the peer is beside, not above


def test_the_tcp_ladder_runs_checked() -> None:
    """Its floor is the spinning socket; the blocking one sits beside it (``adds_us`` of
    each layer is over the one before it in the ladder)."""
    records = floor.measure(list(floor.TCP_LAYERS), k=40, loops=2)
    by = {r["layer"]: r for r in records}
    assert all(r["correct"] for r in records), records
    assert by["socket_spin"]["x_floor"] == 1.0 and by["socket_block"]["adds_us"] is None
    assert by["pyc10d_tcp"]["adds_us"] == pytest.approx(by["pyc10d_tcp"]["us"] - by["socket_spin"]["us"])


@pytest.mark.parametrize("layer", floor.LAYERS + floor.TCP_LAYERS + floor.PEERS)
def test_the_check_fails_when_one_op_does_nothing(layer: str) -> None:
    """Op 7 of the first timed loop does nothing on rank 0 (an exchange layer: no write, no
    wait; an all_reduce layer: reduces a clone, so the ranks stay in step)."""
    (rec,) = floor.measure([layer], k=20, loops=1, skip=(layer, 7))
    assert not rec["correct"] and rec["wrong"] >= 1, rec


def test_main_writes_json_and_rejects_unknown_layers(tmp_path, capsys) -> None:
    assert floor.main(["--layers", "mmap_flag", "--iters", "30", "--loops", "1", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("floor-*.json")
    assert "mmap_flag" in capsys.readouterr().out and path.stat().st_size > 0
    with pytest.raises(SystemExit):
        floor.main(["--layers", "nope"])
