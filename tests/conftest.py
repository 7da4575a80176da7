"""Suite-wide pytest set-up.

``make test`` runs the suite on pytest-xdist workers (one per CPU, ``--dist loadgroup``).
Most tests fork their ranks from the worker, which has torch and pyc10d imported already, and
cost little more than their work. Tests marked ``interpreters`` start fresh Python
interpreters instead (launchers, namespace hosts, benchmark and example scripts), each of
which imports torch: seconds of CPU apiece. The marker selects them (``-m interpreters``,
``-m "not interpreters"``); it does not change where they run.

Why not one worker for all of them (as this file once meant to arrange, through an
``xdist_group`` that pytest-xdist never saw, since its own collection hook ran first): they
are 142 tests and ~320 s of the suite's ~850 s of test time, so one worker would hold them
end to end while the other ran out of work; they have shared the two workers since, green.
Measured on the 2-core machine: the suite is bound by CPU (3 workers: 447 s and 762 s of CPU
against 2 workers: 440 s and 678 s), so spreading them costs nothing the CPU does not.

Tests marked ``full`` are the rest of a grid whose short form runs in ``make test``: more
world sizes, layouts, backends or families of a test that ``make test`` runs on a few of
them, and the long forms of soaks and benchmark smoke runs. ``make test`` deselects them
(``-m "not full"``, which keeps it near 1,000 CPU-seconds), ``make test-full`` runs only
them. No test is ``full`` in every case: collecting the whole suite fails if a test function
would not run at all in ``make test`` (``pytest_collection_modifyitems`` below).
"""

from __future__ import annotations

from typing import Any

import pytest

from pyc10d.testing import reruns


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "interpreters: starts fresh Python interpreters (subprocess, launchers), each of "
        "which imports torch",
    )
    config.addinivalue_line(
        "markers",
        "full: the rest of a grid (or the long form of a soak) whose short form runs in make "
        "test; make test-full runs these",
    )


#: Tests that leave their xdist worker bigger for the rest of the run, so they run last. A forked
#: rank costs its worker's page tables twice (copied at fork, torn down at exit): measured in a
#: make test run (a tracking plugin), the two workers' page tables grew from 1.2 MB to 1.8 and
#: 2.9 MB, and a seed port's 4-rank test cost 0.31 CPU-s past that against 0.23 before (median
#: of ~50 each, 0.25 against 0.18 of it system time). Growth per file, in kB of page tables
#: over a run: torchft's tests ~1,400 (its Rust runtimes' threads: +600 mappings), the threaded
#: backend's random collectives ~460 and the 1,024-rank simulation ~400, the algorithms on
#: threaded ranks ~220 and ~140, the compiled functional seeds, the timeline and the floor
#: benchmark ~60-120 each. Everything else keeps its order.
RUN_LAST = ("tests/integrations/test_torchft.py", "tests/integrations/test_torchft_pg.py", "tests/sim/",
            "tests/seeds/test_functional_api.py", "tests/backends/test_threaded.py", "tests/algorithms/test_algorithms.py",
            "tests/algorithms/test_logarithmic.py", "tests/test_timeline.py", "tests/bench/test_bench_floor.py")
#: Tests that fork ranks (or a launcher) from their worker and run a backward there: they run
#: first. On torch 2.14 (its CUDA build, the one on the index) autograd's device threads
#: (``pt_autograd_*``) start in a process on the first of some calls (an AOTAutograd compile
#: does it; so did something else in the worker, a probe of the threads after each test
#: showed), and a process forked after that can never run a backward ("Unable to handle
#: autograd's threading in combination with fork-based multiprocessing"). Seen in make
#: test-torch-next runs: 41, then 21 of these failed on workers that had run such a test first.
FORK_BACKWARD = ("tests/seeds/test_c10d_shm_ddp.py", "tests/seeds/test_c10d_tcp_ddp.py",
                 "tests/nn/test_ddp_backends.py", "tests/test_chaos.py", "tests/torch_backend/test_torch_backend.py",
                 "tests/torch_backend/test_torch_backend_failures.py", "tests/test_docs_examples.py",
                 "tests/seeds/test_functional_api.py::TestCollectivesCpu", "tests/test_elastic.py")
