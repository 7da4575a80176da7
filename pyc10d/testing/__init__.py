"""Test utilities for pyc10d, named after torch's distributed test helpers.

``from pyc10d.testing import MultiProcessTestCase, requires_gloo, ...`` replaces
imports from ``torch.testing._internal.common_distributed`` and
``common_utils`` in ported tests. Shared test bodies from torch's
``test_c10d_common.py`` live in :mod:`pyc10d.testing.c10d_common`.

Helpers that call the distributed API use :mod:`pyc10d` by default; set
``PYC10D_TESTING_DIST=torch.distributed`` (or call :func:`set_dist_module`) to
run the same tests against PyTorch for comparison. Nothing here imports
torch.distributed unless told to.
"""

from pyc10d.testing._dist import dist_module_name, get_dist, set_dist_module
from pyc10d.testing.case import SEED, TestCase, run_tests, set_rng_seed
from pyc10d.testing.data import gpus_for_rank, simple_sparse_reduce_tests
from pyc10d.testing.decorators import (
    ADDRESS_IN_USE,
    CONNECT_TIMEOUT,
    requires_gloo,
    requires_nccl,
    retry_on_connect_failures,
    skip_but_pass_in_sandcastle,
    skip_but_pass_in_sandcastle_if,
    skip_if_lt_x_gpu,
    skip_if_small_worldsize,
    skip_if_win32,
)
from pyc10d.testing.fake import FakeStore
from pyc10d.testing.multiprocess import TEST_SKIPS, MultiProcessTestCase
from pyc10d.testing.net import LOOPBACK, Device, create_device, find_free_port
from pyc10d.testing.params import instantiate_parametrized_tests, parametrize
from pyc10d.testing.threaded import MultiThreadedTestCase, spawn_threads_and_init_comms

__all__ = [
    "ADDRESS_IN_USE",
    "CONNECT_TIMEOUT",
    "Device",
    "FakeStore",
    "LOOPBACK",
    "MultiProcessTestCase",
    "MultiThreadedTestCase",
    "SEED",
    "TEST_SKIPS",
    "TestCase",
    "create_device",
    "dist_module_name",
    "find_free_port",
    "get_dist",
    "gpus_for_rank",
    "instantiate_parametrized_tests",
    "parametrize",
    "requires_gloo",
    "requires_nccl",
    "retry_on_connect_failures",
    "run_tests",
    "set_dist_module",
    "set_rng_seed",
    "simple_sparse_reduce_tests",
    "skip_but_pass_in_sandcastle",
    "skip_but_pass_in_sandcastle_if",
    "skip_if_lt_x_gpu",
    "skip_if_small_worldsize",
    "skip_if_win32",
    "spawn_threads_and_init_comms",
]
