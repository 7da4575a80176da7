"""One-sided windows: torch 2.14's ``dist._supports_window`` / ``dist._new_window`` and the
``Window`` they make, on pyc10d's own API and (``torch_backend``) through the plugin.

Which groups have them, and how the bytes move (``kind_of``):

* shm (one host): ``mapped.py``, every rank maps every registered tensor; ``map_remote_tensor``
  gives a peer's tensor itself;
* tcp and threaded: ``messages.py``, a put is a message the target's receiving thread writes
  into its tensor; ``map_remote_tensor`` maps the caller's own rank only;
* hier (shm within hosts, tcp between their leaders) and fake: none (``_supports_window`` is
  False and ``_new_window`` says "does not support new_window", as Gloo does): hier has no
  connection between two ranks of different hosts that are not leaders.

What every window promises, and how wrong use is refused: ``base.py``.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import process_group
from ..backends.shm import ShmBackend
from ..backends.tcp import TCPBackend
from ..backends.threaded import ThreadedBackend
from ..groups import member_group
from .base import Window, WindowAccessType, WindowAttr
from .mapped import MappedWindow
from .messages import MessageWindow

__all__ = ["Window", "WindowAccessType", "WindowAttr", "_new_window", "_supports_window", "kind_of",
           "new_window", "supports"]


def kind_of(engine: Any) -> type[Window] | None:
    """The kind of window ``engine``'s group gets, or None."""
    if isinstance(engine, ShmBackend):
        return MappedWindow
    if isinstance(engine, (TCPBackend, ThreadedBackend)) and hasattr(engine.transport, "mailbox"):
        return MessageWindow
    return None


def supports(engine: Any) -> bool:
    return kind_of(engine) is not None


def new_window(engine: Any, tensor: torch.Tensor | None = None, label: str | None = None) -> Window:
    """A new window on ``engine``'s group (collective), ``tensor`` registered if given; the
    refusal names the group's backend as ``label`` (default: the engine's name)."""
    kind = kind_of(engine)
    if kind is None:
        raise RuntimeError(f"Backend {label or engine.backend_name} does not support new_window")
    window = kind(engine)
    if tensor is not None:
        window.tensor_register(tensor)
    return window


def _supports_window(group: Any = None) -> bool:
    """Whether ``group`` (default: the default group) makes one-sided windows."""
    return bool(member_group(group).supports_window)


def _new_window(tensor: torch.Tensor | None = None, group: Any = None) -> Window:
    """A one-sided window on ``group`` (collective: every rank calls it, in the same order),
    with ``tensor`` registered when given (else ``tensor_register`` later, collective too)."""
    return member_group(group).new_window(tensor)


process_group.serve_windows(supports, new_window)
