"""The watchdog's own failures: a group whose store stops answering is reported once, at
WARNING, instead of its stuck ranks going unreported without a word."""

from __future__ import annotations

import logging
import time

import pytest

from pyc10d.backends.watchdog import Watchdog


class _DeadStore:
    def set(self, key: str, value: str) -> None:
        raise ConnectionResetError("store server gone")


class _Engine:
    """What the watchdog reads of an engine: a rank whose progress changes every look."""

    group_name = "g0"

    def __init__(self) -> None:
        self.progress_store = _DeadStore()
        self.calls = 0

    def progress(self) -> tuple[int, ...]:
        self.calls += 1
        return (self.calls,)

    def running(self) -> None:
        return None

    def rank(self) -> int:
        return 0


@pytest.mark.timeout(20)
def test_store_failure_is_a_warning_once(monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PYC10D_STUCK_WARN_S", "0.1")  # the loop looks every 0.2 s
    wd, engine = Watchdog(), _Engine()
    with caplog.at_level(logging.DEBUG, logger="pyc10d"):
        wd.register(engine)
        deadline = time.monotonic() + 10
        while engine.calls < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        wd.unregister(engine)
    assert engine.calls >= 4, "the watchdog kept looking after the first failure"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    text = warnings[0].getMessage()
    assert "'g0'" in text and "ConnectionResetError" in text and "unreported" in text


def test_store_failure_of_a_destroyed_group_stays_quiet(caplog: pytest.LogCaptureFixture) -> None:
    wd, engine = Watchdog(), _Engine()  # never registered: as after destroy_process_group
    with caplog.at_level(logging.DEBUG, logger="pyc10d"):
        wd._store_failed(engine, ConnectionResetError("closed"))
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
