"""Bad input never breaks a group: each call of a battery either works (dtypes pyc10d reduces
where Gloo refuses) or raises a clear error on the calling rank, and a plain float32
all_reduce on the same group works right after — on shm, tcp, threaded and through the
torch.distributed plugin. A failure that can only appear once bytes moved (a kernel failing
mid-reduction) aborts the group and every rank's error names its cause.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
from _multirank import run_ranks

import pyc10d.torch_backend  # noqa: F401 - registers pyc10d_shm / pyc10d_tcp with torch

pytestmark = pytest.mark.timeout(50)

#: name -> (regex the error must match, or a value the call must produce on every element).
EXPECT: dict[str, Any] = {
    "uint16 sum": 2, "uint32 max": 3, "uint64 sum": 2, "float8 sum": 2.0, "float8 bcast": 1.0,
    "uint16 bcast": 1, "int16 product": 1,
    "meta all_reduce": r"unsupported device type meta",
    "meta broadcast": r"unsupported device type meta",
    "BAND on float": r"BAND.*float32",
    "AVG on int": r"AVG.*int32",
    "PRODUCT on bool": 1,
    "MAX on complex": r"MAX.*complex",
    "sparse csr": r"sparse_csr|SparseCsr",
    "sparse coo MAX": r"MAX.*sparse|sparse.*MAX",
    "quantized": r"quint8|Quantized",
    "bits8 SUM": r"bits8 cannot be reduced",
    "broadcast src out of range": r"invalid root rank: 5|src",
    "reduce dst -1": r"invalid root rank: -1|dst",
    "all_to_all_single split sum": r"split sizes",
    "all_to_all_single split count": r"split sizes",
    "all_to_all_single indivisible": r"not divisible by world size",
    "all_gather list length": r"invalid output tensor list",
    "all_gather shapes": r"invalid tensor size",
    "all_gather_into_tensor size": r"output tensor size",
    "reduce_scatter_tensor size": r"input tensor must be the same size",
    "reduce_scatter list length": r"tensor list of world size",
    "non-tensor all_reduce": r"torch.Tensor",
    "non-tensor in list": r"List\[torch.Tensor\]|torch.Tensor",
    "send to self": r"destination rank",
    "send out of range": r"destination rank 7|dst",
    "recv out of range": r"source rank 7|src",
    "mixed dtypes": r"same type|different dtypes",
}


def _cases(dist: Any, rank: int, ws: int) -> dict[str, Any]:
    R = dist.ReduceOp
    ones = torch.ones

    def red(dtype: torch.dtype, op: Any = R.SUM, value: int = 1) -> Any:
        def call() -> torch.Tensor:
            t = torch.full((8,), value + rank if op == R.MAX else value).to(dtype)
            dist.all_reduce(t, op=op)
            return t
        return call

    def bcast(dtype: torch.dtype) -> Any:
        def call() -> torch.Tensor:
            t = ones(8).to(dtype) if rank == 0 else torch.zeros(8).to(dtype)
            dist.broadcast(t, 0)
            return t
        return call

    return {
        "uint16 sum": red(torch.uint16), "uint32 max": red(torch.uint32, R.MAX, 2),
        "uint64 sum": red(torch.uint64), "float8 sum": red(torch.float8_e4m3fn),
        "float8 bcast": bcast(torch.float8_e5m2), "uint16 bcast": bcast(torch.uint16),
        "int16 product": red(torch.int16, R.PRODUCT),
        "meta all_reduce": lambda: dist.all_reduce(torch.ones(8, device="meta")),
        "meta broadcast": lambda: dist.broadcast(torch.ones(8, device="meta"), 0),
        "BAND on float": lambda: dist.all_reduce(ones(8), op=R.BAND),
        "AVG on int": lambda: dist.all_reduce(ones(8, dtype=torch.int32), op=R.AVG),
        "PRODUCT on bool": red(torch.bool, R.PRODUCT),
        "MAX on complex": lambda: dist.all_reduce(ones(8, dtype=torch.complex64), op=R.MAX),
        "sparse csr": lambda: dist.all_reduce(torch.eye(3).to_sparse_csr()),
        "sparse coo MAX": lambda: dist.all_reduce(torch.eye(3).to_sparse(), op=R.MAX),
        "quantized": lambda: dist.all_reduce(torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.quint8)),
        "bits8 SUM": lambda: dist.all_reduce(torch.ones(4, dtype=torch.uint8).view(torch.bits8)),
        "broadcast src out of range": lambda: dist.broadcast(ones(4), ws + 3),
        "reduce dst -1": lambda: dist.reduce(ones(4), -1),
        "all_to_all_single split sum": lambda: dist.all_to_all_single(torch.empty(4), ones(4), [1, 1], [3, 3]),
        "all_to_all_single split count": lambda: dist.all_to_all_single(torch.empty(4), ones(4), [4], [4]),
        "all_to_all_single indivisible": lambda: dist.all_to_all_single(torch.empty(3), ones(3)),
        "all_gather list length": lambda: dist.all_gather([torch.empty(4)] * (ws + 1), ones(4)),
        "all_gather shapes": lambda: dist.all_gather([torch.empty(3)] * ws, ones(4)),
        "all_gather_into_tensor size": lambda: dist.all_gather_into_tensor(torch.empty(5), ones(4)),
        "reduce_scatter_tensor size": lambda: dist.reduce_scatter_tensor(torch.empty(4), ones(5 * ws)),
        "reduce_scatter list length": lambda: dist.reduce_scatter(torch.empty(4), [ones(4)] * (ws + 1)),
        "non-tensor all_reduce": lambda: dist.all_reduce([1, 2, 3]),
        "non-tensor in list": lambda: dist.all_gather([1, 2], ones(4)),
        "send to self": lambda: dist.send(ones(4), rank),
        "send out of range": lambda: dist.send(ones(4), ws + 5),
        "recv out of range": lambda: dist.recv(ones(4), ws + 5),
        "mixed dtypes": lambda: dist.all_gather_into_tensor(torch.empty(8, dtype=torch.float64), ones(4)),
    }


def _battery(rank: int, ws: int, module: str) -> list[tuple[str, str, Any, str]]:
    """Run every case, then a float32 all_reduce; (case, outcome, value or message, after)."""
    dist = importlib.import_module(module)
    out = []
    for name, call in _cases(dist, rank, ws).items():
        try:
            got = call()
            outcome, detail = "ok", (got.float().tolist() if isinstance(got, torch.Tensor) else None)
        except Exception as e:  # noqa: BLE001 - what is raised is the point
            outcome, detail = type(e).__name__, str(e)
            if not isinstance(e, (RuntimeError, ValueError, TypeError)):
                outcome = f"unclear type {type(e).__name__}"
        t = torch.full((4,), float(rank + 1))
        try:
            dist.all_reduce(t)
            after = "usable" if t.tolist() == [ws * (ws + 1) / 2] * 4 else f"wrong result {t.tolist()}"
        except Exception as e:  # noqa: BLE001
            after = f"broken: {type(e).__name__}: {e}"
        out.append((name, outcome, detail, after))
    return out


@pytest.mark.parametrize("backend", ["shm", "tcp", "threaded", "pyc10d_shm", "pyc10d_tcp"])
def test_bad_input_raises_clearly_and_the_group_stays_usable(backend: str) -> None:
    module = "torch.distributed" if backend.startswith("pyc10d_") else "pyc10d"
    results = run_ranks(backend, 2, _battery, module, dist_module=module, pg_timeout=10, timeout=45)
    assert [r[0] for r in results[0]] == list(EXPECT)
    problems = []
    for rank, res in enumerate(results):
        for name, outcome, detail, after in res:
            want = EXPECT[name]
            if after != "usable":
                problems.append(f"rank {rank} {name}: group {after}")
            if isinstance(want, str):
                import re

                if outcome == "ok" or not re.search(want, detail):
                    problems.append(f"rank {rank} {name}: expected an error matching {want!r}, got {outcome}: {detail}")
            elif outcome != "ok" or (detail is not None and detail != [float(want)] * 8):
                problems.append(f"rank {rank} {name}: expected {want} everywhere, got {outcome}: {detail}")
    assert not problems, "\n".join(problems)


# -- a failure once bytes moved ----------------------------------------------------------------
def _kernel_fails_on_rank0(rank: int, ws: int, n: int) -> tuple[str, str]:
    import time

    import pyc10d as dist
    from pyc10d.algorithms import reduce_ops
    from pyc10d.types import RedOpType

    if rank == 0:
        def boom(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("the SUM kernel exploded")
        reduce_ops._KERNELS[RedOpType.SUM] = (boom, boom)  # this process only (forked ranks)
    errors = []
    for _ in range(2):  # at 8 bytes the peer may finish its part first: its next call must fail
        try:
            dist.all_reduce(torch.ones(n))
            errors.append("")
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")
        time.sleep(0.3)
    return errors[0], errors[1]


@pytest.mark.parametrize("backend", ["shm", "tcp"])
@pytest.mark.parametrize("n", [2, 1 << 16])
def test_a_kernel_failing_mid_reduction_is_named_on_every_rank(backend: str, n: int) -> None:
    (first0, second0), (first1, second1) = run_ranks(backend, 2, _kernel_fails_on_rank0, n, pg_timeout=10)
    assert first0 == "RuntimeError: the SUM kernel exploded"
    assert "unusable after an earlier failure: the SUM kernel exploded" in second0
    peer = first1 or second1  # the peer's first call may have completed before the abort
    assert peer, "rank 1 never learnt that the group was aborted"
    assert ("aborted by rank 0" in peer and "allreduce #1 in group '0' failed on rank 0 after it had started: "
            "RuntimeError: the SUM kernel exploded" in peer), peer
