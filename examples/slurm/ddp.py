"""A torch.distributed DDP script as Slurm users write one, on the backend named on the
command line (``pyc10d`` through torch.distributed, or ``gloo`` for the reference).

Rank and world size come from srun's ``SLURM_PROCID`` / ``SLURM_NTASKS``; the store's address
from ``MASTER_ADDR`` / ``MASTER_PORT``, which the batch script exports (``job.sbatch``: the
first node of the allocation). ``srun -N 2 --ntasks-per-node 2 python ddp.py --backend pyc10d
--out f.json``: the small seeded DDP training of ``pyc10d.testing.tiny_ddp``; rank 0 writes every
step's mean loss, a checksum of the parameters, the group's backend as torch names it, and
each rank's host.
"""

from __future__ import annotations

import argparse
import json
import os
import socket

import torch.distributed as dist

from pyc10d.testing import tiny_ddp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    result = tiny_ddp.train(rank, world)
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({**result, "backend": args.backend, "group": dist.get_backend(), "hosts": hosts}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
