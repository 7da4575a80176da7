"""Names torch programs use that pyc10d must have: ``constants``, ``default_pg_timeout``, ``reduce_op``."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.distributed as tdist
from _multirank import run_ranks

import pyc10d
import pyc10d.constants

pytestmark = pytest.mark.timeout(60)


def test_constants_default_pg_timeout_is_torchs() -> None:
    from torch.distributed import constants as torch_constants

    assert pyc10d.constants.default_pg_timeout == torch_constants.default_pg_timeout
    assert pyc10d.constants.default_pg_timeout.total_seconds() == 30 * 60


def test_constants_default_pg_nccl_timeout_is_torchs() -> None:
    from torch.distributed import constants as torch_constants

    assert pyc10d.constants.default_pg_nccl_timeout == torch_constants.default_pg_nccl_timeout
    assert set(pyc10d.constants.__all__) >= {"default_pg_timeout", "default_pg_nccl_timeout"}


def test_top_level_default_pg_timeout() -> None:
    assert pyc10d.default_pg_timeout == tdist.default_pg_timeout
    assert "default_pg_timeout" in pyc10d.__all__


def test_reduce_op_members_and_deprecation_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = [getattr(pyc10d.reduce_op, n) for n in ("SUM", "PRODUCT", "MIN", "MAX")]
        theirs = [getattr(tdist.reduce_op, n) for n in ("SUM", "PRODUCT", "MIN", "MAX")]
    assert [int(o.value) for o in ours] == [int(t.value) for t in theirs]
    assert [o.name for o in ours] == [t.name for t in theirs]
    mine = [w for w in caught if "pyc10d.reduce_op" in str(w.message)]
    torchs = [w for w in caught if "torch.distributed.reduce_op" in str(w.message)]
    assert len(mine) == 4 and all(w.category is FutureWarning for w in mine)
    assert str(mine[0].message) == str(torchs[0].message).replace("torch.distributed", "pyc10d")
    assert mine[0].filename == __file__  # points at the caller's line, not at pyc10d


def _reduce_with_deprecated_op(rank: int, world_size: int) -> list[float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        t = torch.tensor([rank + 1.0])
        pyc10d.all_reduce(t, op=pyc10d.reduce_op.MAX)
        u = torch.tensor([rank + 1.0])
        pyc10d.all_reduce(u, op=pyc10d.reduce_op.SUM)
    return [t.item(), u.item()]


def test_reduce_op_works_in_collectives() -> None:
    res: Any = run_ranks("threaded", 2, _reduce_with_deprecated_op)
    assert res == [[2.0, 3.0], [2.0, 3.0]]
