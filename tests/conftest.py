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
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "interpreters: starts fresh Python interpreters (subprocess, launchers), each of "
        "which imports torch",
    )


# torch's DDP, FSDP2 and DTensor import torch._dynamo and torch.distributed.tensor lazily, on
# first use: in a rank forked from a parent that has not imported them, every rank pays it
# (2-3 s each on a quiet 2-core machine, 5-6 s under load). Imported here once per worker, the
# forked ranks inherit them.
import torch._dynamo  # noqa: E402, F401
import torch.distributed.fsdp  # noqa: E402, F401
import torch.distributed.tensor  # noqa: E402, F401
