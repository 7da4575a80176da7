"""A group's options, as torch's ``ProcessGroupGloo._Options``, and Gloo's ``create_device``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class Options:
    """Backend options as torch's ``ProcessGroupGloo._Options``: ``_timeout``, ``_devices``, ``_threads``."""

    def __init__(self, timeout: timedelta | float | None = None) -> None:
        self._timeout = timeout if timeout is not None else timedelta(minutes=30)
        self._devices: list[Any] = []
        self._threads = 2
        self.backend = "tcp"

    @classmethod
    def of(cls, options: Any) -> Options:
        """``options`` as pyc10d's own: another class's (torch's ``_Options``, a user's) gives
        its timeout, devices and threads to a new one, so every operation reads its timeout
        one way (``timeout_s``)."""
        if isinstance(options, Options):
            return options
        own = cls(getattr(options, "_timeout", None))
        own._devices = list(getattr(options, "_devices", []))
        own._threads = getattr(options, "_threads", own._threads)
        return own

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_timeout":
            if isinstance(value, (int, float)):
                value = timedelta(seconds=value)
            # In seconds too: every operation reads it (``Engine.timeout_s``).
            secs = value.total_seconds() if isinstance(value, timedelta) else None
            super().__setattr__("timeout_s", secs)
        super().__setattr__(name, value)


class DeviceSpec:
    """What ``create_device`` returns: Gloo's device, the interface or host a group should use.
    pyc10d's transports choose their addresses themselves (``transport/tcp/netif.py``), so it is
    kept, not used."""

    def __init__(self, interface: str | None = None, hostname: str | None = None) -> None:
        self.interface, self.hostname = interface, hostname


def create_device(interface: str | None = None, hostname: str | None = None, lazy_init: Any = None) -> DeviceSpec:
    """torch's ``ProcessGroupGloo.create_device`` (and an engine's, as torch's Gloo backend has)."""
    return DeviceSpec(interface, hostname)
