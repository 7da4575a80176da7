"""``pyc10d.sim``: the real algorithms over the simulated network give the right results,
the times the alpha-beta arithmetic gives where it is exact, and logarithmic times at scale."""

from __future__ import annotations

import pytest
import torch

from pyc10d import algorithms as algo
from pyc10d.algorithms import cost
from pyc10d.sim.engine import SimDeadlock, simulate
from pyc10d.sim.network import Net
from pyc10d.sim.table import model_of, outcome
from pyc10d.types import ReduceOp

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("n", [1, 3, 8, 13])
def test_results_are_the_algorithms(n: int) -> None:
    def body(c: object) -> torch.Tensor:
        t = torch.arange(7, dtype=torch.float64) + c.rank
        algo.allreduce_rabenseifner(c, t, ReduceOp.SUM)
        return t

    _, res = simulate(n, Net(), body)
    want = sum(torch.arange(7, dtype=torch.float64) + r for r in range(n))
    for t in res:
        assert torch.equal(t, want)


def test_time_is_alpha_beta_where_exact() -> None:
    """Recursive doubling at n = 4, one rank per host: 2 steps of (latency + S·beta)."""
    net = Net(latency=10e-6, o=0.0, nic_beta=1e-9, gamma=0.0)
    s = 1 << 20
    got = outcome("allreduce", algo.allreduce_recursive_doubling, 4, s, net).seconds
    assert got == pytest.approx(2 * (10e-6 + s * 1e-9), rel=1e-9)
    # reductions are charged: gamma adds S·gamma per step
    net = Net(latency=10e-6, o=0.0, nic_beta=1e-9, gamma=1e-9)
    got = outcome("allreduce", algo.allreduce_recursive_doubling, 4, s, net).seconds
    assert got == pytest.approx(2 * (10e-6 + 2 * s * 1e-9), rel=1e-9)


# make test: recursive doubling and dissemination (1.5-3 s of CPU each at n = 1024);
# make test-full adds Rabenseifner's all-reduce and recursive halving (5-10 s each).
@pytest.mark.parametrize(("op", "s"), [
    pytest.param("allreduce", 8, id="allreduce-8"),
    pytest.param("barrier", 0, id="barrier-0"),
    pytest.param("allreduce", 1 << 20, id="allreduce-1MiB", marks=pytest.mark.full),
    pytest.param("reduce_scatter", 4096, id="reduce_scatter-4096", marks=pytest.mark.full),
])
def test_logarithmic_at_1024_within_twice_the_bound(op: str, s: int) -> None:
    net = Net()
    o = outcome(op, algo.select(op, 1024, s), 1024, s, net)
    assert o.how == "sim" and o.peers_per_rank <= 20, o
    assert o.seconds <= 2 * cost.lower_bound(op, 1024, s, model_of(net)), (op, s, o)


def test_a_missing_send_is_a_deadlock_not_a_hang() -> None:
    def body(c: object) -> None:
        if c.rank == 0:
            c.recv(1, torch.empty(1))

    with pytest.raises(SimDeadlock):
        simulate(2, Net(), body)


def test_one_way_on_one_host_is_two_overheads_and_one_copy() -> None:
    """The fit's model (``sim.fit``): between ranks of one host the receiver copies while the
    sender does, so one way costs 2·o + local_latency + S·cpu_beta, not two copies."""
    net = Net(ranks_per_host=2, cores_per_host=2, latency=0.0, local_latency=3e-6, o=5e-6,
              nic_beta=0.0, cpu_beta=1e-9, gamma=0.0)
    s = 1 << 20

    def body(c: object) -> None:
        t = torch.ones(4)
        if c.rank == 0:
            c.send(1, t)
        else:
            c.recv(0, t)

    sim, _ = simulate(2, net, body, scale=s / 16)
    assert sim.clock[1] == pytest.approx(2 * 5e-6 + 3e-6 + s * 1e-9, rel=1e-9)


def test_cores_serve_work_in_time_order() -> None:
    """8 ranks on 2 cores, recursive doubling (3 steps): each step is one latency plus the
    16 overheads of its 8 sends and 8 receives shared by 2 cores. A rank whose message had
    come must not take a core at a later time ahead of ranks still at an earlier one (that
    made it 1.44 ms here against this bound's 0.87)."""
    lat, o = 211e-6, 10e-6
    net = Net(ranks_per_host=8, cores_per_host=2, latency=0.0, local_latency=lat, o=o,
              nic_beta=0.0, cpu_beta=0.0, gamma=0.0)
    got = outcome("allreduce", algo.allreduce_recursive_doubling, 8, 8, net).seconds
    assert 3 * (lat + 2 * o) <= got <= 3 * (lat + 8 * o)


@pytest.mark.parametrize("job", ["allreduce", "pingpong"])
def test_fit_measurements_are_checked(job: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sim --fit``'s timed calls check their results: real calls pass; calls that do
    nothing (patched before the ranks fork) fail the fit instead of timing nothing."""
    import pyc10d
    from pyc10d.sim import fit

    monkeypatch.setattr(fit, "SIZES", [8])
    monkeypatch.setattr(fit, "PINGPONG", [8])
    got = fit.measure(job, 2)
    assert set(got) == {8} and got[8] > 0
    name = "all_reduce" if job == "allreduce" else "broadcast"
    monkeypatch.setattr(pyc10d, name, lambda *a, **k: None)
    with pytest.raises(RuntimeError, match="wrong results on ranks"):
        fit.measure(job, 2)
