"""A fixed slice of torch's own backend suite on the plugin (the whole of it: ``make torch-suite``).

Each case runs a handful of torch's ``distributed_test`` tests in a fresh interpreter through
``python -m pyc10d.testing.torch_suite one`` (ranks forked, as ``make torch-suite`` does) and
requires every one of them to *pass*: a skip would mean torch no longer counts pyc10d as
supporting the feature (the plugin declaration in ``torch_suite_case``), which is a regression
too. The slice covers collectives, DDP, subgroups, point to point, and, under the name gloo,
the wording torch's tests match (timeouts, ``monitored_barrier``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

COLLECTIVES = [
    "test_all_reduce_sum", "test_all_reduce_max", "test_broadcast", "test_reduce_sum",
    "test_all_gather", "test_all_gather_coalesced_simple", "test_gather", "test_scatter",
    "test_barrier", "test_all_reduce_sum_async",
]
DDP = ["test_DistributedDataParallelCPU", "test_ddp_create_graph", "test_static_graph_api_cpu"]
P2P = ["test_send_recv", "test_send_recv_any_source", "test_isend", "test_irecv",
       "test_send_recv_with_tag"]
SUBGROUPS = ["test_all_reduce_full_group_sum", "test_broadcast_full_group", "test_destroy_group",
             "test_get_rank_size_group", "test_new_subgroups_with_group_param"]
#: Run with BACKEND=gloo and every "gloo" group a pyc10d group: torch's wording checks.
GLOO_NAMED = ["test_barrier_timeout_full_group", "test_monitored_barrier_gloo",
              "test_monitored_barrier_gloo_rank_0_timeout", "test_batch_isend_irecv_gloo",
              "test_get_future"]

CASES = {
    "shm-2-collectives-ddp": ("pyc10d_shm", 2, None, COLLECTIVES + DDP),
    "tcp-2-p2p-ddp": ("pyc10d_tcp", 2, None, P2P + DDP[:1]),
    "shm-4-subgroups": ("pyc10d_shm", 4, None, SUBGROUPS),
    "gloo-name-shm-2": ("gloo", 2, "shm", GLOO_NAMED),
}


@pytest.mark.interpreters
@pytest.mark.timeout(55)
@pytest.mark.parametrize("case", list(CASES))
def test_torch_suite_slice(case: str, tmp_path: Path) -> None:
    backend, world_size, gloo_as, names = CASES[case]
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "pyc10d.testing.torch_suite", "one", "--backend", backend,
           "--world-size", str(world_size), "--json", str(out), "--start", "fork",
           "--only", ",".join(names)]
    if gloo_as:
        cmd += ["--gloo-as", gloo_as]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=50, check=False)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    tests = json.loads(out.read_text())["tests"]
    assert sorted(tests) == sorted(names), "the suite no longer has some of these tests"
    bad = {n: f"{r['outcome']}: {r['reason']}" for n, r in tests.items() if r["outcome"] != "passed"}
    assert not bad, bad
