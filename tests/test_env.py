"""``pyc10d.env``: numeric ``PYC10D_*`` settings read one way, a bad one named."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pyc10d.env import env_bytes, env_float, env_int, parse_size


def test_byte_counts_take_the_documented_units(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, want in (("1048576", 1 << 20), ("256K", 256 << 10), ("1M", 1 << 20), ("1MiB", 1 << 20),
                      (" 4kb ", 4 << 10), ("2G", 2 << 30)):
        monkeypatch.setenv("SOME_TEST_BYTES", raw)
        assert env_bytes("SOME_TEST_BYTES", 7) == want, raw
    for raw in ("", "  "):
        monkeypatch.setenv("SOME_TEST_BYTES", raw)
        assert env_bytes("SOME_TEST_BYTES", 7) == 7
    monkeypatch.delenv("SOME_TEST_BYTES")
    assert env_bytes("SOME_TEST_BYTES", 7) == 7
    assert parse_size("64M") == 64 << 20


@pytest.mark.parametrize(("fn", "raw", "says"), [
    (env_bytes, "1x", "expected a byte count such as 1048576, 256K or 1M"),
    (env_bytes, "-4", "expected a byte count"),
    (env_int, "2k", "expected a whole number"),
    (env_float, "fast", "expected a number"),
])
def test_a_bad_value_is_named(fn, raw: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_TEST_SETTING", raw)
    with pytest.raises(ValueError, match=rf"^SOME_TEST_SETTING='{raw}': {says}"):
        fn("SOME_TEST_SETTING", 1)


def test_the_settings_read_through_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyc10d.backends import shm
    from pyc10d.transport.shm.arena import caller_spin
    from pyc10d.transport.tcp.owner import spin_seconds, spin_yields

    monkeypatch.setattr(shm, "SLOT_BYTES", None)
    monkeypatch.setenv("PYC10D_SHM_SLOT_BYTES", "256K")
    assert shm.slot_bytes(2) == 256 << 10
    monkeypatch.setenv("PYC10D_SHM_SLOT_BYTES", "1M")  # failed with a bare int() complaint before
    assert shm.slot_bytes(2) == 1 << 20
    monkeypatch.setenv("PYC10D_SHM_SLOT_BYTES", "lots")
    with pytest.raises(ValueError, match="PYC10D_SHM_SLOT_BYTES='lots'"):
        shm.slot_bytes(2)
    monkeypatch.setenv("PYC10D_TCP_SPIN_US", "-5")  # as before: none
    assert spin_seconds(2, 2) == 0.0
    monkeypatch.setenv("PYC10D_TCP_SPIN_US", "250")
    assert spin_seconds(2, 2) == pytest.approx(250e-6)
    monkeypatch.delenv("PYC10D_TCP_SPIN_US")
    assert spin_seconds(2, 2) == 1e-3 and spin_seconds(4, 2) == pytest.approx(200e-6)
    assert not spin_yields(2, 2) and spin_yields(4, 2)  # more ranks than CPUs: give the CPU away
    monkeypatch.setenv("PYC10D_SHM_CALLER_SPIN_US", "1 ms")
    with pytest.raises(ValueError, match="PYC10D_SHM_CALLER_SPIN_US='1 ms': expected a number of microseconds"):
        caller_spin(1)


@pytest.mark.timeout(60)
def test_a_bad_setting_read_at_import_names_itself() -> None:
    env = {**os.environ, "PYC10D_SEGMENT_BYTES": "big"}
    proc = subprocess.run([sys.executable, "-c", "import pyc10d"], env=env, capture_output=True, text=True,
                          timeout=50)
    assert proc.returncode != 0
    assert "ValueError: PYC10D_SEGMENT_BYTES='big': expected a byte count" in proc.stderr, proc.stderr[-2000:]
