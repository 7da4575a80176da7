"""A Hugging Face accelerate training script as its users write it: nothing in it names a backend.

``torchrun --nproc-per-node 2 examples/clients/accelerate_ddp.py --out out.json``:
``Accelerator(cpu=True)`` (a CPU job: without ``cpu=True`` accelerate on a machine with no GPU
trains each rank alone) picks Gloo (and refuses any other name), prepares a small seeded MLP, its
optimizer and a data loader it shards over the ranks, and runs 12 SGD steps; rank 0 writes
every step's mean loss over the ranks (``accelerator.reduce``), a checksum of the parameters
and which process group served the job. ``pyc10d.testing.clients`` runs it unchanged three
ways: on Gloo, with ``PYC10D_SERVE_GLOO=1`` (pyc10d serves the name gloo), and under
``init_first.py pyc10d`` (the default group made on pyc10d before ``Accelerator()``).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100)
    x = torch.randn(args.steps * 2 * 16, 16, generator=gen)
    y = x @ torch.linspace(-1, 1, 16)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    losses = []
    for xb, yb in loader:
        loss = ((model(xb).squeeze(1) - yb) ** 2).mean()
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        losses.append(float(accelerator.reduce(loss.detach(), reduction="mean")))

    checksum = sum(p.double().sum().item() for p in accelerator.unwrap_model(model).parameters())
    world = dist.group.WORLD
    if accelerator.is_main_process:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "checksum": checksum, "backend": dist.get_backend(),
                       "process_group": f"{type(world).__module__}.{type(world).__qualname__}",
                       "group_repr": repr(world), "accelerate_backend": accelerator.state.backend,
                       "num_processes": accelerator.num_processes,
                       "distributed_type": str(accelerator.distributed_type)}, f)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
