"""A small seeded DDP training shared by the launcher examples (``examples/slurm/ddp.py``,
``examples/ray/train.py``) and their checks: a 2-layer MLP, each rank its own batches, SGD.

``reference(world)`` does in one process what ``world`` DDP ranks do (each rank's gradients
averaged by hand), so a run on any backend and launcher can be checked against it: the same
losses and parameters to float rounding (``pyc10d.testing.clients.compare``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

STEPS = 8
LR = 0.1


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))


def batches(rank: int) -> torch.Generator:
    """Rank ``rank``'s stream of batches (feed it to ``loss_of``)."""
    return torch.Generator().manual_seed(1000 + rank)


def loss_of(net: nn.Module, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(16, 32, generator=gen)
    return (net(x) - x[:, :4]).pow(2).mean()


def checksum(net: nn.Module) -> float:
    return sum(p.double().sum().item() for p in net.parameters())


def train(rank: int, world: int, steps: int = STEPS) -> dict:
    """The training with torch's DDP over torch.distributed's default group (initialised
    already, on any backend): each step's loss averaged over the ranks, and the checksum."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    net = DistributedDataParallel(model())
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    gen = batches(rank)
    losses = []
    for _ in range(steps):
        loss = loss_of(net, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    return {"losses": losses, "checksum": checksum(net)}


def reference(world: int, steps: int = STEPS) -> dict:
    """The losses (mean over ranks, per step) and parameter checksum of ``world`` ranks."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    gens = [batches(r) for r in range(world)]
    losses = []
    for _ in range(steps):
        grads, total = [torch.zeros_like(p) for p in net.parameters()], 0.0
        for gen in gens:
            net.zero_grad()
            loss = loss_of(net, gen)
            loss.backward()
            total += loss.item()
            for g, p in zip(grads, net.parameters()):
                g += p.grad
        for g, p in zip(grads, net.parameters()):
            p.grad = g / world
        opt.step()
        losses.append(total / world)
    return {"losses": losses, "checksum": checksum(net)}
