"""The one seam between symmetric memory and the shm transport.

Symmetric memory needs what the shm backend already has — segments in ``/dev/shm`` that
other processes of the host map by name, futexes on 32-bit words in them, and a way to tell
that a peer process died — and nothing else of the transport. Everything it uses of
``pyc10d.transport`` goes through the names below, so the transport can change its internals
without this room noticing, and a reader sees at one glance what is borrowed.
"""

from __future__ import annotations

from typing import Any

from ..backends import shm as _shm_backend
from ..transport.shm import futex
from ..transport.shm.arena import default_spin
from ..transport.shm.segment import PeerWatch, Segment, new_name, unlink
from ..transport.shm.segment import available as _dir_available

__all__ = [
    "PeerWatch", "Segment", "available", "create_segment", "map_segment", "unlink_segment",
    "futex_wait", "futex_wake", "spin_policy", "serve_backend_allreduce",
]


def serve_backend_allreduce(pg: Any, plan: Any) -> None:
    """Let the all_reduce of ``pg``'s engine hand its symmetric tensors to ``plan``, where the
    engine is the shm backend's (``ShmBackend.serve_symmetric``): the one place this room
    reaches the backend. Only that group's engine learns of it; other groups are untouched."""
    engine = pg._get_backend()
    if isinstance(engine, _shm_backend.ShmBackend):
        engine.serve_symmetric(plan)


def available() -> bool:
    """True where segments and futexes work (Linux x86-64 with a writable /dev/shm)."""
    return futex.available() and _dir_available()


def create_segment(nbytes: int) -> Segment:
    """A new segment of ``nbytes`` (pages reserved now, so a full /dev/shm fails here)."""
    return Segment(new_name("s"), nbytes, create=True)


def map_segment(name: str, nbytes: int) -> Segment:
    """Map a peer's segment by name; raises ``OSError`` if it is gone or too small."""
    return Segment(name, nbytes, create=False)


def unlink_segment(name: str) -> None:
    """Remove a segment's name (idempotent); mappings stay valid until they are dropped."""
    unlink(name)


def futex_wait(addr: int, expected: int, timeout: float) -> None:
    """Sleep while the word at ``addr`` equals ``expected`` (at most ``timeout`` s)."""
    futex.wait(addr, expected, timeout)


def futex_wake(addr: int) -> None:
    """Wake every process sleeping on the word at ``addr``."""
    futex.wake(addr)


def spin_policy(size: int) -> tuple[float, bool]:
    """(seconds to spin before sleeping, whether the host has fewer CPUs than ``size`` ranks);
    the shm backend's own choice, so both wait the same way."""
    return default_spin(size)
