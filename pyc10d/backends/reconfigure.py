"""Reconfigure's engine side: handles, the new rank order, the new engine (the public calls
are ``pyc10d/reconfigure.py``, the group's swap ``ProcessGroup.reconfigure``).

A group re-formed in place with a new set of peers is torch 2.14's experimental fault
tolerance (``dist._reconfigure``, which Gloo has there).

Each process asks its group for a handle (``_get_reconfigure_handle``), the peers exchange
the handles out of band (a store of their own, a file, their launcher), and each calls
``_reconfigure(uuid, handles)``: a list fixes the new ranks by position, a set lets pyc10d
choose (sorted order, the same on every peer). The group object stays: whatever holds it
(torch's registries, DDP, a user's variable) keeps working with it, now with a new engine,
rank and size. The old engine is aborted, not shut down: its peers may be dead.

A handle reads ``pyc10d:<token>:<store>``: ``token`` tells this process's group apart from
every other (fresh after each reconfigure), ``store`` says how to reach the store its group
met through (``tcp:host:port``, ``file:path``; the plugin's adds ``torch-tcp`` and
``torch-file``). The new group meets through the store of the first handle, under
``pyc10d-reconfigure/<uuid>/<handles>/``: the survivors' store (or a launcher's) when a survivor comes
first; a fresh ``uuid`` keeps one re-forming from meeting another's keys, and the handles are
in the prefix too (groups of other ranks re-formed under the same uuid never meet). A handle whose
store no other process can reach (a ``HashStore``) re-forms a group of one only.

Not a rendezvous of its own: what the peers exchange and when they call is the caller's, as
with Gloo; a peer that never calls makes the others fail at the group's timeout, naming the
keys they waited for.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

from ..hostport import format_hostport, split_hostport
from ..store import FileStore, HashStore, PrefixStore, Store, TCPStore
from ..store.base import store_chain
from .lifetime import abort_aside, release_on_drop

PREFIX = "pyc10d"

#: How a store kind named in a handle is opened: ``OPENERS[kind](rest, timeout)``.
OPENERS: dict[str, Callable[[str, timedelta], Store]] = {
    "tcp": lambda where, timeout: TCPStore(*split_hostport(where), is_master=False, timeout=timeout),
    "file": lambda path, timeout: FileStore(path),
}
#: What builds an engine: ``process_group.make_engine``'s signature (passed in: that module
#: holds groups, and a group calls this one).
MakeEngine = Callable[[str, Store, int, int, timedelta, str], Any]


def _named(store: Store | None) -> tuple[str, Store | None]:
    """The first store under ``store``'s prefixes that another process can reach, and how it
    is named; ("", None) when none can."""
    for s in store_chain(store):
        if isinstance(s, TCPStore):
            return f"tcp:{format_hostport(s.host, s.port)}", s
        if isinstance(s, FileStore):
            return f"file:{s.path}", s
        named = getattr(s, "reconfigure_named", None)
        if named is not None:
            return named()
    return "", None


def store_spec(store: Store | None) -> str:
    """How another process reaches ``store``, or "" when none can."""
    return _named(store)[0]


def new_handle(store: Store | None) -> str:
    """A fresh handle for a group that met through ``store``."""
    return f"{PREFIX}:{os.getpid()}-{os.urandom(6).hex()}:{store_spec(store)}"


def order(handles: Collection[str], mine: str) -> list[str]:
    """The peers in their new rank order (a list as given, a set sorted), checked: pyc10d's
    handles, each once, this process's among them."""
    if isinstance(handles, str) or not isinstance(handles, Collection):
        raise TypeError(f"reconfigure: handles must be a list or a set of handles, not {type(handles).__name__}")
    ordered = list(handles) if isinstance(handles, (list, tuple)) else sorted(handles)
    if not ordered:
        raise ValueError("reconfigure: no handles (a group needs at least this process's)")
    foreign = [h for h in ordered if not (isinstance(h, str) and h.startswith(PREFIX + ":"))]
    if foreign:
        raise ValueError(f"reconfigure: {foreign[0]!r} is not a pyc10d handle (from _get_reconfigure_handle)")
    if len(set(ordered)) != len(ordered):
        raise ValueError("reconfigure: a handle appears twice among the handles")
    if mine not in ordered:
        raise ValueError(f"reconfigure: this process's handle {mine!r} is not among the {len(ordered)} handles")
    return ordered


def build(make: MakeEngine, kind: str, handles: Collection[str], mine: str, uuid: int, timeout: timedelta,
          name: str, own: Store | None = None) -> tuple[Any, int, int, Store]:
    """The new engine of a group re-formed from ``handles`` (``order``'s rules) as backend
    ``kind``, made by ``make``: it meets its peers through the first handle's store (``own``'s,
    the group's present store, when it is that one: no new connection). Returns (engine, rank,
    size, the store it met through: the group's from now on)."""
    ordered = order(handles, mine)
    rank, size = ordered.index(mine), len(ordered)
    spec = ordered[0].split(":", 2)[2]
    own_spec, own_store = _named(own)
    if own_store is not None and (own_spec == spec or size == 1):
        store: Store = own_store
    elif size == 1:
        store = HashStore()
    elif not spec:
        raise ValueError("reconfigure: the first handle names no store other processes can reach "
                         "(its group met through a HashStore): put another process's handle first")
    else:
        kind_of_store, _, where = spec.partition(":")
        opener = OPENERS.get(kind_of_store)
        if opener is None:
            raise ValueError(f"reconfigure: cannot open the store {spec!r} of the first handle here")
        store = opener(where, timeout)
    # Under the uuid and the handles: groups of other ranks re-formed with the same uuid (one per
    # local rank under torchft) never meet each other's keys.
    which = hashlib.sha1("\n".join(ordered).encode()).hexdigest()[:16]
    meeting = PrefixStore(f"pyc10d-reconfigure/{uuid}/{which}/", store)
    return make(kind, meeting, rank, size, timeout, name), rank, size, meeting


def reform(owner: object, old: Any, make: MakeEngine, kind: str, opts: Any, mine: str, name: str,
           own: Store | None) -> tuple[Any, int, int, Store]:
    """The new engine of ``owner``'s group (``opts``: torch's ``ReconfigureOptions`` or
    pyc10d's), built by ``build``; ``old`` is retired: the new engine shuts down with ``owner``
    (``release_on_drop``), the old one is aborted on a thread of its own (its peers may be
    dead). The group classes swap their own fields."""
    built = build(make, kind, opts.handles, mine, opts.uuid, timeout_of(opts, old.options.timeout), name, own)
    release_on_drop(owner, built[0])
    abort_aside(old)
    return built


def timeout_of(opts: Any, default: timedelta) -> timedelta:
    """``opts.timeout`` when it names one (torch's options hold a negative one when unset)."""
    t = getattr(opts, "timeout", None)
    return t if isinstance(t, timedelta) and t.total_seconds() > 0 else default
