"""``python -m pyc10d.info``: every field is measured on this machine, none made up."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pyc10d
from pyc10d import info
from pyc10d.transport.shm import segment as shm_segment

ROOT = Path(__file__).resolve().parents[1]


# The two runs with torch's autoload on and off need interpreters of their own (it acts when
# torch is imported). The TLS states do not: info reads the environment when it is called, as
# a rank does, so make test reads them in this process ("here"); make test-full, from the
# command as well ("command"), two more interpreters.
@pytest.mark.interpreters
@pytest.mark.timeout(60)
@pytest.mark.parametrize("tls_from", ["here", pytest.param("command", marks=pytest.mark.full)])
def test_the_command_reports_this_install(tls_from: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYC10D_AUTH_TOKEN": "s3cret-value", "PYC10D_STUCK_WARN_S": "7"}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    out = subprocess.run([sys.executable, "-m", "pyc10d.info", "--json"], env=env, capture_output=True,
                         text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert "s3cret-value" not in out.stdout  # the secret's presence is reported, never its value
    got = json.loads(out.stdout)
    assert got["versions"]["torch"] == torch.__version__
    assert got["versions"]["pyc10d"] == pyc10d.__version__
    assert Path(got["versions"]["pyc10d_path"]) == Path(pyc10d.__file__).parent
    assert got["torch_backends"]["registered"] == {"pyc10d": True, "pyc10d_shm": True, "pyc10d_tcp": True}
    assert got["torch_backends"]["entry_point"] == "_pyc10d_autoload:register"
    assert got["torch_backends"]["entry_point_loaded"] is True  # import torch ran the autoload hook
    assert got["security"]["auth_token_set"] is True
    assert got["security"]["variables"]["PYC10D_AUTH_TOKEN"] == "<set>"
    assert got["security"]["variables"]["PYC10D_STUCK_WARN_S"] == "7"
    assert got["security"]["tls"] == {"state": "off"}
    assert got["security"]["peer_timeout_s"] == 15.0 and got["security"]["bind"] == "auto"

    def info_with(extra: dict[str, str], *args: str) -> str:
        """What ``python -m pyc10d.info *args`` prints with ``extra`` in its environment."""
        if tls_from == "command":
            return subprocess.run([sys.executable, "-m", "pyc10d.info", *args], capture_output=True, text=True,
                                  timeout=50, env={**env, **extra}).stdout
        with monkeypatch.context() as m:
            for name, value in {**env, **extra}.items():
                m.setenv(name, value)
            capsys.readouterr()
            assert info.main(list(args)) == 0
            return capsys.readouterr().out

    half = info_with({"PYC10D_TLS_CERT": __file__, "PYC10D_TLS_CA": "/nonexistent/ca.pem",
                      "PYC10D_PEER_TIMEOUT_S": "0"}, "--json")
    sec = json.loads(half)["security"]
    assert sec["tls"]["state"] == "refused" and "PYC10D_TLS_KEY" in sec["tls"]["error"], sec  # as a rank would
    assert sec["peer_timeout_s"] is None
    full = info_with({"PYC10D_TLS_CERT": __file__, "PYC10D_TLS_KEY": __file__, "PYC10D_TLS_CA": "/nonexistent/ca.pem"})
    assert "tls         on: mutual TLS" in full and "MISSING files: PYC10D_TLS_CA" in full, full
    text = subprocess.run([sys.executable, "-m", "pyc10d.info"], env={**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
                          capture_output=True, text=True, timeout=50)
    assert text.returncode == 0, text.stderr
    # autoload off: torch never loaded the entry point, and nothing imported pyc10d.torch_backend
    assert "autoload off" in text.stdout and "not loaded" in text.stdout, text.stdout
    assert "torch sees  pyc10d NO, pyc10d_shm NO, pyc10d_tcp NO" in text.stdout, text.stdout
    assert f"torch       {torch.__version__}" in text.stdout


def test_the_shm_probe_creates_and_removes_a_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []
    real = shm_segment.Segment

    class Watched(real):  # type: ignore[misc, valid-type]
        def close(self) -> None:
            seen.append((self.name, os.path.exists(os.path.join(shm_segment.SHM_DIR, self.name))))
            super().close()

    monkeypatch.setattr(shm_segment, "Segment", Watched)
    got = info.shared_memory()
    assert got["works"] is True, got
    assert seen == [(got["probe"], True)]  # it existed in /dev/shm while open ...
    assert not os.path.exists(os.path.join(shm_segment.SHM_DIR, got["probe"]))  # ... and is gone
    st = os.statvfs(shm_segment.SHM_DIR)
    assert got["size_bytes"] == st.f_blocks * st.f_frsize > 0


def test_the_shm_probe_says_when_shm_cannot_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(shm_segment, "SHM_DIR", str(tmp_path / "missing"))
    got = info.shared_memory()
    assert got["works"] is False and "FileNotFoundError" in got["error"], got


@pytest.mark.parametrize("master", [None, "192.0.2.77"])
def test_the_advertised_address_is_one_this_machine_has(monkeypatch: pytest.MonkeyPatch, master: str | None) -> None:
    monkeypatch.delenv("PYC10D_SOCKET_ADDR", raising=False)
    monkeypatch.delenv("PYC10D_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    if master is None:
        monkeypatch.delenv("MASTER_ADDR", raising=False)
    else:
        monkeypatch.setenv("MASTER_ADDR", master)
    got = info.network()
    names = {name for _, name in socket.if_nameindex()}
    assert got["interface"] in names, got
    for addr in (got["advertised"], got["file_store_advertised"]):
        with socket.socket() as s:
            s.bind((addr, 0))  # only an address of this machine can be bound
    if master is None:
        assert got["advertised"] == "127.0.0.1" and got["store_host"] == "127.0.0.1"
    else:
        assert got["store_host"] == master


def test_a_chosen_interface_and_a_refusal_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYC10D_SOCKET_ADDR", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("PYC10D_SOCKET_IFNAME", "lo")
    got = info.network()
    assert (got["advertised"], got["interface"]) == ("127.0.0.1", "lo")
    # loopback towards a store on another host is refused: info shows the rank's error, no guess
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.77")
    got = info.network()
    assert got["advertised"] is None and "loopback" in got["error"] and "192.0.2.77" in got["error"], got
