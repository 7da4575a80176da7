"""The table of what each collective accepts (``pyc10d.backends.accepts``).

Every (dtype, op) torch has gets an answer; an accepted pair's plan reduces exactly as a
float64/int64 reference does (checked here on the kernels, on every rank count's worth of
inputs; ``tests/test_properties.py`` checks it over the wire); a refused one raises
``DistInputError`` naming the op, the argument and what is accepted; docs/api.md prints the
table; and its Gloo column is what a live ProcessGroupGloo does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _multirank import run_ranks
from _reduce_ref import inputs, reference

from pyc10d.algorithms.reduce_ops import finish, premultiply, reduce_into
from pyc10d.backends import accepts
from pyc10d.backends.accepts import OPS, ROWS, Widen, check_tensors, reduction, support
from pyc10d.errors import DistInputError
from pyc10d.types import RedOpType, ReduceOp, _make_premul_sum

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _red(op: RedOpType) -> ReduceOp:
    return _make_premul_sum(2.0) if op == RedOpType.PREMUL_SUM else ReduceOp(op)


def _by_plan(xs: list[torch.Tensor], red: ReduceOp, plan: Widen | None) -> list:
    """What the engine computes: each rank's input to the wire, the kernels, back."""
    outs = [x.clone() for x in xs]
    wires = [o if plan is None else plan.to_wire(o) for o in outs]
    acc = premultiply(wires[0].clone(), red)
    for w in wires[1:]:
        reduce_into(acc, premultiply(w.clone(), red), red)
    finish(acc, red, len(xs))
    if plan is None:
        outs[0].copy_(acc)
    else:
        wires[0].copy_(acc)
        plan.back(outs[0], wires[0])
    return outs[0].tolist()


REDUCIBLE = [(d, o) for d in accepts.ALL_DTYPES for o in OPS if support(d, o) is not False]


@pytest.mark.parametrize("n", [2, 3])
def test_every_accepted_pair_reduces_as_the_reference(n: int) -> None:
    assert len(REDUCIBLE) > 60  # the table is not empty by mistake
    wrong = []
    for dtype, op in REDUCIBLE:
        xs = inputs(dtype, n)
        plan = reduction("allreduce", _red(op), dtype)
        got, want = _by_plan(xs, _red(op), plan), reference(xs, op).tolist()
        if op == RedOpType.AVG and n % 2:  # x / 3: one rounding here, two in the reference
            eps = torch.finfo(dtype).eps
            same = torch.allclose(torch.tensor(got), torch.tensor(want), rtol=eps, atol=0)
        elif dtype.is_floating_point or dtype.is_complex:
            same = torch.equal(torch.tensor(got), torch.tensor(want))
        else:
            same = got == want
        if not same:
            wrong.append((dtype, op.name, got[:4], want[:4]))
    assert not wrong, wrong


def test_every_refused_pair_says_what_and_what_is_accepted() -> None:
    refused = [(d, o) for d in accepts.ALL_DTYPES for o in OPS if support(d, o) is False]
    assert (torch.float32, RedOpType.BAND) in refused and (torch.int32, RedOpType.AVG) in refused
    for dtype, op in refused:
        with pytest.raises(DistInputError) as info:
            reduction("reduce_scatter", _red(op), dtype)
        msg = str(info.value)
        assert msg.startswith("reduce_scatter: argument `"), msg
        assert f"ReduceOp.{op.name}" in msg and str(dtype) in msg and "accepts" in msg, msg
        assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)


def test_unused_is_not_a_reduction() -> None:
    with pytest.raises(DistInputError, match=r"allreduce: argument `op`: .*UNUSED.* not a reduction; accepted: ReduceOp.SUM"):
        reduction("allreduce", ReduceOp(RedOpType.UNUSED), torch.float32)


def test_the_widened_dtypes_are_the_ones_gloo_refuses() -> None:
    assert isinstance(reduction("allreduce", ReduceOp.SUM, torch.uint16), Widen)
    assert isinstance(reduction("allreduce", ReduceOp.MAX, torch.uint64), Widen)
    assert reduction("allreduce", ReduceOp.SUM, torch.float8_e4m3fn).wire == torch.float32
    assert reduction("allreduce", ReduceOp.SUM, torch.float32) is None


@pytest.mark.parametrize("bad, error, match", [
    ([1, 2], TypeError, r"allgather: argument `out` must be a torch.Tensor, got int"),
    ([torch.ones(2, device="meta")], DistInputError, r"allgather: argument `out`: unsupported device type meta; accepted: cpu"),
    ([torch.eye(2).to_sparse_csr()], DistInputError, r"unsupported layout torch.sparse_csr; accepted: torch.strided"),
    ([torch.eye(2).to_sparse()], DistInputError, r"unsupported layout torch.sparse_coo"),
    ([torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)], DistInputError, r"invalid scalar type torch.quint8"),
])
def test_check_tensors_refuses_what_cannot_be_read(bad: list, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        check_tensors("allgather", bad, "out")


def test_check_tensors_takes_every_movable_dtype_and_sparse_coo_where_asked() -> None:
    check_tensors("broadcast", [torch.empty(2, dtype=d) for d in accepts.MOVABLE])
    assert torch.int4 in accepts.UNMOVABLE and torch.bits8 in accepts.MOVABLE
    with pytest.raises(DistInputError, match="broadcast: argument `tensor`: invalid scalar type torch.int4"):
        check_tensors("broadcast", [torch.ones(2, dtype=torch.uint8).view(torch.int4)])
    check_tensors("allreduce", [torch.eye(2).to_sparse()], sparse=True)


def test_the_manual_prints_the_table() -> None:
    assert accepts.readme_table() in API_DOC.read_text(), "docs/api.md's dtype × op table differs from accepts.readme_table()"


# -- the Gloo column against a live ProcessGroupGloo -----------------------------------------
def _ones(d: torch.dtype) -> torch.Tensor:
    try:
        return torch.ones(4, dtype=d)
    except (RuntimeError, NotImplementedError):  # bits*: any bytes will do
        return torch.ones(4 * torch.empty(0, dtype=d).element_size(), dtype=torch.uint8).view(d)


def _gloo_answers(rank: int, ws: int) -> dict[str, list[str]]:
    import torch.distributed as dist

    pg = dist.distributed_c10d._get_default_group()
    out: dict[str, list[str]] = {}
    for row, dtypes in ROWS.items():
        ok = []
        for d in dtypes[:1]:
            t = torch.ones(4, dtype=torch.uint8).view(d) if d in accepts.UNMOVABLE else _ones(d)
            for name in [o.name for o in OPS] + ["moved"]:
                try:
                    if name == "moved":
                        pg.broadcast([t], dist.BroadcastOptions()).wait()
                    else:
                        opts = dist.AllreduceOptions()
                        opts.reduceOp = (dist._make_nccl_premul_sum(2.0) if name == "PREMUL_SUM"
                                         else getattr(dist.ReduceOp, name))
                        pg.allreduce([t], opts).wait()
                    ok.append(name)
                except (RuntimeError, NotImplementedError, ValueError):
                    pass
        out[row] = ok
    return out


@pytest.mark.timeout(40)
def test_gloo_column_is_what_gloo_does() -> None:
    live = run_ranks("gloo", 2, _gloo_answers, dist_module="torch.distributed")[0]
    recorded = {row: sorted([o.name for o in accepts.GLOO[row]] + (["moved"] if row in accepts.GLOO_MOVES else []))
                for row in ROWS}
    assert {row: sorted(v) for row, v in live.items()} == recorded
