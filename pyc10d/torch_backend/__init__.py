"""pyc10d behind ``torch.distributed``: ``import pyc10d.torch_backend`` and torch programs run on it.

Importing this module registers three backends with ``torch.distributed.Backend``:

* ``"pyc10d"``: pyc10d's ``auto`` (shm on one host, hier across hosts, else tcp);
* ``"pyc10d_shm"``: shared memory between the ranks of one host;
* ``"pyc10d_tcp"``: TCP connections between the ranks (multi-host capable).

An unchanged torch program then runs on pyc10d with one line changed::

    import pyc10d.torch_backend  # noqa: F401
    torch.distributed.init_process_group("pyc10d_shm", ...)

torch builds the group's ``TorchProcessGroup`` (``group.py``) through ``_create``, and from
then on torch's own collectives, DDP, DTensor and FSDP2 call into it; pyc10d's engine moves
the bytes and reports failures in its own words. Only CPU tensors (``devices=["cpu"]``).

``serve_gloo()`` (or ``PYC10D_SERVE_GLOO=1``, which torch's autoload applies at ``import
torch``) also makes pyc10d serve torch's own name ``"gloo"``, for frameworks that accept no
other (``gloo_name.py``). Importing this module never does that by itself; it only warns when
the setting is set where it cannot act (torch's autoload off).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as tdist

from ..backends import reconfigure as reconf
from ..hostport import format_hostport, split_hostport
from ..process_group import make_engine
from ..store.base import Store, resolve_timeout, store_chain, wait_timeout_error
from .gloo_name import (
    GlooServedGroup,
    autoload_off,
    gloo_served_by,
    serve_gloo,
    stop_serving_gloo,
    warn_if_not_acting,
)
from .group import BACKENDS, TorchProcessGroup, TorchWork
from .shrink import install as install_shrink


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


def _creator(backend_name: str) -> Any:
    """torch's extended-API creator for one of our names: it passes the group's name and
    global ranks too, so pyc10d's error messages can name the group."""

    def create(dist_opts: Any, backend_options: Any = None) -> TorchProcessGroup:
        timeout = dist_opts.timeout
        store = TorchStoreAdapter(dist_opts.store, timeout)
        rank, size = dist_opts.group_rank, dist_opts.group_size
        name = str(dist_opts.group_id) or backend_name
        engine = make_engine(BACKENDS[backend_name], store, rank, size, timeout, name)
        return TorchProcessGroup(engine, rank, size, backend_name, store)

    create.__name__ = f"create_{backend_name}"
    return create


def register() -> None:
    """Register pyc10d's names with torch (done on import; calling it again is harmless)."""
    for name in BACKENDS:
        if name.upper() not in tdist.Backend._plugins:
            tdist.Backend.register_backend(name, _creator(name), extended_api=True, devices=["cpu"])


def _open_torch_tcp(where: str, timeout: timedelta) -> TorchStoreAdapter:
    host, port = split_hostport(where)
    return TorchStoreAdapter(tdist.TCPStore(host, port, is_master=False, timeout=timeout), timeout)


reconf.OPENERS["torch-tcp"] = _open_torch_tcp
reconf.OPENERS["torch-file"] = lambda path, timeout: TorchStoreAdapter(tdist.FileStore(path), timeout)
register()
install_shrink()
if autoload_off():  # (with it on, the autoload applies PYC10D_SERVE_GLOO, or warns why not)
    warn_if_not_acting()

__all__ = ["BACKENDS", "GlooServedGroup", "TorchProcessGroup", "TorchStoreAdapter", "TorchWork", "gloo_served_by",
           "register", "serve_gloo", "stop_serving_gloo"]
