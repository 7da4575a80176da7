"""torchft's own tests, from its wheel, against ``pyc10d.integrations.torchft.ProcessGroupPyc10d``."""

from __future__ import annotations

import pytest

pytest.importorskip("torchft", reason="torchft-nightly (the test extra) is not installed")

from pyc10d.testing.torchft_suite import manager_case, multi_pg_case  # noqa: E402

MultiPgTestPyc10d = multi_pg_case("pyc10d")
ManagerIntegTestPyc10d = manager_case("pyc10d")
