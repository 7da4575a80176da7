"""pyc10d as a c10d ``Backend`` inside torch's own ``ProcessGroup`` (``torch_backend/native.py``):
torch 2.14 lets Python subclass ``Backend``; on 2.13 building one says to use
``init_process_group("pyc10d")`` instead. torchft's native-reconfigure tests run on it too
(``tests/integrations/test_torchft.py``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _multirank import run_ranks

from pyc10d.torch_backend.native import TorchBackend
from pyc10d.torch_version import AT_LEAST_2_14

pytestmark = pytest.mark.timeout(60)


def _native(rank: int, ws: int, store_path: str) -> dict[str, Any]:
    store = dist.FileStore(store_path, ws)
    out: dict[str, Any] = {}
    pg = dist.ProcessGroup(dist.PrefixStore("plain/", store), rank, ws)
    backend = TorchBackend(dist.PrefixStore("plain/", store), rank, ws, timeout=timedelta(seconds=20))
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    t = torch.tensor([rank + 1.0])
    pg.allreduce([t]).wait()
    b = torch.tensor([float(rank)])
    pg.broadcast([b], dist.BroadcastOptions()).wait()  # root 0
    g = [torch.zeros(1) for _ in range(ws)]
    pg.allgather([g], [torch.tensor([rank * 10.0])]).wait()
    pg.barrier().wait()
    out["plain"] = (t.item(), b.item(), [x.item() for x in g])
    # made to be reconfigured: unusable until then, as Gloo's
    late = dist.ProcessGroup(dist.PrefixStore("late/", store), rank, ws)
    lb = TorchBackend(dist.PrefixStore("late/", store), rank, ws, timeout=timedelta(seconds=20), enable_reconfigure=True)
    late._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, lb)
    late._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    try:
        late.allreduce([torch.ones(1)]).wait()
        out["before"] = "no error"
    except RuntimeError as e:
        out["before"] = str(e)
    store.set(f"handle{rank}", late.get_reconfigure_handle())
    handles = [store.get(f"handle{r}").decode() for r in range(ws)]
    opts = dist.distributed_c10d.ReconfigureOptions()
    opts.uuid, opts.handles = 1, list(reversed(handles))
    try:
        late.reconfigure(opts).wait()
        out["reversed"] = "no error"
    except RuntimeError as e:
        out["reversed"] = str(e)
    opts.handles = handles
    late.reconfigure(opts).wait()
    t = torch.tensor([rank + 1.0])
    late.allreduce([t]).wait()
    out["reconfigured"] = (late.supports_reconfigure, t.item())
    return out


@pytest.mark.skipif(not AT_LEAST_2_14, reason="torch 2.13's Backend has no constructor (the next test)")
def test_inside_torchs_own_process_group(tmp_path: Any) -> None:
    for out in run_ranks("gloo", 2, _native, str(tmp_path / "store"), init=False, dist_module="torch.distributed"):
        assert out["plain"] == (3.0, 0.0, [0.0, 10.0])
        assert "has not been initialized. Call reconfigure()" in out["before"]
        assert "keeps rank" in out["reversed"] and "init_process_group('pyc10d')" in out["reversed"]
        assert out["reconfigured"] == (True, 3.0)


@pytest.mark.skipif(AT_LEAST_2_14, reason="torch 2.14 builds it (the test above)")
def test_torch_2_13_says_to_use_init_process_group() -> None:
    with pytest.raises(RuntimeError, match="needs torch 2.14"):
        TorchBackend(dist.HashStore(), 0, 1)
