"""One rank under torch's ``torchrun``: ``python _torchrun_rank.py OUT API``.

API ``pyc10d``: ``import pyc10d as dist`` with ``env://`` (the store is torchrun's agent's);
API ``plugin``: an unchanged torch program, ``torch.distributed`` on pyc10d's engine through
``pyc10d.torch_backend``. Either way: an all_reduce and a broadcast, checked by the test
from ``OUT/rank<r>.json``.
"""

import json
import os
import socket
import sys

import torch

out, api = sys.argv[1], sys.argv[2]
if api == "plugin":
    import torch.distributed as dist

    import pyc10d.torch_backend  # noqa: F401 - registers the "pyc10d" backend
    dist.init_process_group("pyc10d")
    backend = dist.get_backend()
else:
    import pyc10d as dist

    dist.init_process_group()
    backend = dist.get_backend()
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
b = torch.full((3,), float(rank))
dist.broadcast(b, src=world - 1)
dist.barrier()
info = {"rank": rank, "world": world, "sum": t.tolist(), "bcast": b.tolist(), "backend": backend,
        "host": socket.gethostname(), "local_rank": int(os.environ["LOCAL_RANK"])}
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(info, f)
dist.destroy_process_group()
