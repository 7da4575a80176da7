"""``pyc10d.testing.raycluster``'s checks: a right report passes, a wrong one fails each
check (``make test-ray`` runs the Ray cluster itself; Ray is not in this venv)."""

from __future__ import annotations

from pyc10d.testing import raycluster, tiny_ddp


def test_the_train_check_can_fail() -> None:
    good = {**tiny_ddp.reference(4), "group": "pyc10d", "hosts": ["h0", "h1", "h0", "h1"]}
    assert raycluster.check_train(good, "pyc10d") == []
    assert any("losses differ" in p for p in raycluster.check_train({**good, "losses": good["losses"][:-1]}, "pyc10d"))
    assert any("parameters differ" in p for p in raycluster.check_train({**good, "checksum": 0.0}, "pyc10d"))
    assert any("on 'gloo'" in p for p in raycluster.check_train({**good, "group": "gloo"}, "pyc10d"))
    assert any("not two per host" in p for p in raycluster.check_train({**good, "hosts": ["h0"] * 4}, "pyc10d"))
    assert raycluster.check_train("train.py pyc10d: exit 1", "pyc10d") == ["train.py pyc10d: exit 1"]


def test_the_collective_check_can_fail() -> None:
    row = {"bytes": 8, "us": 10.0, "ok": True}
    good = {"hosts": ["h0", "h1", "h0", "h1"], "backends": {"PYC10D": {"problems": [], "allreduce": [row]}}}
    assert raycluster.check_collective(good) == []
    bad_value = {**good, "backends": {"PYC10D": {"problems": ["rank 1: allreduce: [1.0] != [2.0]"], "allreduce": [row]}}}
    assert any("rank 1: allreduce" in p for p in raycluster.check_collective(bad_value))
    lazy = {**good, "backends": {"PYC10D": {"problems": [], "allreduce": [{**row, "ok": False}]}}}
    assert any("wrong result after the timed loop" in p for p in raycluster.check_collective(lazy))
    assert any("not two per host" in p for p in raycluster.check_collective({**good, "hosts": ["h0"] * 4}))
