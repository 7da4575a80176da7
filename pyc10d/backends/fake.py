"""The fake backend: one process plays rank ``r`` of ``n``; collectives move no data.

Every operation checks its arguments as the real backends do, then completes at once. Like
torch's ``FakeProcessGroup``, reductions and broadcasts leave their tensors as they are, and
gathers, scatters and all-to-alls fill their outputs with this rank's own input (every chunk
of an all-gather is a copy of the input, a reduce-scatter keeps this rank's chunk...), so
outputs have the right shapes and dtypes and hold defined values, never garbage. Model code,
shape checks and tracing can so run in one process for any world size. ``alltoall_base`` does
not check split sizes against the tensors (torch's fake group of the seeds did not either).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from ..algorithms.comm import Comm
from ..store.base import Store
from ..transport.fake import FakeTransport
from . import checks as ck
from .engine import Engine
from .options import Options
from .work import CompletedWork, Work


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.detach().copy_(src.detach().reshape(dst.shape))


def _tile(out: torch.Tensor, inp: torch.Tensor, n: int) -> None:
    """``out`` (n times ``inp``'s elements) becomes n copies of ``inp``."""
    out.detach().copy_(inp.detach().reshape(1, -1).expand(n, -1).reshape(out.shape))


def _chunk(inp: torch.Tensor, n: int, i: int) -> torch.Tensor:
    return inp.detach().reshape(n, -1)[i]


class _RecvDone(CompletedWork):
    """A fake ``recv``: finished at once, from the source rank it was asked for."""

    def __init__(self, tensors: list[torch.Tensor], src: int) -> None:
        super().__init__("recv", tensors)
        self._source_rank = src


class FakeBackend(Engine):
    backend_name = "fake"

    @classmethod
    def create(
        cls, store: Store, rank: int, size: int, timeout: timedelta, group_name: str
    ) -> FakeBackend:
        options = Options(timeout)
        options.backend = cls.backend_name
        return cls(FakeTransport(rank, size), list(range(size)), rank, group_name, options)

    def _submit(
        self, opname: str, fn: Callable[[Comm], Any], outputs: Any, opts: Any = None, sync: bool = False,
        *, red: Any = None, root: int | None = None,
    ) -> Work:
        with self._lock:
            self._seq += 1
        return CompletedWork(opname, outputs)

    def allreduce(self, tensors: Any, opts: Any = None, op: Any = None, _sync: bool = False,
                  _src: torch.Tensor | None = None) -> Work:
        if _src is not None:  # out of place: the output is the input, as the in-place op leaves it
            _copy(tensors[0] if isinstance(tensors, list) else tensors, _src)
        return super().allreduce(tensors, opts, op, _sync)

    # -- gathers: every output chunk is this rank's input ------------------------------------
    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None, _sync: bool = False) -> Work:
        work = super().allgather(output_tensors, input_tensors, opts, _sync)
        if isinstance(input_tensors, torch.Tensor):
            input_tensors, output_tensors = [input_tensors], [output_tensors]
        k = len(input_tensors)
        for out in output_tensors:
            for i, t in enumerate(out):
                _copy(t, input_tensors[i % k])
        return work

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None, _sync: bool = False) -> Work:
        work = super()._allgather_base(output, input, opts, _sync)
        _tile(output, input, self._size)
        return work

    allgather_into_tensor = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None, _sync: bool = False) -> Work:
        work = super().allgather_into_tensor_coalesced(outputs, inputs, opts, _sync)
        for o, i in zip(outputs, inputs):
            _tile(o, i, self._size)
        return work

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor], opts: Any = None, _sync: bool = False) -> Work:
        work = super().allgather_coalesced(output_lists, input_list, opts, _sync)
        for out in output_lists:
            for o, i in zip(out, input_list):
                _copy(o, i)
        return work

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None, root: int | None = None, _sync: bool = False) -> Work:
        work = super().gather(output_tensors, input_tensors, opts, root, _sync)
        inp = input_tensors if isinstance(input_tensors, torch.Tensor) else input_tensors[0]
        for o in work.outputs:
            _copy(o, inp)
        return work

    # -- scatters: this rank's chunk of its own input -----------------------------------------
    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None, root: int | None = None, _sync: bool = False) -> Work:
        work = super().scatter(output_tensors, input_tensors, opts, root, _sync)
        if input_tensors:
            ins = input_tensors if isinstance(output_tensors, torch.Tensor) else input_tensors[0]
            _copy(work.outputs[0], ins[self._rank])
        return work

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None, op: Any = None, _sync: bool = False) -> Work:
        work = super().reduce_scatter(output_tensors, input_tensors, opts, op, _sync)
        ins = input_tensors if isinstance(output_tensors, torch.Tensor) else input_tensors[0]
        _copy(work.outputs[0], ins[self._rank])
        return work

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None, op: Any = None, _sync: bool = False) -> Work:
        work = super()._reduce_scatter_base(output, input, opts, op, _sync)
        _copy(output, _chunk(input, self._size, self._rank))
        return work

    reduce_scatter_tensor = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None, _sync: bool = False) -> Work:
        work = super().reduce_scatter_tensor_coalesced(outputs, inputs, opts, _sync)
        for o, i in zip(outputs, inputs):
            _copy(o, _chunk(i, self._size, self._rank))
        return work

    # -- all-to-all: outputs are copies of the inputs ---------------------------------------
    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor], opts: Any = None, _sync: bool = False) -> Work:
        work = super().alltoall(output_tensors, input_tensors, opts, _sync)
        for o, i in zip(output_tensors, input_tensors):
            if o.numel() == i.numel():
                _copy(o, i)
        return work

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None, input_split_sizes: list[int] | None, opts: Any = None, _sync: bool = False) -> Work:
        if output.dtype != input.dtype:
            ck.fail("alltoall_base", f"tensors with different dtypes: output {output.dtype}, input {input.dtype}")
        if output.numel() == input.numel():
            _copy(output, input)
        return self._submit("alltoall_base", lambda c: None, [output], opts, _sync)

    # -- point to point: nothing arrives, nothing leaves -------------------------------------
    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> Work:  # noqa: N803 - torch's name
        t = ck.as_list(tensors)
        ck.check_single("send", t)
        return CompletedWork("send", t)

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> Work:  # noqa: N803 - torch's name
        t = ck.as_list(tensors)
        ck.check_single("recv", t)
        return _RecvDone(t, srcRank)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Work:
        return self.recv(tensors, 0, tag)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        pass
