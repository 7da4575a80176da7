"""barrier over shared memory: post a phase, wait until every rank has posted it.

Cost: one phase; no data. A rank sleeping here uses no CPU after its short spin.
"""

from __future__ import annotations

from .shm_comm import ShmComm, await_phase, descriptor_head, open_phase, split_step


def barrier_shm_counter(comm: ShmComm) -> None:
    c = comm.start("barrier", None, 0)
    comm.post(c)
    comm.wait_all(c)


def barrier_shm_step(comm: ShmComm):
    """``barrier_shm_counter`` made once for the lean lane (``backends/lane.py``):
    ``step(None, None, deadline, timeout)``. Same phase and descriptor."""
    arena = comm.arena
    head = descriptor_head("barrier", None)

    def start(_: None, __: None, deadline: float, timeout: float) -> int:
        c = open_phase(arena, head, 0, deadline, timeout, "barrier")
        arena.post(c)
        return c

    def finish(_: None, __: None, c: int, deadline: float) -> None:
        await_phase(arena, c, deadline, "barrier")

    return split_step(arena, "barrier", start, finish)
