"""Gather-shaped collectives: all_gather, gather, scatter, reduce_scatter, all_to_all."""

from __future__ import annotations

from typing import Any

import torch

from .. import algorithms as algo
from ..algorithms.comm import flat
from ..algorithms.reduce_ops import finish, premultiply
from ..types import (
    AllgatherOptions,
    AllToAllOptions,
    GatherOptions,
    ReduceScatterOptions,
    ScatterOptions,
    as_reduce_op,
)
from . import checks as ck
from .accepts import check_tensor, check_tensors, reduction
from .base import EngineCore
from .staging import host, writeback
from .work import Work


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _gather_into(comm: algo.Comm, out: torch.Tensor, inp: torch.Tensor) -> None:
    """All-gather ``inp`` of every rank into the contiguous ``out`` (n blocks)."""
    blocks = list(flat(out).split(inp.numel())) if inp.numel() else [flat(out)[:0]] * comm.size
    blocks[comm.rank].copy_(flat(host(inp)))
    algo.select("allgather", comm.size, _nbytes(inp))(comm, blocks)


def _check_pairs(opname: str, outputs: list, inputs: list) -> None:
    """The coalesced forms: as many outputs as inputs, each a tensor pyc10d accepts."""
    if len(outputs) != len(inputs):
        ck.fail(opname, f"{len(outputs)} outputs for {len(inputs)} inputs (expected as many)")
    check_tensors(opname, outputs, "outputs")
    check_tensors(opname, inputs, "inputs")


