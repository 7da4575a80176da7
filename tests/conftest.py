"""Suite-wide pytest set-up: how tests share the machine when run in parallel.

``make test`` runs the suite on pytest-xdist workers (one per CPU, ``--dist loadgroup``).
Most tests fork their ranks from the worker, which has torch and pyc10d imported already, and
cost little more than their work. Tests marked ``interpreters`` start fresh Python
interpreters instead (launchers, namespace hosts, benchmark and example scripts), each of
which imports torch: seconds of CPU apiece. Two such tests at once on a 2-core machine make
each other's start-up slow enough to run into their own timeouts, so every test so marked
runs on one worker, one at a time, while the other workers go on with the rest.

Mark a test (or a module, through ``pytestmark``) ``@pytest.mark.interpreters`` when it
starts Python processes with ``subprocess`` or a launcher rather than through
``_multirank.run_ranks`` or ``pyc10d.testing``'s harnesses.
"""

from __future__ import annotations

import pytest

#: The pytest-xdist group of every test marked ``interpreters``.
INTERPRETERS_GROUP = "interpreters"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "interpreters: starts fresh Python interpreters (subprocess, launchers); under "
        "pytest-xdist these tests run one at a time, on one worker",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("interpreters") is not None:
            item.add_marker(pytest.mark.xdist_group(INTERPRETERS_GROUP))


# torch's DDP, FSDP2 and DTensor import torch._dynamo and torch.distributed.tensor lazily, on
# first use: in a rank forked from a parent that has not imported them, every rank pays it
# (2-3 s each on a quiet 2-core machine, 5-6 s under load). Imported here once per worker, the
# forked ranks inherit them.
import torch._dynamo  # noqa: E402, F401
import torch.distributed.fsdp  # noqa: E402, F401
import torch.distributed.tensor  # noqa: E402, F401
