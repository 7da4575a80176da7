"""A store shared between processes through one file on a shared filesystem.

The file is an append-only log of ``set``/``delete`` records. Every writer takes an
exclusive ``flock``, replays what others appended since its last look, then appends; readers
take a shared lock and replay only the new bytes, so each operation costs O(new records).
``flock`` locks belong to an open file description, and every operation opens the file
afresh, so several FileStore objects on one path in one process exclude each other as
separate processes do. Blocking calls poll with a backing-off sleep: files offer no wake-up.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from ..errors import DistStoreError
from .base import (
    STORE_DEFAULT_TIMEOUT,
    Store,
    resolve_timeout,
    timeout_seconds,
    to_bytes,
    wait_timeout_error,
)

_HDR = struct.Struct("!BII")  # op, key length, value length
_SET, _DEL = 1, 2
# User keys are stored as "/" + key so these bookkeeping keys can never collide with them.
_REFCOUNT = "refcount/"
_CLEANUP = "cleanup/"
_POLL_MIN, _POLL_MAX = 0.001, 0.05


def _record(op: int, key: str, value: bytes = b"") -> bytes:
    k = key.encode()
    return _HDR.pack(op, len(k), len(value)) + k + value


class FileStore(Store):
    """torch.distributed.FileStore: ``world_size`` instances share ``file_name``.

    The file is deleted when the last of ``world_size`` instances is garbage collected
    (reference count kept in the file itself; best effort). ``world_size=-1`` never deletes.
    """

    #: Ranks on other hosts may share the file (a network file system): the tcp transport
    #: then advertises this host's address rather than loopback.
    shared_file = True

    def __init__(self, file_name: str, world_size: int = -1) -> None:
        super().__init__(STORE_DEFAULT_TIMEOUT)
        self._path = os.fspath(file_name)
        self._world_size = world_size
        self._lock = threading.Lock()  # guards the replay cache below across threads
        self._cache: dict[str, bytes] = {}
        self._offset = 0
        self._ident: tuple[int, int] | None = None
        self._released = True  # until the refcount is taken, __del__ has nothing to undo
        self._add_raw(_REFCOUNT, 1)
        self._released = False

    @property
    def path(self) -> str:
        return self._path

    # -- log plumbing -------------------------------------------------------------------
    @contextmanager
    def _locked(self, exclusive: bool, patience: float | None = None) -> Iterator[int]:
        """Open the file, flock it, replay new records; yields the fd. Hold ``self._lock``.

        With ``patience`` (seconds), give up with BlockingIOError rather than wait longer.
        """
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            if patience is None:
                fcntl.flock(fd, mode)
            else:
                deadline = time.monotonic() + patience
                while True:
                    try:
                        fcntl.flock(fd, mode | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(_POLL_MIN)
            self._replay(fd)
            yield fd
        finally:
            os.close(fd)  # also drops the flock

    def _replay(self, fd: int) -> None:
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        if ident != self._ident or st.st_size < self._offset:
            # The file was removed and recreated under us: start over from its beginning.
            self._cache, self._offset, self._ident = {}, 0, ident
        if st.st_size <= self._offset:
            return
        buf = os.pread(fd, st.st_size - self._offset, self._offset)
        pos, end = 0, len(buf)
        while pos + _HDR.size <= end:
            op, klen, vlen = _HDR.unpack_from(buf, pos)
            start = pos + _HDR.size
            if start + klen + vlen > end:
                break  # torn record from a crashed writer: stop before it
            key = buf[start : start + klen].decode()
            if op == _SET:
                self._cache[key] = buf[start + klen : start + klen + vlen]
            else:
                self._cache.pop(key, None)
            pos = start + klen + vlen
        self._offset += pos

    def _write(self, fd: int, data: bytes) -> None:
        """Append records (caller holds the exclusive lock) and fold them into the cache."""
        os.lseek(fd, 0, os.SEEK_END)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        self._replay(fd)

    def _add_raw(self, key: str, amount: int) -> int:
        with self._lock, self._locked(True) as fd:
            try:
                new = int(self._cache.get(key, b"0")) + int(amount)
            except ValueError as e:
                raise DistStoreError(f"add: value of key {key!r} is not an integer") from e
            self._write(fd, _record(_SET, key, str(new).encode()))
            return new

    def _poll(self, keys: list[str], timeout: timedelta) -> list[bytes]:
        """Values of ``keys`` once all exist; sleeps 1 ms doubling to 50 ms between looks."""
        internal = ["/" + k for k in keys]
        secs = timeout_seconds(timeout)
        deadline = None if secs is None else time.monotonic() + secs
        delay = _POLL_MIN
        while True:
            with self._lock, self._locked(False):
                if all(k in self._cache for k in internal):
                    return [self._cache[k] for k in internal]
                missing = [k for k, i in zip(keys, internal) if i not in self._cache]
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise wait_timeout_error(missing, timeout)
                delay = min(delay, left)
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)

    # -- Store API ----------------------------------------------------------------------
    def set(self, key: str, value: str | bytes) -> None:
        with self._lock, self._locked(True) as fd:
            self._write(fd, _record(_SET, "/" + key, to_bytes(value)))

    def get(self, key: str) -> bytes:
        return self._poll([key], self._timeout)[0]

    def add(self, key: str, amount: int) -> int:
        return self._add_raw("/" + key, amount)

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        expected, desired = to_bytes(expected_value), to_bytes(desired_value)
        with self._lock, self._locked(True) as fd:
            current = self._cache.get("/" + key)
            if current is None and expected != b"":
                return expected
            if current is not None and current != expected:
                return current
            self._write(fd, _record(_SET, "/" + key, desired))
            return desired

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._poll(list(keys), resolve_timeout(self._timeout, timeout))

    def check(self, keys: list[str]) -> bool:
        with self._lock, self._locked(False):
            return all("/" + k in self._cache for k in keys)

    def delete_key(self, key: str) -> bool:
        with self._lock, self._locked(True) as fd:
            if "/" + key not in self._cache:
                return False
            self._write(fd, _record(_DEL, "/" + key))
            return True

    def list_keys(self) -> list[str]:
        with self._lock, self._locked(False):
            return [k[1:] for k in self._cache if k.startswith("/")]

    def num_keys(self) -> int:
        """All keys in the file, the reference-count key included (torch counts it too)."""
        with self._lock, self._locked(False):
            return len(self._cache)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._poll(list(keys), self._timeout)

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError("multi_set: keys and values differ in length")
        data = b"".join(_record(_SET, "/" + k, to_bytes(v)) for k, v in zip(keys, values))
        with self._lock, self._locked(True) as fd:
            self._write(fd, data)

    def append(self, key: str, value: str | bytes) -> None:
        with self._lock, self._locked(True) as fd:
            old = self._cache.get("/" + key, b"")
            self._write(fd, _record(_SET, "/" + key, old + to_bytes(value)))

    def has_extended_api(self) -> bool:
        return True

    def clone(self) -> FileStore:
        store = FileStore(self._path, self._world_size)
        store.set_timeout(self._timeout)
        return store

    # -- lifetime -----------------------------------------------------------------------
    def _release(self) -> None:
        """Drop this instance's reference; the last of ``world_size`` removes the file."""
        if self._released:
            return
        self._released = True
        if not os.path.exists(self._path):
            return  # someone (a test's tmpdir cleanup, say) already removed it
        # A finalizer may run (via the GC) inside another FileStore's locked section on this
        # very file in this thread; waiting for that flock would deadlock, so wait briefly.
        with self._lock, self._locked(True, patience=0.2) as fd:
            finished = int(self._cache.get(_CLEANUP, b"0")) + 1
            refs = int(self._cache.get(_REFCOUNT, b"1")) - 1
            self._write(
                fd,
                _record(_SET, _CLEANUP, str(finished).encode())
                + _record(_SET, _REFCOUNT, str(refs).encode()),
            )
            if refs == 0 and self._world_size >= 0 and finished >= self._world_size:
                try:
                    os.remove(self._path)
                except OSError:
                    pass

    def __del__(self) -> None:
        try:
            self._release()
        except Exception:  # noqa: BLE001 - best effort, see below
            pass  # best effort: never raise from a finalizer

    def __repr__(self) -> str:
        return f"FileStore(path={self._path!r}, world_size={self._world_size})"
