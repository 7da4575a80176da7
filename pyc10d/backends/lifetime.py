"""Groups that let go: a group object nobody holds any more shuts its engine down.

An engine is kept alive by its own threads (progress, receivers) and callbacks, so it never
dies with the last user reference the way a Gloo group does; a group dropped by reference
(torchft's wrapper sets ``self._pg = None`` after a failure) would otherwise keep its threads,
sockets and arena, and its peers would wait out their timeout. The native ``ProcessGroup`` and
the plugin's ``TorchProcessGroup`` register here when they are made.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any


def release_on_drop(owner: object, engine: Any) -> None:
    """Shut ``engine`` down when ``owner``, the group object users hold, is garbage.

    An engine is kept alive by its own threads (progress, receivers) and callbacks, so it
    never dies with the last user reference the way a Gloo group does; a group dropped by
    reference (torchft's wrapper sets ``self._pg = None`` after a failure) would otherwise
    keep its threads, sockets and arena, and its peers would wait out their timeout. The
    finalizer does what ``destroy_process_group`` does: ``shutdown``, which closes what the
    engine owns, so the peers raise "Connection closed by peer" at once. Not at interpreter
    exit (``atexit``): a process that ends closes everything anyway.
    """
    weakref.finalize(owner, _release, engine, os.getpid()).atexit = False


def _release(engine: Any, pid: int) -> None:
    # Only in the process that made the group: a forked child inherits the parent's objects
    # (and collects them), but not its threads, and its copies of the sockets and mappings are
    # the parent's connections: shutting them down there would break the parent's group, and
    # touching its arena crashed the child.
    if os.getpid() != pid:
        return
    # A pyc10d thread (progress, receiver) may drop the last reference (a Work's callback,
    # or a cycle collected mid-operation): ``shutdown`` joins those threads, so it runs on
    # a thread of its own there.
    if threading.current_thread().name.startswith("pyc10d-"):
        threading.Thread(target=_shutdown_quietly, args=(engine,), daemon=True,
                         name="pyc10d-release").start()
    else:
        _shutdown_quietly(engine)


def _shutdown_quietly(engine: Any) -> None:
    try:
        engine.shutdown()
    except Exception as e:  # noqa: BLE001 - a finalizer has no caller to raise to
        logging.getLogger("pyc10d").debug("pyc10d: releasing dropped group %r: %s",
                                          getattr(engine, "group_name", "?"), e)
