"""The DDP seed port (``test_c10d_tcp_ddp.py``) run again on the shm backend.

Each test class is re-declared with "gloo" served by the shm backend instead of tcp, as
``test_c10d_shm.py`` does for the collectives half, so DDP, the Reducer and the comm hooks
hold on shared memory too.
"""

from __future__ import annotations

import unittest

import pytest
import test_c10d_tcp_ddp as seed
from test_c10d_shm import _on_shm

pytestmark = pytest.mark.timeout(50)  # backstop; the harness gives up after 40 s itself

for _name, _cls in list(vars(seed).items()):
    if (isinstance(_cls, type) and issubclass(_cls, unittest.TestCase)
            and _cls.__module__ == seed.__name__ and any(a.startswith("test") for a in dir(_cls))):
        globals()[f"{_name}OnShm"] = _on_shm(_cls)
del _name, _cls
