"""``FakeStore``: the store to hand ``init_process_group(backend="fake", ...)``.

The fake backend never talks to its store; any store would do (torch's tests also pass a
``HashStore``). This one is an in-memory store, so code that does use it still works.
"""

from __future__ import annotations

from pyc10d.store import HashStore


class FakeStore(HashStore):
    """A key-value store only meant to initialise a fake process group."""


__all__ = ["FakeStore"]
