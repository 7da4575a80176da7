"""What the shrink tests of both APIs share (``test_shrink.py`` natively,
``test_torch_backend_shrink.py`` through torch): ``dist`` is ``pyc10d`` or ``torch.distributed``."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch

#: The issue's bound on one shrink (docs/failures.md: "each shrink asserted under 2 s"), on the
#: 2-core VM's scale: the tests compare with ``_clock.bound(SHRINK_BOUND_S)``.
SHRINK_BOUND_S = 2.0
#: The group timeout of ``store_host_dies_then_shrink``'s ranks.
GROUP_TIMEOUT_S = 20.0


def die_then_fail(dist: Any, rank: int, dead: int) -> str:
    """Every rank all-reduces once; ``dead`` then SIGKILLs itself and the others' next
    all_reduce fails (the world is broken): the error they got."""
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [4.0] * 4
    if rank == dead:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as e:
        return str(e)
    raise AssertionError(f"rank {rank}: the all_reduce without rank {dead} did not fail")


def timed_shrink(dist: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``dist.shrink_group(*args, **kwargs)`` and the seconds it took."""
    t0 = time.monotonic()
    pg = dist.shrink_group(*args, **kwargs)
    return pg, time.monotonic() - t0


def store_host_dies_then_shrink(dist: Any, rank: int, ws: int, backend: str, port: int,
                                **shrink_kwargs: Any) -> dict[str, Any]:
    """Rank 0 serves the job's TCPStore and dies; the others shrink the world without it and
    all-reduce on the shrunk group: their error, the shrink's seconds, (sum, rank, size)."""
    from datetime import timedelta

    store = dist.TCPStore("127.0.0.1", port, ws, is_master=rank == 0, timeout=timedelta(seconds=5))
    dist.init_process_group(backend, store=store, rank=rank, world_size=ws,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    out: dict[str, Any] = {"error": die_then_fail(dist, rank, 0)}
    _, out["shrink_s"] = timed_shrink(dist, [0], **shrink_kwargs)
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    out["sum"] = (t.tolist(), dist.get_rank(), dist.get_world_size())
    return out