#: Tests that compile through AOTAutograd in their worker's own process (rank threads): after
#: every other (see ``FORK_BACKWARD``).
COMPILES_HERE = ("tests/seeds/test_functional_api.py::TestFunctionalAutograd",
                 "tests/functional/test_functional.py::TestTracingInPlace")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test function keeps a case outside ``full``: ``make test`` runs every test. Tests of
    ``FORK_BACKWARD`` go first, those of ``RUN_LAST`` last, those of ``COMPILES_HERE`` after
    them (stable: the same order on every worker, as pytest-xdist requires)."""
    items.sort(key=lambda item: (not item.nodeid.startswith(FORK_BACKWARD), item.nodeid.startswith(COMPILES_HERE),
                                 item.nodeid.startswith(RUN_LAST)))
    if [str(a).rstrip("/") for a in config.args] != ["tests"]:
        return  # a chosen file or case: not the whole suite
    cases: dict[str, list[bool]] = {}
    for item in items:
        cases.setdefault(item.nodeid.split("[")[0], []).append(item.get_closest_marker("full") is not None)
    only_full = sorted(test for test, full in cases.items() if all(full))
    if only_full:
        raise pytest.UsageError("marked full in every case, so make test would not run them: "
                                + ", ".join(only_full))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A test during which a harness reran a peer's test (``pyc10d.testing.reruns``) carries
    each rerun on its report, to the process that prints the summary."""
    outcome = yield
    if call.when == "call" and reruns.RERUNS:
        outcome.get_result().user_properties.extend(("documented rerun", r) for r in reruns.RERUNS)
        reruns.RERUNS.clear()
    if call.when == "call" and reruns.BESIDE:
        outcome.get_result().user_properties.extend(("peer beside", b) for b in reruns.BESIDE)
        reruns.BESIDE.clear()


#: A launcher's variables: tests ported from torch's set them in the test process as torch's do
#: (``RendezvousEnvTest``, ``TestCollectivesWithNCCL``); left there, the next test of the same
#: xdist worker ran as if launched (a Slurm task given ``RANK`` by a cluster that copied the
#: worker's environment failed with "environment variable RANK expected": run 35).
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "BACKEND")


@pytest.fixture(autouse=True)
def _launch_environment_restored() -> Any:
    """Every test leaves the launcher's variables as it found them."""
    import os

    saved = {k: os.environ.get(k) for k in _LAUNCH_VARS}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each documented rerun by name, and their number in pytest's closing line ("N documented
    reruns", which counts this stats key: one entry per rerun, the test's report, since other
    plugins read every stats entry as a report): a pass that came from a rerun is never silent.
    Then each peer run reported beside pyc10d's, its crashes counted there too ("N peer aborts").
    Read from the reports pytest keeps (with xdist, the workers', their properties with them)."""
    seen = [(rep, why) for reports in terminalreporter.stats.values() for rep in reports
            for name, why in getattr(rep, "user_properties", ()) if name == "documented rerun"]
    if seen:
        terminalreporter.stats["documented reruns"] = [rep for rep, _ in seen]
        terminalreporter.section("documented reruns")
        for why in dict.fromkeys(why for _, why in seen):
            terminalreporter.write_line(why)
    beside = [(rep, tuple(b)) for reports in terminalreporter.stats.values() for rep in reports
              for name, b in getattr(rep, "user_properties", ()) if name == "peer beside"]
    if beside:
        terminalreporter.section("peers beside")
        for what, outcome, _ in dict.fromkeys(b for _, b in beside):
            terminalreporter.write_line(f"{what}: {outcome}")
        aborts = [rep for rep, (_, _, aborted) in beside if aborted]
        if aborts:
            terminalreporter.stats["peer aborts"] = aborts


# A forked rank waits for ever on an import lock that another thread of its parent held at
# the fork. Seen in test_status (2 of 8 runs on a quiet machine): its main thread's first
# ``getaddrinfo`` was importing the idna codec while its job thread forked the ranks, and
# every rank hung in its own ``getaddrinfo``. Imported here, before any test forks.
#
# torch's DDP, FSDP2 and DTensor import torch._dynamo and torch.distributed.tensor lazily, on
# first use: in a rank forked from a parent that has not imported them, every rank pays it
# (2-3 s each on a quiet 2-core machine, 5-6 s under load). Imported here once per worker, the
# forked ranks inherit them.
import encodings.idna  # noqa: E402, F401

import torch._dynamo  # noqa: E402
import torch.distributed.fsdp  # noqa: E402
import torch.distributed.tensor  # noqa: E402, F401
