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
