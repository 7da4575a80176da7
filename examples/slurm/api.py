"""pyc10d's own API under srun, nothing set by hand: ``init_process_group()`` reads rank,
world size and the store's address (the first node of the step, a port from the job id)
from srun's variables (pyc10d/launch_env.py).

``srun -N 2 --ntasks-per-node 2 python api.py OUT``: each rank all-reduces its rank + 1 and
writes ``OUT/rank<r>.json`` (its host, local rank, the group's backend and the sum).
``--loop``: after that, all-reduce until a collective fails, writing ``OUT/ready<r>`` once
running and ``OUT/failed<r>.json`` (the error, its type, when) on failure.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import torch

import pyc10d as dist


def main() -> None:
    out, loop = Path(sys.argv[1]), "--loop" in sys.argv
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    (out / f"rank{rank}.json").write_text(json.dumps({
        "host": socket.gethostname(), "world": world, "local_rank": dist.get_node_local_rank(),
        "backend": dist.get_backend(), "sum": t.item()}))
    if loop:
        (out / f"ready{rank}").touch()
        x = torch.ones(1024)
        try:
            while True:
                dist.all_reduce(x)
                x.fill_(1.0)
        except Exception as e:  # noqa: BLE001 - the failure is the result
            (out / f"failed{rank}.json").write_text(json.dumps(
                {"error": str(e), "type": type(e).__name__, "at": time.time()}))
            sys.exit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
