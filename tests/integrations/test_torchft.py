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

from pyc10d.testing.torchft_suite import manager_case, multi_pg_case  # noqa: E402

pytestmark = [pytest.mark.timeout(50), pytest.mark.xdist_group("torchft")]

MultiPgTestPyc10d = multi_pg_case("pyc10d")
ManagerIntegTestPyc10d = manager_case("pyc10d")


def test_skip_init_sync_reruns_only_a_run_whose_replicas_started_apart() -> None:
    """The harness's one rerun of ``test_ddp_skip_init_sync``: forced here, the overlap of
    one replica's first ``torch.rand`` with the other's seeded init (the test's own race)
    makes the first run fail and the rerun pass; with none, the test runs once."""
    import io
    import time
    import unittest
    from unittest import mock

    import torch
    from torchft import manager_integ_test as mit

    built = [0]
    original = mit.MyModel

    def suite_with(race: bool) -> unittest.TestResult:
        built[0] = 0

        class Raced(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
                built[0] += 1
                if race and built[0] == 2:  # the first run's second replica, once
                    torch.nn.Linear(3, 8)  # draws from the generator after its seed ...
                    time.sleep(0.2)  # ... while the other replica's first step draws too
                super().__init__(*args, **kwargs)

        with mock.patch.object(mit, "MyModel", Raced):
            case = manager_case("pyc10d")("test_ddp_skip_init_sync")
            return unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(case)

    result = suite_with(race=True)
    assert result.wasSuccessful() and built[0] == 4, (built, result.failures)
    result = suite_with(race=False)
    assert result.wasSuccessful() and built[0] == 2, (built, result.failures)
