"""The seed port of test_c10d_gloo (``test_c10d_tcp.py``) run again on the shm backend.

Every test class of the port is re-declared here with "gloo" (``init_process_group("gloo")``
and ``ProcessGroupGloo``) served by the shm backend instead of tcp, so the seed's contract —
every collective, its checks, timeouts, groups — holds on shared memory too. The alias is
set in the parent before a test forks its ranks, and restored afterwards.
"""

from __future__ import annotations

import unittest

import pytest
import test_c10d_tcp as seed

from pyc10d.process_group import Backend

pytestmark = pytest.mark.timeout(50)  # backstop; the harness gives up after 40 s itself


def _on_shm(cls: type) -> type:
    class OnShm(cls):  # type: ignore[misc, valid-type]
        timeout = 40.0  # MultiProcessTestCase: kill and report stuck ranks after this

        def setUp(self) -> None:  # unittest naming
            self._gloo_was = Backend._aliases["gloo"]
            Backend._aliases["gloo"] = "shm"
            super().setUp()

        def tearDown(self) -> None:  # unittest naming
            try:
                super().tearDown()
            finally:
                Backend._aliases["gloo"] = self._gloo_was

    OnShm.__name__ = OnShm.__qualname__ = f"{cls.__name__}OnShm"
    return OnShm


for _name, _cls in list(vars(seed).items()):
    if (isinstance(_cls, type) and issubclass(_cls, unittest.TestCase)
            and _cls.__module__ == seed.__name__ and any(a.startswith("test") for a in dir(_cls))):
        globals()[f"{_name}OnShm"] = _on_shm(_cls)
