"""``pyc10d.testing.clients``'s comparison: equal runs pass, a run on another backend, other
losses or other parameters fail it (``make test-clients`` runs the clients themselves)."""

from __future__ import annotations

from pyc10d.testing import clients


def test_the_comparison_can_fail() -> None:
    ref = {"group": "gloo", "losses": [2.0, 1.5, 1.25], "checksum": 3.5}
    same = {**ref, "group": "pyc10d"}
    assert clients.compare("x", same, ref) == []
    assert clients.compare("x", {**same, "losses": [2.0, 1.5, 1.2500001]}, ref) == []  # summed in another order
    assert any("had a group on 'gloo'" in p for p in clients.compare("x", ref, ref))  # not on pyc10d
    assert any("losses differ" in p for p in clients.compare("x", {**same, "losses": [2.0, 1.5, 1.3]}, ref))
    assert any("losses differ" in p for p in clients.compare("x", {**same, "losses": [2.0, 1.5]}, ref))
    assert any("parameters differ" in p for p in clients.compare("x", {**same, "checksum": 3.6}, ref))
