"""Turn an ``init_method`` URL (or environment variables) into a store, rank and world size.

- ``env://``: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment.
- ``tcp://host:port``: a TCPStore; rank 0 hosts it.
- ``file:///path``: a FileStore on a shared file.
Query parameters (``?rank=1&world_size=2``) override, as in torch.
"""

from __future__ import annotations

import os
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from .store import FileStore, Store, TCPStore


def _env_int(name: str, given: int) -> int:
    if given >= 0:
        return given
    value = os.environ.get(name)
    if value is None:
        raise ValueError(
            f"Error initializing torch.distributed using env:// rendezvous: environment variable {name} expected, but not set"
        )
    return int(value)


def rendezvous(init_method: str, rank: int, world_size: int, timeout: timedelta) -> tuple[Store, int, int]:
    url = urlparse(init_method)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    if "rank" in query:
        rank = int(query["rank"])
    if "world_size" in query:
        world_size = int(query["world_size"])
    if url.scheme == "env":
        rank = _env_int("RANK", rank)
        world_size = _env_int("WORLD_SIZE", world_size)
        host = os.environ.get("MASTER_ADDR")
        port = os.environ.get("MASTER_PORT")
        if host is None or port is None:
            missing = "MASTER_ADDR" if host is None else "MASTER_PORT"
            raise ValueError(
                f"Error initializing torch.distributed using env:// rendezvous: environment variable {missing} expected, but not set"
            )
        store = TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=True)
        return store, rank, world_size
    if url.scheme == "tcp":
        if rank < 0 or world_size < 0:
            raise ValueError("tcp:// rendezvous needs rank and world_size")
        store = TCPStore(url.hostname or "127.0.0.1", url.port or 29500, world_size, is_master=rank == 0,
                         timeout=timeout, wait_for_workers=True)
        return store, rank, world_size
    if url.scheme == "file":
        if rank < 0 or world_size < 0:
            raise ValueError("file:// rendezvous needs rank and world_size")
        store = FileStore(url.path, world_size)
        store.set_timeout(timeout)
        return store, rank, world_size
    raise ValueError(f"unsupported init_method {init_method!r}: use env://, tcp://host:port or file:///path")
