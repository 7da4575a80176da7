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

from datetime import timedelta
from typing import Any

import torch.distributed as tdist

from ..backends import reconfigure as reconf
from ..hostport import split_hostport
from ..process_group import make_engine
from ..torch_version import plugin_refusal, require_plugin

# A torch without a name the plugin uses fails the imports below deep inside; refused instead
# with the torch version and every missing name (``torch_version.PLUGIN_NEEDS``).
try:
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
    from .store_adapter import TorchStoreAdapter
except (ImportError, AttributeError) as e:
    if plugin_refusal("import pyc10d.torch_backend") is None:
        raise
    raise ImportError(plugin_refusal("import pyc10d.torch_backend")) from e


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
    require_plugin("register its torch.distributed backends")
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