class GatherOps(EngineCore):
    def _gather_into(self, comm: algo.Comm, out: torch.Tensor, inp: torch.Tensor) -> None:
        """The all-gather step of every all_gather variant (a backend may override it)."""
        _gather_into(comm, out, inp)

    def _reduce_scatter_blocks(self, comm: algo.Comm, blocks: list[torch.Tensor], out: torch.Tensor, red: Any) -> None:
        """The exchange step of both reduce_scatter variants: ``out`` (flat) gets block
        ``comm.rank`` reduced over the ranks' ``blocks`` (the caller finishes AVG)."""
        algo.select("reduce_scatter", comm.size, _nbytes(out))(comm, blocks, out, red)

    def _gather_to(self, comm: algo.Comm, inp: torch.Tensor, outs: list[torch.Tensor] | None, root: int) -> None:
        """The step of gather: ``outs`` (on ``root`` only) get every rank's ``inp``."""
        algo.gather_direct(comm, inp, outs, root)

    def _scatter_from(self, comm: algo.Comm, ins: list[torch.Tensor] | None, out: torch.Tensor, root: int) -> None:
        """The step of scatter: ``out`` gets this rank's block of ``ins`` (given on ``root``)."""
        algo.scatter_direct(comm, ins, out, root)

    def _alltoall_blocks(self, comm: algo.Comm, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        """The exchange step of both all_to_all variants (a backend may override it)."""
        algo.alltoall_pairwise(comm, ins, outs)

    # -- all_gather -----------------------------------------------------------------------
    def allgather(self, output_tensors: Any, input_tensors: Any, opts: AllgatherOptions | None = None, _sync: bool = False) -> Work:
        if isinstance(input_tensors, torch.Tensor):
            input_tensors, output_tensors = [input_tensors], [list(output_tensors)]
        inputs = list(input_tensors)
        outputs = [list(o) for o in output_tensors]
        ck.check_non_empty("allgather", inputs, "input tensor list")
        check_tensors("allgather", inputs, "input_tensors")
        for out in outputs:
            check_tensors("allgather", out, "output_tensors")
        if len(outputs) != len(inputs):
            ck.fail("allgather", "requires input/output tensor lists to have the same length")
        for out in outputs:
            if len(out) != len(inputs) * self._size:
                ck.fail("allgather", "invalid output tensor list")
        ck.check_same("allgather", inputs)
        for out in outputs:
            ck.check_same("allgather", out, inputs[0])
        k = len(inputs)
        value = outputs[0] if len(outputs) == 1 else outputs

        def run(comm: algo.Comm) -> None:
            one = inputs[0].numel()
            packed_in = torch.cat([flat(host(t)) for t in inputs]) if k > 1 else flat(host(inputs[0]))
            packed_out = torch.empty(comm.size * k * one, dtype=inputs[0].dtype)
            self._gather_into(comm, packed_out, packed_in)
            pieces = packed_out.view(comm.size * k, -1) if one else None
            for out in outputs:
                for i, t in enumerate(out):
                    if one:
                        t.detach().copy_(pieces[i].view(t.shape))

        return self._submit("allgather", run, value, opts, _sync)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions | None = None, _sync: bool = False) -> Work:
        check_tensor("allgather_into_tensor", output, "output")
        check_tensor("allgather_into_tensor", input, "input")
        if output.dtype != input.dtype:
            ck.fail("allgather_into_tensor", "output tensor must have the same type as input tensor")
        if output.numel() != input.numel() * self._size:
            ck.fail("allgather_into_tensor", "output tensor size must be equal to world_size times input tensor size")

        def run(comm: algo.Comm) -> None:
            h = host(output)
            self._gather_into(comm, h, input)
            writeback(output, h)

        return self._submit("allgather_into_tensor", run, [output], opts, _sync)

    allgather_into_tensor = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllgatherOptions | None = None, _sync: bool = False) -> Work:
        _check_pairs("allgather_into_tensor_coalesced", outputs, inputs)
        for o, i in zip(outputs, inputs):
            if o.dtype != i.dtype or o.numel() != i.numel() * self._size:
                ck.fail("allgather_into_tensor_coalesced", "output/input tensor mismatch")

        def run(comm: algo.Comm) -> None:
            for o, i in zip(outputs, inputs):
                h = host(o)
                self._gather_into(comm, h, i)
                writeback(o, h)

        return self._submit("allgather_into_tensor_coalesced", run, list(outputs), opts, _sync)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts: AllgatherOptions | None = None, _sync: bool = False) -> Work:
        if len(output_lists) != self._size:
            ck.fail("allgather_coalesced", "output lists should be equal to world size")
        check_tensors("allgather_coalesced", input_list, "input_list")
        for out in output_lists:
            check_tensors("allgather_coalesced", out, "output_lists")
        for out in output_lists:
            if len(out) != len(input_list):
                ck.fail("allgather_coalesced", "invalid output tensor list")
            for i, (o, t) in enumerate(zip(out, input_list)):
                if o.numel() != t.numel():
                    ck.fail("allgather_coalesced", f"invalid size of output tensor at index {i}")
                if o.dtype != t.dtype:
                    ck.fail("allgather_coalesced", f"invalid tensor type at index {i}")

        def run(comm: algo.Comm) -> None:
            for i, t in enumerate(input_list):
                packed = torch.empty(comm.size * t.numel(), dtype=t.dtype)
                self._gather_into(comm, packed, t)
                for r, out in enumerate(output_lists):
                    out[i].detach().copy_(packed[r * t.numel():(r + 1) * t.numel()].view(out[i].shape))

        return self._submit("allgather_coalesced", run, output_lists, opts, _sync)

    # -- gather / scatter -------------------------------------------------------------------
    def _rooted(self, opname: str, root: int, mine: Any, lists: Any, my_side: str,
                list_side: str) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Gather's and scatter's checks: every rank's one tensor (``mine``) and, on the root
        only, the list of a tensor per rank (None elsewhere, which must pass none)."""
        ck.check_root_rank(opname, root, self._size)
        ck.check_single(opname, mine, f"{my_side} list")
        t = mine[0]
        check_tensor(opname, t, f"{my_side}_tensors")
        if self._rank != root:
            if lists:
                ck.fail(opname, f"requires empty {list_side} on non-root")
            return t, None
        ck.check_single(opname, lists, f"{list_side} list")
        tensors = list(lists[0])
        check_tensors(opname, tensors, f"{list_side}_tensors")
        if len(tensors) != self._size:
            ck.fail(opname, "requires a tensor list of world size on the root")
        ck.check_same(opname, tensors, t)
        return t, tensors

    def gather(self, output_tensors: Any, input_tensors: Any, opts: GatherOptions | None = None, root: int | None = None, _sync: bool = False) -> Work:
        opts = opts if opts is not None else GatherOptions()
        root_rank = opts.rootRank if root is None else root
        if isinstance(input_tensors, torch.Tensor):
            input_tensors = [input_tensors]
            output_tensors = [list(output_tensors)] if output_tensors else []
        inp, outs = self._rooted("gather", root_rank, input_tensors, output_tensors, "input", "output")
        value = outs if outs is not None else []

        def run(comm: algo.Comm) -> None:
            houts = [host(o) for o in outs] if outs is not None else None
            self._gather_to(comm, host(inp), houts, root_rank)
            if outs is not None:
                for o, h in zip(outs, houts):
                    writeback(o, h)

        return self._submit("gather", run, value, opts, _sync, root=root_rank)

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: GatherOptions | None = None,
                      _sync: bool = False) -> Work:
        """torch 2.14's gather into one tensor (``dist.gather_single``): on the root, ``output``
        holds the ranks' inputs one after the other, contiguous (any shape of that many
        elements); elsewhere it is not used. A gather into views of it: the same wire."""
        opts = opts if opts is not None else GatherOptions()
        outs: list[list[torch.Tensor]] = []
        if self._rank == opts.rootRank:
            check_tensor("gather_single", output, "gather_tensor")
            if output.dtype != input.dtype:
                ck.fail("gather_single", f"gather_tensor is {output.dtype}, the input {input.dtype}")
            if output.numel() != input.numel() * self._size:
                ck.fail("gather_single", f"gather_tensor has {output.numel()} elements, not world_size "
                                         f"({self._size}) x the input's {input.numel()}")
            if not output.is_contiguous():
                ck.fail("gather_single", "gather_tensor must be contiguous")
            outs = [list(output.view(self._size, *input.shape).unbind(0))]
        return self.gather(outs, [input], opts, _sync=_sync)

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: ScatterOptions | None = None, root: int | None = None, _sync: bool = False) -> Work:
        opts = opts if opts is not None else ScatterOptions()
        root_rank = opts.rootRank if root is None else root
        if isinstance(output_tensors, torch.Tensor):
            output_tensors = [output_tensors]
            input_tensors = [list(input_tensors)] if input_tensors else []
        out, ins = self._rooted("scatter", root_rank, output_tensors, input_tensors, "output", "input")

        def run(comm: algo.Comm) -> None:
            h = host(out)
            self._scatter_from(comm, [host(i) for i in ins] if ins is not None else None, h, root_rank)
            writeback(out, h)

        return self._submit("scatter", run, list(output_tensors), opts, _sync, root=root_rank)

    # -- reduce_scatter ---------------------------------------------------------------------
    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: ReduceScatterOptions | None = None, op: Any = None, _sync: bool = False) -> Work:
        if isinstance(output_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [list(input_tensors)]
        opts = opts if opts is not None else ReduceScatterOptions()
        red = as_reduce_op(op if op is not None else opts.reduceOp)
        ck.check_single("reduce_scatter", output_tensors, "output list")
        ck.check_single("reduce_scatter", input_tensors, "input list")
        out, ins = output_tensors[0], list(input_tensors[0])
        check_tensor("reduce_scatter", out, "output")
        check_tensors("reduce_scatter", ins, "input_list")
        if len(ins) != self._size:
            ck.fail("reduce_scatter", "requires a tensor list of world size")
        ck.check_same("reduce_scatter", ins, out)
        plan = reduction("reduce_scatter", red, out.dtype)

        def run(comm: algo.Comm) -> None:
            wins = ins if plan is None else [plan.to_wire(i) for i in ins]
            wout = out if plan is None else plan.to_wire(out)
            blocks = [flat(host(i)).clone() if red.op.name == "PREMUL_SUM" else flat(host(i)) for i in wins]
            for b in blocks:
                premultiply(b, red)
            h = host(wout)
            self._reduce_scatter_blocks(comm, blocks, flat(h), red)
            finish(h, red, comm.size)
            writeback(wout, h)
            if plan is not None:
                plan.back(out, wout)

        return self._submit("reduce_scatter", run, [out], opts, _sync, red=red)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: ReduceScatterOptions | None = None, op: Any = None, _sync: bool = False) -> Work:
        opts = opts if opts is not None else ReduceScatterOptions()
        red = as_reduce_op(op if op is not None else opts.reduceOp)
        check_tensor("reduce_scatter_tensor", output, "output")
        check_tensor("reduce_scatter_tensor", input, "input")
        if output.dtype != input.dtype:
            ck.fail("reduce_scatter_tensor", "input tensor must have the same type as output tensor")
        if input.numel() != output.numel() * self._size:
            ck.fail("reduce_scatter_tensor", "input tensor must be the same size as output size times world size")
        plan = reduction("reduce_scatter_tensor", red, output.dtype)

        def run(comm: algo.Comm) -> None:
            self._rs_widened(comm, output, input, red, plan)

        return self._submit("reduce_scatter_tensor", run, [output], opts, _sync, red=red)

    reduce_scatter_tensor = _reduce_scatter_base

    def _rs_widened(self, comm: algo.Comm, output: torch.Tensor, input: torch.Tensor, red: Any, plan: Any) -> None:
        """``_rs_one`` on ``plan``'s wire dtype (``accepts.Widen``; None: as it is)."""
        if plan is None:
            return self._rs_one(comm, output, input, red)
        wout = plan.to_wire(output)
        self._rs_one(comm, wout, plan.to_wire(input), red)
        plan.back(output, wout)

    def _rs_one(self, comm: algo.Comm, output: torch.Tensor, input: torch.Tensor, red: Any) -> None:
        hin = host(input)
        if red.op.name == "PREMUL_SUM":
            hin = premultiply(hin.clone(), red)
        h = host(output)
        n = h.numel()
        blocks = list(flat(hin).split(n)) if n else [flat(hin)[:0]] * comm.size
        self._reduce_scatter_blocks(comm, blocks, flat(h), red)
        finish(h, red, comm.size)
        writeback(output, h)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: ReduceScatterOptions | None = None, _sync: bool = False) -> Work:
        opts = opts if opts is not None else ReduceScatterOptions()
        red = as_reduce_op(opts.reduceOp)
        _check_pairs("reduce_scatter_tensor_coalesced", outputs, inputs)
        for o, i in zip(outputs, inputs):
            if o.dtype != i.dtype or i.numel() != o.numel() * self._size:
                ck.fail("reduce_scatter_tensor_coalesced", "output/input tensor mismatch")
        plans = [reduction("reduce_scatter_tensor_coalesced", red, o.dtype) for o in outputs]

        def run(comm: algo.Comm) -> None:
            for o, i, plan in zip(outputs, inputs, plans):
                self._rs_widened(comm, o, i, red, plan)

        return self._submit("reduce_scatter_tensor_coalesced", run, list(outputs), opts, _sync, red=red)

    # -- all_to_all -------------------------------------------------------------------------
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None, input_split_sizes: list[int] | None, opts: AllToAllOptions | None = None, _sync: bool = False) -> Work:
        n = self._size
        check_tensor("alltoall_base", output, "output")
        check_tensor("alltoall_base", input, "input")
        if output.dtype != input.dtype:
            ck.fail("alltoall_base", f"tensors with different dtypes: output {output.dtype}, input {input.dtype}")
        in_splits = self._splits("alltoall_base", input, input_split_sizes, "input")
        out_splits = self._splits("alltoall_base", output, output_split_sizes, "output")

        def run(comm: algo.Comm) -> None:
            hin, hout = host(input), host(output)
            ins = list(hin.split(in_splits)) if hin.dim() else [hin.view(-1)] * n
            outs = list(hout.split(out_splits)) if hout.dim() else [hout.view(-1)] * n
            self._alltoall_blocks(comm, ins, outs)
            writeback(output, hout)

        return self._submit("alltoall_base", run, [output], opts, _sync)

    def _splits(self, opname: str, t: torch.Tensor, sizes: list[int] | None, what: str) -> list[int]:
        n = self._size
        rows = t.shape[0] if t.dim() else 1
        if not sizes:
            if rows % n:
                ck.fail(opname, f"{what} tensor dim 0 ({rows}) is not divisible by world size {n}")
            return [rows // n] * n
        sizes = [int(s) for s in sizes]
        if len(sizes) != n or sum(sizes) != rows:
            ck.fail(opname, f"{what} split sizes {sizes} do not match world size {n} and dim 0 ({rows})")
        return sizes

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: AllToAllOptions | None = None, _sync: bool = False) -> Work:
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            ck.fail("alltoall", "requires tensor lists of world size")
        check_tensors("alltoall", output_tensors, "output_tensors")
        check_tensors("alltoall", input_tensors, "input_tensors")
        for t in list(output_tensors) + list(input_tensors):
            if t.dtype != input_tensors[0].dtype:
                ck.fail("alltoall", "tensors with different dtypes")

        def run(comm: algo.Comm) -> None:
            hout = [host(o) for o in output_tensors]
            self._alltoall_blocks(comm, [host(i) for i in input_tensors], hout)
            for o, h in zip(output_tensors, hout):
                writeback(o, h)

        return self._submit("alltoall", run, list(output_tensors), opts, _sync)
