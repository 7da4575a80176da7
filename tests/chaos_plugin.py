"""The plugin's chaos workload: torch's own DDP or FSDP2 training on ``pyc10d_shm`` /
``pyc10d_tcp``, with a rank SIGKILLed at a random point (``tests/chaos.py`` runs the trial).

Each rank trains a small MLP with ``torch.nn.parallel.DistributedDataParallel`` or
``torch.distributed.fsdp.fully_shard`` through ``torch.distributed`` (pyc10d only as the
backend name), and after every step checks its parameters against one process training the
same model on the whole batch, which it computes itself: a step that "succeeds" with a wrong
result is caught. torch's C++ (DDP's reducer, FSDP2's all-gathers and reduce-scatters) waits on
pyc10d's works and futures here, which is where a failure used to crash the survivors.
"""

from __future__ import annotations

import os
import signal
import threading
from datetime import timedelta
from typing import Any

import torch
import torch._dynamo  # DDP and FSDP2 import these lazily: 5-6 s in each forked
import torch.distributed as tdist
import torch.distributed.fsdp  # rank on a loaded 2-core machine, so the parent
import torch.distributed.tensor  # imports them once, before it forks

import pyc10d.torch_backend  # noqa: F401 - registers the backends

WORKLOADS = ("ddp", "fsdp")
BATCH = 4  # samples per rank and step


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch(world: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(world * BATCH, 16, generator=g), torch.randn(world * BATCH, 4, generator=g)


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def _wrap(workload: str, model: torch.nn.Module, world: int) -> torch.nn.Module:
    if workload == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _full(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()


def rank_main(trial: Any, rank: int, store_path: str) -> tuple:
    """One rank of a plugin trial; ``("ok" | "wrong" | "error", text)`` (the caller adds the time)."""
    store = tdist.FileStore(store_path, trial.world)
    tdist.init_process_group(trial.backend, store=store, rank=rank, world_size=trial.world,
                             timeout=timedelta(seconds=60))
    reference = _model()
    model = _wrap(trial.workload, _model(), trial.world)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    for step in range(trial.steps):
        if rank == trial.victim and step == trial.kill_at:
            threading.Timer(trial.delay_s, os.kill, (os.getpid(), signal.SIGKILL)).start()
        x, y = _batch(trial.world, step)
        opt.zero_grad()
        _loss(model, x[mine], y[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        _loss(reference, x, y).backward()
        ref_opt.step()
        for p, want in zip(model.parameters(), reference.parameters()):
            if not torch.allclose(_full(p), want.detach(), rtol=1e-4, atol=1e-5):
                return ("wrong", f"{trial.workload} step {step + 1}: parameters differ from one process")
    if rank == trial.victim:  # the timer did not fire in time: die before the last barrier
        os.kill(os.getpid(), signal.SIGKILL)
    tdist.barrier()
    return ("ok", "")


def make(rng: Any) -> dict:
    """The random part of a plugin trial (``Trial.make`` draws the rest)."""
    steps = rng.randint(4, 8)
    return {"workload": rng.choice(WORKLOADS), "steps": steps, "kill_at": rng.randrange(steps - 1),
            "delay_s": rng.uniform(0.0, 0.01)}


__all__ = ["WORKLOADS", "make", "rank_main"]
