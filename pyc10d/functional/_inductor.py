"""How inductor compiles pyc10d's collectives: as collectives, not as opaque fallbacks.

An opaque fallback kernel would let inductor reuse a collective's input buffer for other
data as soon as the call returns, while the collective is still sending from it on the
progress thread. Lowered through inductor's collective kernels instead, a collective's
inputs stay read until its ``wait_tensor`` and its output is written only by it (the wait
is modelled as a mutation of that output), as for torch's own functional collectives.

The lowerings are registered the first time one of these ops is traced while inductor is
loaded (from the fake kernels): importing inductor only for this would add over a second
to ``import pyc10d``, and a program that never compiles never needs them.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .. import threads

_lock = threading.Lock()
threads.renew_after_fork(globals(), _lock=threading.Lock)
_registered = False

COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "all_gather_into_tensor", "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast",
)


def maybe_register_lowerings(ops: Any) -> None:
    global _registered
    if _registered or "torch._inductor.lowering" not in sys.modules:
        return
    with _lock:
        if _registered:
            return
        _register(ops)
        _registered = True


def _register(ops: Any) -> None:
    from torch._inductor import ir
    from torch._inductor.lowering import register_lowering

    class CollectiveKernel(ir._CollectiveKernel):
        # The eager kernel always returns a fresh contiguous tensor: inductor's size and
        # alignment checks of fallback outputs would only repeat the fake kernel.
        def codegen_size_asserts(self, wrapper: Any) -> None:
            pass

        def codegen_alignment_asserts(self, wrapper: Any) -> None:
            pass

    def lower(overload: Any) -> Any:
        def lowering(*args: Any) -> Any:
            out = CollectiveKernel.create_out_of_place(overload, args[0], *args[1:])
            if isinstance(out, list):
                return [ir.TensorBox.create(o) for o in out]
            return ir.TensorBox.create(out)

        return lowering

    for name in COLLECTIVES:
        packet = getattr(ops, name)
        register_lowering(packet, type_promotion_kind=None)(lower(packet.default))

    def wait(inp: Any) -> Any:
        ir._WaitKernel.create_wait(ops.wait_tensor.default, inp)
        return inp

    register_lowering(ops.wait_tensor, type_promotion_kind=None)(wait)
