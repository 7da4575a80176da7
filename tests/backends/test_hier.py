"""The hierarchical backend on one machine: ranks told they are on different hosts.

Each rank reports a host identity of the test's choosing, so ``auto`` builds the
hierarchical engine with shm between the ranks of a "host" and tcp between the hosts'
leaders, all on this machine (``tests/backends/test_multihost.py`` runs the same on real network
namespaces). Every conformance family that covers a collective runs on several layouts:
equal hosts with consecutive ranks (blocks exchanged in place), interleaved ranks and
uneven hosts (blocks reordered and padded).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _multirank import run_ranks
from test_conformance import FAMILIES, RUN_TIMEOUT

import pyc10d as dist
from pyc10d.backends.topology import HostLayout

#: host of each rank
LAYOUTS = {"2x2": [0, 0, 1, 1], "interleaved": [0, 1, 0, 1], "2+1": [0, 0, 1], "1+3": [0, 1, 1, 1]}
COLLECTIVE_FAMILIES = ["all_reduce", "broadcast", "reduce", "all_gather", "gather_scatter", "reduce_scatter",
                       "all_to_all", "async", "subgroups", "defaults"]


def _on_fake_hosts(rank: int, ws: int, store_path: str, hosts: list[int], family: str, backend: str) -> int:
    from pyc10d.backends import shm

    shm.host_identity = lambda: f"h{hosts[rank]}/boot/0"
    store = dist.FileStore(store_path, ws)
    dist.init_process_group(backend, store=store, rank=rank, world_size=ws, timeout=timedelta(seconds=30))
    assert dist.get_backend() == "hier", dist.get_backend()
    n = FAMILIES[family][0](rank, ws)
    dist.destroy_process_group()
    return n


#: ``make test`` runs each family on one layout, in turn (each layout gets two or three
#: families); the other three are ``full`` (``make test-full``).
HOST_CASES = [pytest.param(layout, family, id=f"{layout}-{family}",
                           marks=[] if i % len(LAYOUTS) == j else [pytest.mark.full])
              for j, layout in enumerate(LAYOUTS) for i, family in enumerate(COLLECTIVE_FAMILIES)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("layout", "family"), HOST_CASES)
def test_collectives_on_fake_hosts(tmp_path, layout: str, family: str) -> None:
    hosts = LAYOUTS[layout]
    counts = run_ranks("auto", len(hosts), _on_fake_hosts, str(tmp_path / "store"), hosts, family, "auto",
                       init=False, timeout=RUN_TIMEOUT, patches=FAMILIES[family][1])
    assert all(n > 0 for n in counts)


def test_layout_math() -> None:
    lay = HostLayout.from_identities(["b/x/1", "a/x/2", "b/x/1", "a/x/2", "c/x/3"])
    assert lay.hosts == ((0, 2), (1, 3), (4,))
    assert lay.names == ("b", "a", "c")
    assert lay.leaders == [0, 1, 4]
    assert [lay.slot(r) for r in range(5)] == [0, 2, 1, 3, 4]
    assert not lay.host_major()
    assert HostLayout.from_identities(["a", "a", "b", "b"]).host_major()
    assert not HostLayout.from_identities(["a", "a", "b"]).host_major()
    sub = lay.subset([1, 2, 3])
    assert sub.hosts == ((0, 2), (1,)) and sub.names == ("a", "b")
    assert lay.describe_lost({1, 3, 4}) == "host 'a' (ranks 1, 3); host 'c' (rank 4)"
    assert lay.describe_lost({2}) == "rank 2 of host 'b'"


def test_hosts_of_one_kernel_are_placed_as_one() -> None:
    """Namespace hosts (or containers) of one machine: hosts apart, one kernel and its CPUs;
    placement counts every rank on the kernel (two hosts placing their ranks apart pinned
    them onto the same CPUs: placement.md, "A shared host")."""
    lay = HostLayout.from_identities(["h0/boot1/5", "h0/boot1/5", "h1/boot1/6", "h1/boot1/6", "h2/boot2/5"])
    assert lay.hosts == ((0, 1), (2, 3), (4,)) and lay.kernels == ("boot1", "boot1", "boot2")
    assert [lay.kernel_slot(r) for r in range(5)] == [(0, 4), (1, 4), (2, 4), (3, 4), (0, 1)]
    assert [lay.local_index(r) for r in range(4)] == [0, 1, 0, 1]  # (what it placed by before)
    sub = lay.subset([0, 2, 4])
    assert sub.kernels == ("boot1", "boot1", "boot2") and sub.kernel_slot(1) == (1, 2)
    apart = HostLayout.from_identities(["a/k1/1", "a/k1/1", "b/k2/1", "b/k2/1"])
    assert [apart.kernel_slot(r) for r in range(4)] == [(0, 2), (1, 2), (0, 2), (1, 2)]
