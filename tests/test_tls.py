"""``PYC10D_TLS_CERT`` / ``_KEY`` / ``_CA``: mutual TLS on every store and peer connection.

Certificates are made at test time with the ``openssl`` command (installed with apt-get if
missing): two throwaway CAs, each with one certificate for the ranks. Checked: collectives
over TLS (alone and with ``PYC10D_AUTH_TOKEN``); a certificate from another CA refused on
both sides, quickly, in words naming TLS and the certificate; and no payload byte in clear on
the wire (tcpdump on ``lo``, the same run without TLS as the control that the sniffing works).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from _multirank import run_ranks

import pyc10d as dist
from pyc10d import auth, tls
from pyc10d.store import TCPStore

#: The timeout of a store client or group whose peer refuses its certificate: it must fail well
#: before it (a third of it), which a machine 3x slower than the 2-core VM (refusals in well under
#: a second there) stays far under.
REFUSED_TIMEOUT_S = 30


def _have(tool: str) -> bool:
    if shutil.which(tool) is None and os.geteuid() == 0:
        subprocess.run(f"command -v {tool} || apt-get install -y {tool} || "
                       f"(apt-get update && apt-get install -y {tool})", shell=True, capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return shutil.which(tool) is not None


def _ca(d: Path) -> dict[str, str]:
    d.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = {"check": True, "capture_output": True, "cwd": d}
    subprocess.run(["openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
                    "-subj", "/CN=pyc10d test CA"], **run)
    subprocess.run(["openssl", "req", *ec, "-keyout", "rank.key", "-out", "rank.csr", "-subj", "/CN=rank"], **run)
    subprocess.run(["openssl", "x509", "-req", "-in", "rank.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-out", "rank.pem", "-days", "1"], **run)
    return {tls.ENV_CERT: str(d / "rank.pem"), tls.ENV_KEY: str(d / "rank.key"), tls.ENV_CA: str(d / "ca.pem")}


@pytest.fixture(scope="module")
def cas(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, str]]:
    """Two unrelated CAs' environments (cert, key, CA), ``a`` and ``b``."""
    if not _have("openssl"):
        pytest.skip("the openssl command cannot be installed here")
    root = tmp_path_factory.mktemp("tls")
    return _ca(root / "a"), _ca(root / "b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collectives(rank: int, ws: int, port: int, envs: dict[int, dict[str, str]], payload: bytes) -> list:
    os.environ.update(envs.get(rank, {}))
    dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ws,
                            timeout=timedelta(seconds=20))
    out = []
    for n in (1, 3000, 1 << 18):  # small frames, one header + payload, several chunks
        t = torch.full((n,), float(rank + 1))
        dist.all_reduce(t)
        out.append(t[0].item())
    marked = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if rank == 0 else torch.zeros(len(payload),
                                                                                                    dtype=torch.uint8)
    dist.broadcast(marked, src=0)
    store = dist._get_default_store()
    if rank == 0:
        store.set("marker", payload)
    dist.barrier()
    if rank == 1:
        assert store.get("marker") == payload
    dist.barrier()  # rank 0's server stays up for that get
    out.append(bytes(marked.numpy()) == payload)
    kinds = sorted({type(s).__name__ for s in dist.group.WORLD.transport.socks if s is not None})
    return out + kinds


@pytest.mark.timeout(45)
@pytest.mark.parametrize("token", [None, "tls and token"])
def test_collectives_over_tls(monkeypatch, cas, token: str | None) -> None:
    """Three ranks rendezvous over a TLS TCPStore and run collectives over TLS connections."""
    for k, v in cas[0].items():
        monkeypatch.setenv(k, v)
    if token:
        monkeypatch.setenv(auth.ENV, token)
    res = run_ranks("unused", 3, _collectives, free_port(), {}, b"x" * 64, init=False, timeout=40)
    assert res == [[6.0, 6.0, 6.0, True, "TLSSocket"]] * 3


def test_partial_configuration_is_refused(monkeypatch, cas) -> None:
    monkeypatch.setenv(tls.ENV_CERT, cas[0][tls.ENV_CERT])
    monkeypatch.delenv(tls.ENV_KEY, raising=False)
    monkeypatch.delenv(tls.ENV_CA, raising=False)
    with pytest.raises(tls.TLSError, match="PYC10D_TLS_KEY, PYC10D_TLS_CA not set"):
        TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))


