"""Ray Train on pyc10d: ``TorchTrainer`` with ``TorchConfig(backend=...)``, run by a driver on
a Ray cluster (``RAY_ADDRESS``). ``python train.py pyc10d OUT.json`` (or ``gloo``).

Four workers of one CPU each (two per node of a two-node cluster of 2 CPUs each), DDP on the
small seeded training of ``pyc10d.testing.tiny_ddp``; Ray initialises torch.distributed in
each worker with the backend asked for (the plugin serves ``"pyc10d"``). Rank 0 reports the
losses, the parameters' checksum, the group's backend as torch names it and each worker's
host to OUT.json (the cluster's hosts share its file system).
"""

from __future__ import annotations

import json
import socket
import sys
import tempfile

import ray
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


def train(config: dict) -> None:
    from pyc10d.testing import tiny_ddp

    rank, world = dist.get_rank(), dist.get_world_size()
    result = tiny_ddp.train(rank, world)
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    if rank == 0:
        with open(config["out"], "w") as f:
            json.dump({**result, "group": dist.get_backend(), "hosts": hosts, "backend": config["backend"]}, f)


def main() -> None:
    backend, out = sys.argv[1], sys.argv[2]
    ray.init()
    trainer = TorchTrainer(
        train, train_loop_config={"backend": backend, "out": out},
        scaling_config=ScalingConfig(num_workers=4, use_gpu=False, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend=backend, timeout_s=60),
        run_config=RunConfig(name=f"pyc10d-{backend}", storage_path=tempfile.mkdtemp(prefix="ray-train-")),
    )
    trainer.fit()


if __name__ == "__main__":
    main()
