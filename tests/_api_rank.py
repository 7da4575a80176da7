"""One rank of a multi-host test: ``python _api_rank.py OUT API BACKEND INIT_METHOD``.

API ``pyc10d``: ``import pyc10d as dist``; API ``plugin``: an unchanged torch program,
``torch.distributed`` on pyc10d's engine through ``pyc10d.torch_backend``. ``INIT_METHOD``:
``env://`` under torchrun (the store is its agent's) or ``file:///path?rank=R&world_size=N``.
Either way: an all_reduce and a broadcast, checked by the test from ``OUT/rank<r>.json``.
"""

import json
import os
import socket
import sys

import torch

out, api, backend, init_method = sys.argv[1:5]
if api == "plugin":
    import torch.distributed as dist

    import pyc10d.torch_backend  # registers pyc10d's backends with torch
else:
    import pyc10d as dist  # type: ignore[no-redef]
dist.init_process_group(None if backend == "auto" else backend, init_method=init_method)
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
b = torch.full((3,), float(rank))
dist.broadcast(b, src=world - 1)
dist.barrier()
info = {"rank": rank, "world": world, "sum": t.tolist(), "bcast": b.tolist(),
        "backend": dist.get_backend(), "host": socket.gethostname(),
        "local_rank": int(os.environ.get("LOCAL_RANK", -1))}
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(info, f)
dist.destroy_process_group()
