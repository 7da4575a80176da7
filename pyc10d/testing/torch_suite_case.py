"""torch's own backend suite (``distributed_test.DistributedTest``) bound to one backend.

Import this module only with the suite's environment set (``BACKEND``, ``WORLD_SIZE``;
``pyc10d.testing.torch_suite`` sets them): torch's ``distributed_test`` reads ``BACKEND`` at
import time and decides then which tests apply. The suite's rank processes import this same
module by name (``TestDistBackendWithSpawn._run``), so everything a rank needs happens here at
import: pyc10d's names are registered with torch, declared to torch's suite as a plugin with the
features pyc10d has, and, when ``PYC10D_SERVE_GLOO`` names a pyc10d engine (``shm`` / ``tcp``),
every group torch builds for the name ``"gloo"`` is a pyc10d group on that engine: the same
``serve_gloo`` users get (``pyc10d/torch_backend/gloo_name.py``).

That last mode runs the tests torch gates on the *name* gloo (timeouts, monitored_barrier,
batch_isend_irecv on CPU, ...) against pyc10d; ``dist.get_backend`` still says ``"gloo"``
(torch records the name it was asked for), the group itself says which engine it is.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import DistTestCases

from pyc10d.settings import SERVE_GLOO, SUITE_START
from pyc10d.torch_backend import BACKENDS
from pyc10d.torch_backend.gloo_name import apply_setting

#: The env var naming the pyc10d engine that serves torch's name "gloo" (unset: Gloo is Gloo):
#: the user-facing setting, so that this pass tests what users get.
GLOO_AS_ENV = SERVE_GLOO.name
#: How the suite starts its ranks: "spawn" (torch's own driver) or "fork" (start-up in ms).
START_ENV = SUITE_START.name

#: What pyc10d declares to torch's suite: every name is a plugin with DDP and subgroups.
FEATURES: tuple[str, ...] = ("plugin", "ddp", "subgroup")

for _feature in FEATURES:
    DistTestCases.backend_feature[_feature].update(BACKENDS)


#: The engine serving the name "gloo" in this pass (None: Gloo is Gloo).
GLOO_AS = apply_setting()

# torch's suite module reads BACKEND now: the declarations above must come first.
import torch.testing._internal.distributed.distributed_test as _suite_module  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if GLOO_AS:
    # torch checks profiler events only for its built-in backends: events Gloo's C++ records
    # under the title "gloo:<op>". Under the name gloo pyc10d is still a plugin (its ops record
    # no such events), so the check is off in this pass, as it is for every plugin.
    for _listed in (_suite_module.PROFILING_SUPPORTED_BACKENDS,
                    _suite_module.SEND_RECV_PROFILING_SUPPORTED_BACKENDS):
        _listed[:] = [b for b in _listed if b != dist.Backend.GLOO]


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """torch's ``test_distributed_spawn`` class: every test runs on ``WORLD_SIZE`` fresh ranks."""

    def setUp(self) -> None:
        super().setUp()
        if SUITE_START.get() == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


__all__ = ["FEATURES", "GLOO_AS", "GLOO_AS_ENV", "START_ENV", "TestDistBackendWithSpawn"]
