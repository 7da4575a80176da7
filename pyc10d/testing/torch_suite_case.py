"""torch's own backend suite (``distributed_test.DistributedTest``) bound to one backend.

Import this module only with the suite's environment set (``BACKEND``, ``WORLD_SIZE``;
``pyc10d.testing.torch_suite`` sets them): torch's ``distributed_test`` reads ``BACKEND`` at
import time and decides then which tests apply. The suite's rank processes import this same
module by name (``TestDistBackendWithSpawn._run``), so everything a rank needs happens here at
import: pyc10d's names are registered with torch, declared to torch's suite as a plugin with the
features pyc10d has, and, when ``PYC10D_SUITE_GLOO_AS`` names a pyc10d engine (``shm`` /
``tcp``), every group torch builds for the name ``"gloo"`` is a pyc10d group on that engine.

That last mode runs the tests torch gates on the *name* gloo (timeouts, monitored_barrier,
batch_isend_irecv on CPU, ...) against pyc10d: torch's ``_new_process_group_helper`` builds a
Gloo group by calling the module-level name ``ProcessGroupGloo``, so replacing that name in
``torch.distributed.distributed_c10d`` is the one seam needed; ``dist.get_backend`` still says
``"gloo"`` (torch records the name it was asked for), the group itself says which engine it is.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.testing._internal.common_distributed import DistTestCases

from pyc10d.process_group import make_engine
from pyc10d.settings import SUITE_GLOO_AS, SUITE_START
from pyc10d.torch_backend import BACKENDS, TorchProcessGroup, TorchStoreAdapter

#: The env var naming the pyc10d engine that serves torch's name "gloo" (unset: Gloo is Gloo).
GLOO_AS_ENV = SUITE_GLOO_AS.name
#: How the suite starts its ranks: "spawn" (torch's own driver) or "fork" (start-up in ms).
START_ENV = SUITE_START.name

#: What pyc10d declares to torch's suite: every name is a plugin with DDP and subgroups.
FEATURES: tuple[str, ...] = ("plugin", "ddp", "subgroup")

for _feature in FEATURES:
    DistTestCases.backend_feature[_feature].update(BACKENDS)


class _Options:
    """The two fields torch's helper writes into a Gloo group's ``options`` after building it."""

    def __init__(self, timeout: timedelta) -> None:
        self._timeout = timeout
        self.global_ranks_in_group: list[int] = []
        self.group_name = ""


_REAL_GLOO = c10d.ProcessGroupGloo


class GlooNamedGroup(TorchProcessGroup):
    """A pyc10d group built where torch builds ``ProcessGroupGloo(store, rank, size, timeout)``.

    Only the suite's second pass uses it (``PYC10D_SUITE_GLOO_AS``). Class-level helpers tests
    reach through the Gloo class (``create_device``, ``_Options``) stay Gloo's.
    """

    engine_name = "shm"
    create_device = staticmethod(_REAL_GLOO.create_device)
    create_default_device = staticmethod(_REAL_GLOO.create_default_device)
    _Options = _REAL_GLOO._Options
    Options = _REAL_GLOO._Options

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta = timedelta(minutes=30),
                 enable_reconfigure: bool = False) -> None:
        """(``enable_reconfigure``: torch 2.14 passes it; every pyc10d group can be re-formed.)"""
        engine = make_engine(self.engine_name, TorchStoreAdapter(store, timeout), rank, size, timeout,
                             f"gloo-as-{self.engine_name}")
        super().__init__(engine, rank, size, f"pyc10d_{self.engine_name}")
        self.options = _Options(timeout)

    def _set_sequence_number_for_group(self) -> None:
        """torch sets Gloo's sequence number here; pyc10d's engines count their own."""


def _install_gloo_alias(engine: str) -> None:
    if engine not in ("shm", "tcp"):
        raise ValueError(f"{GLOO_AS_ENV}={engine!r}: expected 'shm' or 'tcp'")
    GlooNamedGroup.engine_name = engine
    c10d.ProcessGroupGloo = GlooNamedGroup
    dist.ProcessGroupGloo = GlooNamedGroup


if SUITE_GLOO_AS.get():
    _install_gloo_alias(SUITE_GLOO_AS.get())

# torch's suite module reads BACKEND now: the declarations above must come first.
import torch.testing._internal.distributed.distributed_test as _suite_module  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if SUITE_GLOO_AS.get():
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


__all__ = ["FEATURES", "GLOO_AS_ENV", "START_ENV", "GlooNamedGroup", "TestDistBackendWithSpawn"]
