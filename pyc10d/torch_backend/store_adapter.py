"""torch's store seen through pyc10d's ``Store`` interface: what the plugin's groups meet through.

A module of its own so that every builder of a pyc10d group under torch (the plugin's
creators in ``__init__``, the Gloo stand-in in ``gloo_name``, torch 2.14's native backend)
imports it without importing the package that registers them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as tdist

from ..hostport import format_hostport
from ..store.base import Store, resolve_timeout, store_chain, wait_timeout_error


class TorchStoreAdapter(Store):
    """A torch ``Store`` (the group's ``PrefixStore``) seen through pyc10d's store interface.

    pyc10d's transports rendezvous through its own ``Store`` interface; torch's store has the
    same methods, and this adapter pins the one thing that differs: a ``wait`` that runs out of
    time raises pyc10d's ``StoreTimeoutError`` (a ``DistTimeoutError`` naming the keys) rather
    than torch's, so a rendezvous failure reads the same on either API.
    """

    def __init__(self, store: Any, timeout: timedelta) -> None:
        super().__init__(timeout)
        self.torch_store = store

    def _chain(self) -> Iterator[Any]:
        """The torch store and those under its prefixes, outermost first."""
        return store_chain(self.torch_store)

    @property
    def host(self) -> str | None:
        """The host of the ``TCPStore`` under torch's prefix stores, None for other stores.
        pyc10d's tcp transport advertises the address on the route towards it: without it, a
        rank would take the store for a local one and advertise loopback to other hosts."""
        return next((str(s.host) for s in self._chain() if getattr(s, "host", None)), None)

    @property
    def shared_file(self) -> bool:
        """Whether a torch ``FileStore`` is under the prefixes (see ``store.file.FileStore``)."""
        return any(isinstance(s, tdist.FileStore) for s in self._chain())

    def reconfigure_named(self) -> tuple[str, Store | None]:
        """The torch store under the prefixes that another process can reach (its ``TCPStore``
        or ``FileStore``), seen through an adapter, and how a reconfigure handle names it
        (``backends/reconfigure.py``); ("", None) when there is none."""
        for s in self._chain():
            if isinstance(s, tdist.TCPStore):
                return f"torch-tcp:{format_hostport(s.host, s.port)}", TorchStoreAdapter(s, self._timeout)
            if isinstance(s, tdist.FileStore):
                return f"torch-file:{s.path}", TorchStoreAdapter(s, self._timeout)
        return "", None

    def set(self, key: str, value: str | bytes) -> None:
        self.torch_store.set(key, value)

    def get(self, key: str) -> bytes:
        self.wait([key])
        return bytes(self.torch_store.get(key))

    def add(self, key: str, amount: int) -> int:
        return int(self.torch_store.add(key, amount))

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        return bytes(self.torch_store.compare_set(key, expected_value, desired_value))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        limit = resolve_timeout(self._timeout, timeout)
        try:
            self.torch_store.wait(list(keys), limit)
        except tdist.DistStoreError as e:
            if "timeout" not in str(e).lower():
                raise
            missing = [k for k in keys if not self.torch_store.check([k])]
            raise wait_timeout_error(missing or list(keys), limit) from e

    def check(self, keys: list[str]) -> bool:
        return bool(self.torch_store.check(list(keys)))

    def delete_key(self, key: str) -> bool:
        return bool(self.torch_store.delete_key(key))

    def num_keys(self) -> int:
        return int(self.torch_store.num_keys())

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.wait(keys)
        return [bytes(v) for v in self.torch_store.multi_get(list(keys))]
