"""``pyc10d.testing.clients``'s comparison: equal runs pass, a run on another backend, other
losses or other parameters fail it, and so does a run the framework did not distribute or a
Gloo reference that ran on pyc10d (``make test-clients`` runs the clients themselves)."""

from __future__ import annotations

from pyc10d.testing import clients


def test_the_comparison_can_fail() -> None:
    ref = {"group": "gloo", "losses": [2.0, 1.5, 1.25], "checksum": 3.5}
    same = {**ref, "group": "pyc10d"}
    assert clients.compare("x", "pyc10d", same, ref) == []
    assert clients.compare("x", "pyc10d", {**same, "losses": [2.0, 1.5, 1.2500001]}, ref) == []  # summed in another order
    assert any("did not use pyc10d" in p for p in clients.compare("x", "pyc10d", ref, ref))
    assert any("losses differ" in p for p in clients.compare("x", "pyc10d", {**same, "losses": [2.0, 1.5, 1.3]}, ref))
    assert any("losses differ" in p for p in clients.compare("x", "pyc10d", {**same, "losses": [2.0, 1.5]}, ref))
    assert any("parameters differ" in p for p in clients.compare("x", "pyc10d", {**same, "checksum": 3.6}, ref))


def test_a_run_under_the_name_gloo_is_told_apart_by_its_group() -> None:
    """accelerate reports the name gloo on either engine: the group's class tells them apart."""
    ref = {"backend": "gloo", "process_group": "torch.distributed.distributed_c10d.ProcessGroup",
           "num_processes": 2, "losses": [1.0, 0.5], "checksum": 1.0}
    served = {**ref, "process_group": "pyc10d.torch_backend.gloo_name.GlooServedGroup"}
    assert clients.compare("a", "serve-gloo", served, ref) == []
    assert any("did not use pyc10d" in p for p in clients.compare("a", "serve-gloo", ref, ref))
    assert any("reference ran on pyc10d" in p for p in clients.compare("a", "serve-gloo", served, served))
    alone = {**served, "num_processes": 1}  # accelerate without cpu=True: each rank trains alone
    assert any("on 1 process(es), not 2" in p for p in clients.compare("a", "serve-gloo", alone, ref))
