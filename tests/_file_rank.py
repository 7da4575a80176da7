"""One rank of a ``file://`` job: ``python _file_rank.py OUT FILE RANK WORLD``; an all_reduce
and a broadcast on the tcp backend, written to ``OUT/rank<r>.json`` for the test to check."""

import json
import os
import socket
import sys

import torch

import pyc10d as dist

out, path, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("tcp", init_method=f"file://{path}", rank=rank, world_size=world)
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
b = torch.full((3,), float(rank))
dist.broadcast(b, src=world - 1)
dist.barrier()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": world, "sum": t.tolist(), "bcast": b.tolist(),
               "host": socket.gethostname()}, f)
dist.destroy_process_group()
