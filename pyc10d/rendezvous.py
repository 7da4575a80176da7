"""Turn an ``init_method`` URL (or environment variables) into a store, rank and world size.

- ``env://``: rank, world size and the store's address from the environment: torchrun's
  RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, or those of Open MPI, MPICH or Slurm
  (:mod:`pyc10d.launch_env` reads them). Under torch's torchrun the store is its agent's,
  torch's, joined with ``TorchTCPStore``.
- ``tcp://host:port``: a TCPStore; rank 0 hosts it.
- ``file:///path``: a FileStore on a shared file.
Query parameters (``?rank=1&world_size=2``) override, as in torch.
- any other scheme registered with ``register_rendezvous_handler`` (torch's contract: a
  generator ``handler(url, timeout=...)`` yielding ``(store, rank, world_size)``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

from .errors import DistTimeoutError
from .launch_env import LaunchEnv, detect
from .store import FileStore, Store, TCPStore
from .store.torch_tcp import TorchTCPStore

_JOINED, _ALL_JOINED = "pyc10d/launch/joined", "pyc10d/launch/all_joined"
_BUILT_IN = ("env", "tcp", "file")
_HANDLERS: dict[str, Callable[..., Iterator[tuple[Store, int, int]]]] = {}


def register_rendezvous_handler(scheme: str, handler: Callable[..., Iterator[tuple[Store, int, int]]]) -> None:
    """Let ``init_method="<scheme>://..."`` rendezvous through ``handler``, as torch's does:
    it is called as ``handler(url, timeout=timeout)`` (the url's query carries ``rank`` and
    ``world_size`` when the caller gave them) and must yield ``(store, rank, world_size)``."""
    if scheme in _BUILT_IN or scheme in _HANDLERS:
        raise RuntimeError(f"Rendezvous handler for {scheme}:// already registered")
    _HANDLERS[scheme] = handler


def _custom(url: Any, rank: int, world_size: int, timeout: timedelta) -> tuple[Store, int, int]:
    """Rendezvous through a registered handler, rank and world size added to the query."""
    extra = {k: v for k, v in (("rank", rank), ("world_size", world_size)) if v != -1}
    query = "&".join(q for q in (url.query, urlencode(extra)) if q)
    store, rank, world_size = next(_HANDLERS[url.scheme](url._replace(query=query).geturl(), timeout=timeout))
    return store, rank, world_size


def _port_file_store(info: LaunchEnv, timeout: timedelta) -> TCPStore:
    """The store of a single-host job with no MASTER_PORT: rank 0 serves it on a free port
    of 127.0.0.1 and writes the port to ``info.port_file``; the others wait for the file.

    A free port rather than one derived from the job id: nothing else on the host can hold
    it. Rank 0 removes the file once every rank has connected, so /tmp keeps nothing.
    """
    assert info.port_file is not None
    path, n = info.port_file, info.world_size
    if info.rank == 0:
        store = TCPStore("127.0.0.1", 0, n, is_master=True, timeout=timeout,
                         wait_for_workers=False)
        if n == 1:
            return store
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(str(store.port))
        os.replace(tmp, path)  # readers see the whole number or no file
        try:
            store.wait([_ALL_JOINED], timeout)
        finally:
            os.unlink(path)
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    delay = 0.005
    while True:
        try:
            with open(path) as f:
                if os.fstat(f.fileno()).st_uid == os.getuid():  # not a planted file
                    port = int(f.read())
                    break
        except (FileNotFoundError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise DistTimeoutError(
                f"{info.source} rank {info.rank}: timed out after {timeout.total_seconds():.0f}s "
                f"waiting for rank 0 to write its store port to {path}"
            )
        # No wake-up exists for a file appearing; back off so waiting ranks stay idle.
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    store = TCPStore("127.0.0.1", port, n, is_master=False, timeout=timeout,
                     wait_for_workers=False)
    if store.add(_JOINED, 1) == n - 1:
        store.set(_ALL_JOINED, "1")
    return store


def rendezvous(init_method: str, rank: int, world_size: int, timeout: timedelta) -> tuple[Store, int, int]:
    url = urlparse(init_method)
    if url.scheme in _HANDLERS:
        return _custom(url, rank, world_size, timeout)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    if "rank" in query:
        rank = int(query["rank"])
    if "world_size" in query:
        world_size = int(query["world_size"])
    if url.scheme == "env":
        info = detect(os.environ, rank, world_size, ppid=os.getppid())
        if info.port_file is not None:
            return _port_file_store(info, timeout), info.rank, info.world_size
        assert info.master_port is not None
        if info.torch_store:  # torch's torchrun: its agent serves torch's store
            return (TorchTCPStore(info.master_addr, info.master_port, info.world_size, timeout),
                    info.rank, info.world_size)
        store = TCPStore(info.master_addr, info.master_port, info.world_size,
                         is_master=info.rank == 0, timeout=timeout, wait_for_workers=True)
        return store, info.rank, info.world_size
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
    raise ValueError(f"unsupported init_method {init_method!r}: use env://, tcp://host:port, file:///path "
                     f"or a scheme registered with register_rendezvous_handler")
