"""The key-value store interface every rendezvous and process group builds on.

Values are bytes (a ``str`` is encoded as UTF-8 on the way in). Blocking calls
(``get``, ``wait``) fail after the store's timeout with a :class:`DistTimeoutError`
naming the missing key(s) and the timeout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from ..errors import DistStoreError, DistTimeoutError, QueueEmptyError
from ..types import DEFAULT_TIMEOUT

# torch's Store::kDefaultTimeout: concrete stores default to 300 s, not the 30 min PG default.
STORE_DEFAULT_TIMEOUT = timedelta(seconds=300)


class StoreTimeoutError(DistTimeoutError, DistStoreError):
    """A store wait ran out of time.

    Both a ``DistTimeoutError`` (our hierarchy) and a ``DistStoreError`` (what torch raises
    for store timeouts), so ``except`` clauses written for either keep working.
    """


def timeout_seconds(timeout: timedelta | None) -> float | None:
    """Seconds to wait, or ``None`` for "forever" (torch treats a zero timeout as kNoTimeout)."""
    if timeout is None:
        return None
    secs = timeout.total_seconds()
    return secs if secs > 0 else None


def resolve_timeout(store_timeout: timedelta, timeout: timedelta | None) -> timedelta:
    """A per-call timeout overrides the store's; ``None`` or a negative one (torch's "unset"
    sentinel) means "use the store's"."""
    if timeout is None or timeout.total_seconds() < 0:
        return store_timeout
    return timeout


def wait_timeout_error(keys: list[str], timeout: timedelta) -> StoreTimeoutError:
    """The error for a get/wait that expired; wording follows torch's TCPStore message."""
    ms = int(timeout.total_seconds() * 1000)
    return StoreTimeoutError(f"wait timeout after {ms}ms, keys: {', '.join(keys)}")


def store_chain(store: Any) -> Iterator[Any]:
    """``store`` and the stores under its prefixes, outermost first: every wrapper with an
    ``underlying_store`` (pyc10d's ``PrefixStore``, and torch's, for the plugin's adapter)."""
    while store is not None:
        yield store
        store = getattr(store, "underlying_store", None)


def to_bytes(value: str | bytes | bytearray | memoryview | list[int]) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class Store(ABC):
    """Abstract store with torch.distributed.Store's method names and semantics."""

    def __init__(self, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
        self._timeout = timeout

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout

    @abstractmethod
    def set(self, key: str, value: str | bytes) -> None: ...

    @abstractmethod
    def get(self, key: str) -> bytes: ...

    @abstractmethod
    def add(self, key: str, amount: int) -> int: ...

    @abstractmethod
    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes: ...

    @abstractmethod
    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None: ...

    @abstractmethod
    def check(self, keys: list[str]) -> bool: ...

    @abstractmethod
    def delete_key(self, key: str) -> bool: ...

    @abstractmethod
    def num_keys(self) -> int: ...

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        for k, v in zip(keys, values):
            self.set(k, v)

    def append(self, key: str, value: str | bytes) -> None:
        raise NotImplementedError(f"{type(self).__name__}.append")

    def has_extended_api(self) -> bool:
        return False

    def list_keys(self) -> list[str]:
        """Every key set (queues not included)."""
        raise NotImplementedError(f"{type(self).__name__}.list_keys")

    # Queues, as torch's: a queue lives beside the keys under its own name (``set`` and
    # ``get`` do not see it); ``check`` and ``wait`` count a non-empty queue as present.
    def queue_push(self, key: str, value: str | bytes) -> None:
        raise NotImplementedError("queue support is not implemented.")

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """The oldest value of the queue: waited for up to the store's timeout, or, with
        ``block=False``, ``QueueEmptyError`` when there is none."""
        raise NotImplementedError("queue support is not implemented.")

    def queue_len(self, key: str) -> int:
        raise NotImplementedError("queue support is not implemented.")

    def barrier(self, key: str, world_size: int, timeout: timedelta | None = None) -> None:
        """Return once ``world_size`` callers have entered the barrier ``key`` (one use per
        key); a timeout says how many had."""
        arrived = self.add(f"{key}/num_members", 1)
        if arrived == world_size:
            self.set(f"{key}/last_member", b"1")
        limit = resolve_timeout(self.timeout, timeout)
        try:
            self.wait([f"{key}/last_member"], limit)
        except DistTimeoutError as e:
            now = self.add(f"{key}/num_members", 0)
            raise StoreTimeoutError(f"store barrier {key!r}: {now} of {world_size} workers arrived "
                                    f"within {limit.total_seconds():g} s") from e


def queue_empty() -> QueueEmptyError:
    return QueueEmptyError("queue is empty")
