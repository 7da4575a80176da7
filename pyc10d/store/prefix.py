"""A namespaced view of another store.

Process groups share one rendezvous store; each group (and each sub-step inside it) wraps it
in a PrefixStore so their keys cannot collide. Every key becomes ``prefix + "/" + key``.
"""

from __future__ import annotations

from datetime import timedelta

from .base import Store, to_bytes


class PrefixStore(Store):
    """torch.distributed.PrefixStore: forwards every call with keys put under ``prefix/``."""

    def __init__(self, prefix: str, store: Store) -> None:
        if store is None:
            raise ValueError("PrefixStore needs an underlying store, got None")
        self._prefix = prefix
        self._store = store
        # Timeout lives in the underlying store (torch forwards get/setTimeout too).

    def _k(self, key: str) -> str:
        return f"{self._prefix}/{key}"

    @property
    def underlying_store(self) -> Store:
        return self._store

    @property
    def _underlying_non_prefix_store(self) -> Store:
        """The first store below any number of nested PrefixStores."""
        store: Store = self._store
        while isinstance(store, PrefixStore):
            store = store.underlying_store
        return store

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def timeout(self) -> timedelta:
        return self._store.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._store.set_timeout(timeout)

    def set(self, key: str, value: str | bytes) -> None:
        self._store.set(self._k(key), value)

    def get(self, key: str) -> bytes:
        return self._store.get(self._k(key))

    def add(self, key: str, amount: int) -> int:
        return self._store.add(self._k(key), amount)

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        return self._store.compare_set(self._k(key), expected_value, desired_value)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._store.wait([self._k(k) for k in keys], timeout)

    def check(self, keys: list[str]) -> bool:
        return self._store.check([self._k(k) for k in keys])

    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(self._k(key))

    def num_keys(self) -> int:
        """Counts the whole underlying store, not just this prefix (as torch does)."""
        return self._store.num_keys()

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._store.multi_get([self._k(k) for k in keys])

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        self._store.multi_set([self._k(k) for k in keys], values)

    def append(self, key: str, value: str | bytes) -> None:
        if self._store.has_extended_api():
            self._store.append(self._k(key), value)
            return
        # Fallback for stores without append: a compare_set loop starting from the current
        # value (torch starts from b"", which silently no-ops when the value equals ``value``).
        suffix, k = to_bytes(value), self._k(key)
        current = self._store.get(k) if self._store.check([k]) else b""
        while True:
            desired = current + suffix
            got = self._store.compare_set(k, current, desired)
            if got == desired:
                return
            # compare_set hands back ``expected`` only when the key is missing.
            current = b"" if got == current else got

    def list_keys(self) -> list[str]:
        head = self._k("")
        return [k[len(head):] for k in self._store.list_keys() if k.startswith(head)]

    def queue_push(self, key: str, value: str | bytes) -> None:
        self._store.queue_push(self._k(key), value)

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        return self._store.queue_pop(self._k(key), block)

    def queue_len(self, key: str) -> int:
        return self._store.queue_len(self._k(key))

    def has_extended_api(self) -> bool:
        return self._store.has_extended_api()

    def clone(self) -> PrefixStore:
        clone = getattr(self._store, "clone", None)
        return PrefixStore(self._prefix, clone() if clone is not None else self._store)
