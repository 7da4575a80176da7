"""One worker of a torchrun job that torchrun's elastic agent restarts (``test_elastic_restart.py``).

``python -m torch.distributed.run ... _elastic_rank.py BACKEND OUT MODE``: every attempt
runs ``init_process_group(BACKEND)`` on torch.distributed (the store is torchrun's agent
store, the same one across restarts) and an all_reduce of ``rank + 1`` repeated over 5
elements, and writes what it got to ``OUT/<attempt>-<world size>-<rank>.json`` in one write
(and, first of all, its pid as ``OUT/pid-<pid>``). The attempt is counted in the records of
the rank's earlier attempts: ``TORCHELASTIC_RESTART_COUNT`` is each agent's own count, and an
agent whose workers did not fail restarts them for the other's failure without counting it.
``MODE`` says how an attempt ends:

* ``exit``: in the first attempt rank 1 exits with code 3
  right after the all_reduce and the others wait in a second all_reduce, which fails (they
  exit 1, naming the dead rank); torchrun then restarts every worker. A later attempt runs a
  second all_reduce, destroys the group and exits 0.
* ``grow``: an attempt of world size 2 waits after its all_reduce to be stopped (as torchrun
  stops the workers when a node joins, and starts a larger world, the restart count
  unchanged); an attempt of another size finishes as a later ``exit`` attempt does.

The test's short form calls ``main`` in processes it forks itself, with the variables torchrun
would set and a torch ``TCPStore`` of its own standing in for the agent's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main(backend: str, out: Path, mode: str) -> None:
    """One attempt's worker; its place in the job comes from torchrun's variables."""
    (out / f"pid-{os.getpid()}").touch()  # whose /dev/shm segments the test looks for
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Which attempt this is, counted in the records this rank wrote before: not from
    # TORCHELASTIC_RESTART_COUNT, which an agent whose own workers did not fail leaves as it was.
    attempt = len(list(out.glob(f"*-{world}-{rank}.json")))
    dist.init_process_group(backend, timeout=timedelta(seconds=20))
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    record = {"attempt": attempt, "world": world, "rank": rank, "pid": os.getpid(), "sum": t.tolist(),
              "restart_count": int(os.environ["TORCHELASTIC_RESTART_COUNT"])}
    (out / f"{attempt}-{world}-{rank}.json").write_text(json.dumps(record))
    if mode == "exit" and attempt == 0:
        if rank == 1:
            os._exit(3)
        dist.all_reduce(t)  # fails: rank 1 died
        sys.exit(f"rank {rank}: the second all_reduce did not fail")
    if mode == "grow" and world == 2:
        time.sleep(60)  # until it is stopped
        sys.exit(f"rank {rank}: nobody restarted the world of 2")
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
