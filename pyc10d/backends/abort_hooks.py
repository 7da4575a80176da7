"""Abort hooks: callables an engine runs once, when its group aborts.

torch 2.14's ``Backend.register_abort_hook(id, fn)`` asks a backend to call ``fn()`` when it
aborts, so that code above it (a fault-tolerance manager, a trainer's watchdog) learns of the
failure without polling. A pyc10d group aborts in one place, ``EngineCore.fail_group``: on
``abort()`` and on the first failed operation (a lost peer, a timeout, a mismatch), so the
hooks run there, once, on the thread that aborted it. A hook that raises is logged and the
others still run: the abort itself must complete.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("pyc10d")


class AbortHooks:
    """The abort hooks of one engine, by id (a second hook with an id replaces the first;
    removing an unknown id does nothing, as torch's table does).

    They live in the instance's ``__dict__`` under ``_abort_hooks``, made on the first
    registration (most groups never have one) and taken whole by one ``dict.pop``: each step
    is one dictionary operation, atomic under the GIL, so no lock (that a fork could leave
    held) is needed for "run once" when two threads abort the group together."""

    def register_abort_hook(self, hook_id: int, hook: Callable[[], None]) -> None:
        """Call ``hook()`` once when this group aborts (``abort()`` or a failed operation)."""
        if not callable(hook):
            raise TypeError(f"register_abort_hook: hook {hook_id} is a {type(hook).__name__}, not a callable")
        self.__dict__.setdefault("_abort_hooks", {})[int(hook_id)] = hook

    def unregister_abort_hook(self, hook_id: int) -> None:
        self.__dict__.get("_abort_hooks", {}).pop(int(hook_id), None)

    def take_abort_hooks(self) -> dict[int, Callable[[], None]]:
        """Remove and return every hook (an engine replaced in place hands them to its heir)."""
        return self.__dict__.pop("_abort_hooks", None) or {}

    def adopt_abort_hooks(self, hooks: dict[int, Callable[[], None]]) -> None:
        """Take on the hooks another engine gave up (``take_abort_hooks``)."""
        if hooks:
            self.__dict__.setdefault("_abort_hooks", {}).update(hooks)

    def _run_abort_hooks(self, group_name: str, rank: int) -> None:
        """Run each hook once (they are removed first: a second abort finds none)."""
        for hook_id, hook in self.take_abort_hooks().items():
            try:
                hook()
            except Exception:  # the abort goes on; the hook's failure is told
                log.exception("pyc10d: abort hook %d of group %r raised on rank %d", hook_id, group_name, rank)
