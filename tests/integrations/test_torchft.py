"""torchft's own tests, from its wheel, against ``pyc10d.integrations.torchft.ProcessGroupPyc10d``.

The multi-PG cases for every collective, with and without a rank that shuts its group down,
and torchft's Manager integration tests (``pyc10d.testing.torchft_suite`` says how they are
run unchanged). About 10-20 s, on one xdist worker (``xdist_group``): the multi-PG cases share
one set of groups made once per class.
``make test-torchft`` runs the same selection three times beside torchft's Gloo classes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torchft", reason="torchft-nightly (the test extra) is not installed")

from pyc10d.testing.torchft_suite import manager_case, multi_pg_case

pytestmark = [pytest.mark.timeout(50), pytest.mark.xdist_group("torchft")]

MultiPgTestPyc10d = multi_pg_case("pyc10d")
ManagerIntegTestPyc10d = manager_case("pyc10d")


def test_skip_init_sync_reruns_only_a_run_whose_replicas_started_apart() -> None:
    """The harness's rerun of ``test_ddp_skip_init_sync``: forced here, the overlap of one
    replica's first ``torch.rand`` with the other's seeded init (the test's own race) makes
    the first run fail and a rerun pass; with none, the test runs once. (Outside the forced
    run both replicas finish their init before either draws again: the race cannot recur by
    chance and make this test flaky.)"""
    import io
    import threading
    import time
    import unittest
    from unittest import mock

    import torch
    from torchft import manager_integ_test as mit

    built = [0]
    original, lock = mit.MyModel, threading.Lock()

    class BothInitsFirst:
        """``INIT_LOCK``, whose exit waits until both replicas have built their model."""

        def __init__(self) -> None:
            self.done = threading.Barrier(2, timeout=20)

        def __enter__(self) -> None:
            lock.acquire()

        def __exit__(self, *exc: object) -> None:
            lock.release()
            if built[0] > 2 or not race:  # not the forced run
                self.done.wait()

    def suite_with(forced: bool) -> tuple[unittest.TestResult, int]:
        nonlocal race
        built[0], race = 0, forced

        class Raced(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args, **kwargs) -> None:
                built[0] += 1
                if race and built[0] == 2:  # the first run's second replica, once
                    torch.nn.Linear(3, 8)  # draws from the generator after its seed ...
                    time.sleep(0.2)  # ... while the other replica's first step draws too
                super().__init__(*args, **kwargs)

        with mock.patch.object(mit, "MyModel", Raced), mock.patch.object(mit, "INIT_LOCK", BothInitsFirst()):
            case = manager_case("pyc10d")("test_ddp_skip_init_sync")
            return unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(case), built[0]

    from pyc10d.testing import reruns

    race, before = False, len(reruns.RERUNS)
    result, n = suite_with(forced=True)
    assert result.wasSuccessful() and n == 4, (n, result.failures)
    # the rerun is noted (make test's closing line counts them); this one was forced, not seen
    forced = reruns.RERUNS[before:]
    del reruns.RERUNS[before:]
    assert len(forced) == 1 and "test_ddp_skip_init_sync: its replicas started from different weights" in forced[0]
    result, n = suite_with(forced=False)
    assert result.wasSuccessful() and n == 2, (n, result.failures)
    assert len(reruns.RERUNS) == before
