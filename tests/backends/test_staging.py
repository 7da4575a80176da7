"""A CUDA tensor is staged through host memory by every tensor collective and point-to-point
call: copied to a CPU tensor, moved, and the result copied back into it.

There is no GPU here, so the CUDA tensor is faked: a CPU tensor whose ``device`` says
``cuda:0`` (``is_cpu`` False, ``is_cuda`` True), whose own memory cannot be read as host
memory (``data_ptr``, ``untyped_storage`` and ``numpy`` raise, as a device pointer would be
useless to a socket or a memcpy), whose views and results stay "CUDA", and which becomes a
plain CPU tensor only through ``.cpu()`` / ``.to("cpu")``. Every call must give the right
values through that door alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import pyc10d as dist

W = 2


def _to_cpu(func: Any, args: tuple, kwargs: dict) -> bool:
    if func is torch.Tensor.cpu:
        return True
    if func is torch.Tensor.to:
        for a in [*args[1:], kwargs.get("device")]:
            if isinstance(a, (str, torch.device)):
                return torch.device(a).type == "cpu"
            if isinstance(a, torch.Tensor):
                return not isinstance(a, FakeCuda)
    return False


class FakeCuda(torch.Tensor):
    """A tensor that answers every device question as a CUDA tensor would (see above)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return False

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    def data_ptr(self) -> int:
        raise RuntimeError("fake CUDA: device memory is not host memory")

    def untyped_storage(self) -> Any:
        raise RuntimeError("fake CUDA: device memory is not host memory")

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("can't convert cuda:0 device type tensor to numpy")

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if _to_cpu(func, args, kwargs):
            # a CPU tensor's .cpu() is itself; a CUDA tensor's is a copy in host memory
            return out.as_subclass(torch.Tensor).clone() if isinstance(out, FakeCuda) else out

        def wrap(x: Any) -> Any:
            return x.as_subclass(FakeCuda) if isinstance(x, torch.Tensor) and not isinstance(x, FakeCuda) else x

        return type(out)(map(wrap, out)) if isinstance(out, (list, tuple)) else wrap(out)


def cu(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(FakeCuda)


def test_the_fake_looks_like_cuda() -> None:
    t = cu(torch.ones(4))
    assert t.device.type == "cuda" and not t.is_cpu and t.detach().device.type == "cuda"
    assert t.view(2, 2).device.type == "cuda" and t.cpu().device.type == "cpu"
    assert type(t.to("cpu", copy=True)) is torch.Tensor
    host = t.cpu()
    host.add_(1)  # a copy: writing it leaves the "device" tensor alone
    assert type(host) is torch.Tensor and torch.equal(t.as_subclass(torch.Tensor), torch.ones(4))
    with pytest.raises(RuntimeError):
        t.data_ptr()


def _calls(rank: int) -> dict[str, Callable[[], bool]]:
    """Each tensor call of the public API on fake CUDA tensors: name -> run it, right result?"""
    r1, tot = float(rank + 1), W * (W + 1) / 2

    def full(n: int, v: float) -> torch.Tensor:
        return cu(torch.full((n,), float(v)))

    def all_reduce(async_op: bool = False) -> bool:
        t = full(4, r1)
        work = dist.all_reduce(t, async_op=async_op)
        if async_op:
            work.wait()
        return bool((t.cpu() == tot).all())

    def all_reduce_coalesced() -> bool:
        ts = [full(4, r1), full(2, r1)]
        dist.all_reduce_coalesced(ts)
        return all(bool((t.cpu() == tot).all()) for t in ts)

    def reduce() -> bool:
        t = full(4, r1)
        dist.reduce(t, 0)
        return bool((t.cpu() == (tot if rank == 0 else r1)).all())

    def broadcast() -> bool:
        t = full(4, r1)
        dist.broadcast(t, 0)
        return bool((t.cpu() == 1).all())

    def all_gather() -> bool:
        out = [full(2, 0) for _ in range(W)]
        dist.all_gather(out, full(2, r1))
        return all(bool((o.cpu() == i + 1).all()) for i, o in enumerate(out))

    def all_gather_into_tensor() -> bool:
        out = full(2 * W, 0)
        dist.all_gather_into_tensor(out, full(2, r1))
        return torch.equal(out.cpu(), torch.arange(1.0, W + 1).repeat_interleave(2))

    def reduce_scatter() -> bool:
        out = full(2, 0)
        dist.reduce_scatter(out, [full(2, r1) for _ in range(W)])
        return bool((out.cpu() == tot).all())

    def reduce_scatter_tensor() -> bool:
        out = full(2, 0)
        dist.reduce_scatter_tensor(out, full(2 * W, r1))
        return bool((out.cpu() == tot).all())

    def gather() -> bool:
        out = [full(2, 0) for _ in range(W)] if rank == 0 else None
        dist.gather(full(2, r1), out, dst=0)
        return out is None or all(bool((o.cpu() == i + 1).all()) for i, o in enumerate(out))

    def scatter() -> bool:
        out = full(2, 0)
        dist.scatter(out, [full(2, i + 1.0) for i in range(W)] if rank == 0 else None, src=0)
        return bool((out.cpu() == r1).all())

    def all_to_all() -> bool:
        out = [full(2, 0) for _ in range(W)]
        dist.all_to_all(out, [full(2, float(rank * W + j)) for j in range(W)])
        return all(bool((o.cpu() == j * W + rank).all()) for j, o in enumerate(out))

    def all_to_all_single() -> bool:
        out = full(2 * W, 0)
        dist.all_to_all_single(out, full(2 * W, r1))
        return torch.equal(out.cpu(), torch.arange(1.0, W + 1).repeat_interleave(2))

    def send_recv() -> bool:
        t = full(3, r1)
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        return bool((t.cpu() == 1).all())

    def isend_irecv() -> bool:
        t = full(3, r1)
        ops = [dist.P2POp(dist.isend, t, 1)] if rank == 0 else [dist.P2POp(dist.irecv, t, 0)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return bool((t.cpu() == 1).all())

    return {"all_reduce": all_reduce, "all_reduce async": lambda: all_reduce(True),
            "all_reduce_coalesced": all_reduce_coalesced, "reduce": reduce, "broadcast": broadcast,
            "all_gather": all_gather, "all_gather_into_tensor": all_gather_into_tensor,
            "reduce_scatter": reduce_scatter, "reduce_scatter_tensor": reduce_scatter_tensor,
            "gather": gather, "scatter": scatter, "all_to_all": all_to_all,
            "all_to_all_single": all_to_all_single, "send/recv": send_recv,
            "batch_isend_irecv": isend_irecv}


@pytest.mark.timeout(30)
def test_every_tensor_call_stages_a_cuda_tensor_through_host_memory() -> None:
    store, results = dist.HashStore(), {}
    lock = threading.Lock()

    def rank_main(rank: int) -> None:
        dist.init_process_group("threaded", store=store, rank=rank, world_size=W)
        try:
            for name, call in _calls(rank).items():
                try:
                    verdict = "ok" if call() else "wrong result"
                except Exception as e:  # noqa: BLE001 - reported per call below
                    verdict = f"{type(e).__name__}: {e}"
                with lock:
                    results.setdefault(name, []).append(verdict)
                dist.barrier()
        finally:
            dist.destroy_process_group()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(25)
    bad = {name: v for name, v in results.items() if v != ["ok"] * W}
    assert len(results) == 15 and not bad, bad