@pytest.mark.timeout(30)
def test_store_refuses_a_certificate_of_another_ca(monkeypatch, cas, caplog) -> None:
    """Either side's certificate from the wrong CA: both sides say so, at once."""
    a, b = cas
    for k, v in a.items():
        monkeypatch.setenv(k, v)
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    master.set("k", "v")
    start = time.monotonic()
    for k, v in b.items():  # wholly the other CA: this client refuses the server's certificate
        monkeypatch.setenv(k, v)
    with pytest.raises(tls.CertificateRefused, match="TLS handshake failed: the peer's certificate is not signed"):
        TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=REFUSED_TIMEOUT_S))
    monkeypatch.setenv(tls.ENV_CA, a[tls.ENV_CA])  # trusts the server, but its own cert is b's
    with pytest.raises(tls.CertificateRefused, match="TLS handshake failed: the peer refused this side's certificate"):
        TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=REFUSED_TIMEOUT_S))
    assert time.monotonic() - start < REFUSED_TIMEOUT_S / 3  # at once, not after a timeout
    for k, v in a.items():
        monkeypatch.setenv(k, v)
    assert TCPStore("127.0.0.1", master.port, timeout=timedelta(seconds=10)).get("k") == b"v"
    deadline = time.monotonic() + 5
    while len([r for r in caplog.messages if "TLS handshake failed" in r]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    refused = [r for r in caplog.messages if "refused the connection" in r and "TLS handshake failed" in r]
    assert len(refused) == 2, caplog.messages
    assert any("refused this side's certificate" in r for r in refused), refused
    assert any("the peer's certificate is not signed by PYC10D_TLS_CA" in r for r in refused), refused


def _peer_with_another_ca(rank: int, ws: int, store_path: str, envs: dict[int, dict[str, str]]) -> str:
    os.environ.update(envs[rank])
    dist.init_process_group("tcp", store=dist.FileStore(store_path, ws), rank=rank, world_size=ws,
                            timeout=timedelta(seconds=REFUSED_TIMEOUT_S))
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
    except Exception as e:  # noqa: BLE001 - the error is the result
        return f"{time.monotonic() - start:.1f} {e}"
    return "no error"


@pytest.mark.timeout(40)
def test_transport_refuses_a_peer_of_another_ca(cas, tmp_path: Path) -> None:
    """Rank 1 holds another CA's certificate (and trusts only that CA): both ranks' first
    collective fails within seconds, each naming TLS and the certificate."""
    res = run_ranks("unused", 2, _peer_with_another_ca, str(tmp_path / "store"), {0: cas[0], 1: cas[1]},
                    init=False, timeout=35)
    for r in res:
        took, _, error = r.partition(" ")
        assert float(took) < REFUSED_TIMEOUT_S / 3, res  # at once, not after the group's timeout
        assert "TLS handshake failed" in error and "certificate" in error, res


def _sniff(cas, tmp_path: Path, use_tls: bool) -> tuple[bytes, bytes]:
    """A 2-rank run that broadcasts (and stores) a marker, captured on ``lo``: the capture."""
    pcap = tmp_path / f"lo-{use_tls}.pcap"
    dump = subprocess.Popen(["tcpdump", "-i", "lo", "-U", "-s", "0", "-w", str(pcap), "tcp"],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert "listening on" in (dump.stderr.readline() if dump.stderr else ""), "tcpdump did not start"
        marker = (b"PYC10D-SNIFF-" + uuid.uuid4().hex.encode()) * 4096  # over a frame's 64 KiB
        env = {0: cas[0], 1: cas[0]} if use_tls else {}
        saved = {k: os.environ.pop(k, None) for k in cas[0]}
        try:
            res = run_ranks("unused", 2, _collectives, free_port(), env, marker, init=False, timeout=40)
        finally:
            os.environ.update({k: v for k, v in saved.items() if v is not None})
        assert all(r[3] for r in res), res
        assert res[0][-1] == ("TLSSocket" if use_tls else "socket"), res
        time.sleep(0.5)  # the last packets reach the file
    finally:
        dump.send_signal(signal.SIGINT)
        dump.wait(10)
    return pcap.read_bytes(), marker[:45]


@pytest.mark.timeout(60)
def test_no_payload_byte_in_clear(cas, tmp_path: Path) -> None:
    """tcpdump on lo: without TLS the marker is in the capture (the control), with TLS it is not."""
    if os.geteuid() != 0 or not _have("tcpdump"):
        pytest.skip("tcpdump cannot be had here (needs root and apt-get)")
    clear, marker = _sniff(cas, tmp_path, use_tls=False)
    assert marker in clear, "the control run's marker is not in the capture: the sniffing does not work"
    hidden, marker = _sniff(cas, tmp_path, use_tls=True)
    assert len(hidden) > 64 * 1024 and marker not in hidden
    assert marker[:16] not in hidden  # not even the marker's fixed head ("PYC10D-SNIFF-...")
