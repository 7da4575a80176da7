"""Shared-memory segments in ``/dev/shm`` and the liveness of the processes that map them.

A segment is a file ``/dev/shm/pyc10d_<pid>_<token>`` that one rank creates and the others
attach to by name. Its life is kept short on purpose: once every rank has mapped it, the
name is unlinked (the mapping lives on until the last process unmaps it or exits), so a
rank that is killed later can never leak it. Names that are created or attached but not
yet unlinked sit in a registry that an ``atexit`` hook empties, and a rank that fails
during set-up unlinks the name itself.

``PeerWatch`` tells whether peer processes still run: a ``pidfd`` per peer becomes
readable when the process exits, zombie or not (``os.kill(pid, 0)`` and ``/proc`` are the
fallback where pidfds are missing).
"""

from __future__ import annotations

import atexit
import ctypes
import mmap
import os
import secrets
import select
import threading

import torch

from ... import threads

PREFIX = "pyc10d_"
SHM_DIR = "/dev/shm"

_registry: set[str] = set()
_registry_lock = threading.Lock()
threads.renew_after_fork(globals(), _registry_lock=threading.Lock)


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def new_name(tag: str = "") -> str:
    return f"{PREFIX}{os.getpid()}_{tag}{secrets.token_hex(6)}"


def unlink(name: str) -> None:
    """Remove the name (idempotent); the memory stays while some process maps it."""
    with _registry_lock:
        _registry.discard(name)
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def created_by(*pids: int) -> list[str]:
    """Names in ``/dev/shm`` of the segments these processes created (the name holds the pid)."""
    prefixes = tuple(f"{PREFIX}{pid}_" for pid in pids)
    try:
        return [n for n in os.listdir(SHM_DIR) if n.startswith(prefixes)]
    except OSError:
        return []


def sweep(pid: int) -> None:
    """Unlink every segment name that process ``pid`` created. Called when a peer is seen
    dead: a rank killed between creating a segment and its peers mapping it would leave the
    name behind, and only its survivors can remove it (their own mappings stay valid)."""
    for name in created_by(pid):
        unlink(name)


@atexit.register
def _unlink_registered() -> None:
    for name in list(_registry):
        unlink(name)


class Segment:
    """A mapped segment; ``view(offset, nbytes)`` gives a uint8 tensor over part of it."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        self.name, self.size = name, size
        path = os.path.join(SHM_DIR, name)
        with _registry_lock:
            _registry.add(name)
        try:
            if create:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            else:
                fd = os.open(path, os.O_RDWR)
            try:
                if create:
                    # reserve the pages now: a full /dev/shm fails here, not with SIGBUS later
                    os.posix_fallocate(fd, 0, size)
                elif os.fstat(fd).st_size < size:
                    raise OSError(f"shm segment {name} is smaller than {size} bytes")
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                self.mm = mmap.mmap(fd, size, flags=flags)
            finally:
                os.close(fd)
        except BaseException:
            if create:
                unlink(name)
            else:
                with _registry_lock:
                    _registry.discard(name)
            raise
        self._anchor = ctypes.c_char.from_buffer(self.mm)
        self.address = ctypes.addressof(self._anchor)
        self.words = memoryview(self.mm).cast("I")
        self.tensor = torch.frombuffer(self.mm, dtype=torch.uint8)

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        return self.tensor[offset:offset + nbytes]

    def unlink(self) -> None:
        unlink(self.name)

    def close(self) -> None:
        """Drop this handle's references. The mapping itself goes when the last view does:
        tensors from ``view`` keep the mmap alive, so an explicit unmap could never leave a
        tensor pointing at freed memory."""
        self.unlink()
        self.tensor = self.words = self._anchor = self.mm = None  # type: ignore[assignment]


class PeerWatch:
    """Liveness of the processes ``pids`` (index = rank); ``dead()`` lists the ones that exited."""

    def __init__(self, pids: list[int], me: int) -> None:
        self.pids, self.me = pids, me
        self.fds: dict[int, int] = {}
        self.gone: set[int] = set()
        for rank, pid in enumerate(pids):
            if rank == me or pid <= 0:
                continue
            try:
                self.fds[rank] = os.pidfd_open(pid)
            except (AttributeError, OSError):
                if not _pid_alive(pid):
                    self.gone.add(rank)

    def dead(self, ranks: list[int] | None = None) -> list[int]:
        """The ranks among ``ranks`` (default: all) whose process has exited."""
        ranks = list(range(len(self.pids))) if ranks is None else ranks
        fds = [self.fds[r] for r in ranks if r in self.fds and r not in self.gone]
        if fds:
            readable, _, _ = select.select(fds, [], [], 0)
            for rank, fd in list(self.fds.items()):
                if fd in readable and rank not in self.gone:
                    self.gone.add(rank)
                    sweep(self.pids[rank])
        for r in ranks:
            if r == self.me or r in self.fds or r in self.gone or self.pids[r] <= 0:
                continue
            if not _pid_alive(self.pids[r]):
                self.gone.add(r)
                sweep(self.pids[r])
        return [r for r in ranks if r in self.gone]

    def close(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True
