"""Lightning Fabric's DDP on the backend named on the command line: ``process_group_backend=
"pyc10d"`` (Fabric calls ``torch.distributed.init_process_group`` with it) or ``"gloo"``.

``python examples/clients/fabric_ddp.py pyc10d out.json``: Fabric launches its 2 CPU
processes itself, a small MLP learns a fixed regression, each rank its own seeded batches,
15 SGD steps; rank 0 writes every step's mean loss over the ranks (``fabric.all_reduce``) and
a checksum of the parameters (``pyc10d.testing.clients`` compares the two backends' files).
"""

from __future__ import annotations

import json
import sys

import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy


def main() -> None:
    backend, out = sys.argv[1], sys.argv[2]
    fabric = Fabric(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=backend))
    fabric.launch()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = fabric.setup(model, opt)
    gen = torch.Generator().manual_seed(100 + fabric.global_rank)
    target = torch.linspace(-1, 1, 16)
    losses = []
    for _ in range(15):
        x = torch.randn(32, 16, generator=gen)
        loss = ((model(x).squeeze(1) - x @ target) ** 2).mean()
        opt.zero_grad()
        fabric.backward(loss)
        opt.step()
        losses.append(float(fabric.all_reduce(loss.detach(), reduce_op="mean")))
    checksum = sum(p.double().sum().item() for p in model.parameters())
    import torch.distributed as dist

    if fabric.global_rank == 0:
        with open(out, "w") as f:
            json.dump({"backend": backend, "losses": losses, "checksum": checksum,
                       "group": str(dist.get_backend())}, f)
    fabric.barrier()


if __name__ == "__main__":
    main()
