"""One rank of a ``file://`` job: ``python _file_rank.py OUT FILE RANK WORLD API``; an
all_reduce and a broadcast, written to ``OUT/rank<r>.json`` for the test to check. API
``pyc10d``: pyc10d's tcp backend; ``plugin``: ``torch.distributed`` with its own FileStore on
pyc10d's engine (backend ``pyc10d_tcp``)."""

import json
import os
import socket
import sys

import torch

out, path, rank, world, api = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if api == "plugin":
    import torch.distributed as dist

    import pyc10d.torch_backend  # noqa: F401 - registers the "pyc10d_tcp" backend
    backend = "pyc10d_tcp"
else:
    import pyc10d as dist  # type: ignore[no-redef]

    backend = "tcp"
dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=world)
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
b = torch.full((3,), float(rank))
dist.broadcast(b, src=world - 1)
dist.barrier()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": world, "sum": t.tolist(), "bcast": b.tolist(),
               "host": socket.gethostname()}, f)
dist.destroy_process_group()
