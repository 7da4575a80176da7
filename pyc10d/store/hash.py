"""In-process store: a dict guarded by one condition variable.

Used for single-process groups and for threads of one process standing in for ranks, so
blocking calls sleep on the condition (woken by every mutation) instead of polling.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta

from ..errors import DistStoreError
from .base import (
    STORE_DEFAULT_TIMEOUT,
    Store,
    queue_empty,
    resolve_timeout,
    timeout_seconds,
    to_bytes,
    wait_timeout_error,
)


class HashStore(Store):
    """Thread-safe in-memory key-value store (torch.distributed.HashStore)."""

    def __init__(self) -> None:
        super().__init__(STORE_DEFAULT_TIMEOUT)
        self._data: dict[str, bytes] = {}
        self._queues: dict[str, deque[bytes]] = {}
        self._cond = threading.Condition()

    def _wait_locked(self, keys: list[str], timeout: timedelta,
                     present: Callable[[str], bool] | None = None) -> None:
        """Block (holding the condition) until ``present`` holds for every key (default: the
        key is set) or the timeout expires."""
        if present is None:
            present = self._data.__contains__
        secs = timeout_seconds(timeout)
        deadline = None if secs is None else time.monotonic() + secs
        while not all(present(k) for k in keys):
            if deadline is None:
                self._cond.wait()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise wait_timeout_error([k for k in keys if not present(k)], timeout)
            self._cond.wait(left)

    def _queued(self, key: str) -> bool:
        return bool(self._queues.get(key))

    def _set_or_queued(self, key: str) -> bool:
        return key in self._data or self._queued(key)

    def set(self, key: str, value: str | bytes) -> None:
        with self._cond:
            self._data[key] = to_bytes(value)
            self._cond.notify_all()

    def get(self, key: str) -> bytes:
        with self._cond:
            self._wait_locked([key], self._timeout)
            return self._data[key]

    def add(self, key: str, amount: int) -> int:
        with self._cond:
            try:
                new = int(self._data.get(key, b"0")) + int(amount)
            except ValueError as e:
                raise DistStoreError(f"add: value of key {key!r} is not an integer") from e
            self._data[key] = str(new).encode()
            self._cond.notify_all()
            return new

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        expected, desired = to_bytes(expected_value), to_bytes(desired_value)
        with self._cond:
            current = self._data.get(key)
            if current is None:
                if expected != b"":
                    return expected
            elif current != expected:
                return current
            self._data[key] = desired
            self._cond.notify_all()
            return desired

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        with self._cond:
            self._wait_locked(list(keys), resolve_timeout(self._timeout, timeout), self._set_or_queued)

    def check(self, keys: list[str]) -> bool:
        with self._cond:
            return all(self._set_or_queued(k) for k in keys)

    def list_keys(self) -> list[str]:
        with self._cond:
            return list(self._data)

    def queue_push(self, key: str, value: str | bytes) -> None:
        with self._cond:
            self._queues.setdefault(key, deque()).append(to_bytes(value))
            self._cond.notify_all()

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        with self._cond:
            if block:
                self._wait_locked([key], self._timeout, self._queued)
            queue = self._queues.get(key)
            if not queue:
                raise queue_empty()
            value = queue.popleft()
            if not queue:
                del self._queues[key]
            return value

    def queue_len(self, key: str) -> int:
        with self._cond:
            return len(self._queues.get(key, ()))

    def delete_key(self, key: str) -> bool:
        with self._cond:
            return self._data.pop(key, None) is not None

    def num_keys(self) -> int:
        with self._cond:
            return len(self._data)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        with self._cond:
            self._wait_locked(list(keys), self._timeout)
            return [self._data[k] for k in keys]

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError("multi_set: keys and values differ in length")
        with self._cond:
            for k, v in zip(keys, values):
                self._data[k] = to_bytes(v)
            self._cond.notify_all()

    def append(self, key: str, value: str | bytes) -> None:
        with self._cond:
            self._data[key] = self._data.get(key, b"") + to_bytes(value)
            self._cond.notify_all()

    def has_extended_api(self) -> bool:
        return True

    def clone(self) -> HashStore:
        """The data lives in this object, so a clone is the same store."""
        return self
