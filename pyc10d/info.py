"""``python -m pyc10d.info``: what a bug report needs to know about this machine and install.

Every line is measured here, not read from a configuration: the versions imported, which of
pyc10d's names torch's ``Backend`` registry holds (and whether torch's autoload loaded the
entry point that put them there), who serves torch's name ``"gloo"`` (Gloo, or pyc10d where the
user set ``PYC10D_SERVE_GLOO``), ``/dev/shm``'s size and whether a segment can actually be
created, mapped, written and removed, the address the tcp transport would advertise to its
peers and why, and the security settings in force: whether ``PYC10D_AUTH_TOKEN`` is set (never
its value), whether TLS is on (and its files there) or would be refused, the silent-peer bound
and the CPU placement. ``--json`` prints the same as one JSON object, for scripts and tests.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
from typing import Any

from . import settings

#: The names pyc10d registers with ``torch.distributed`` (see ``_pyc10d_autoload.NAMES``).
TORCH_NAMES = ("pyc10d", "pyc10d_shm", "pyc10d_tcp")
#: Variables that change pyc10d's behaviour; their values are shown, except the secret's.
SECRET_VARS = (settings.AUTH_TOKEN.name,)
OTHER_VARS = ("GLOO_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT", "TORCH_DEVICE_BACKEND_AUTOLOAD")


def versions() -> dict[str, Any]:
    import torch

    import pyc10d

    from . import torch_version

    return {"pyc10d": pyc10d.__version__, "pyc10d_path": os.path.dirname(pyc10d.__file__),
            "torch": torch.__version__, "torch_tested": torch_version.tested(),
            "torch_note": torch_version.untested_note(), "torch_lacks": torch_version.missing(),
            "python": platform.python_version(),
            "platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
            **cpu_budget()}


def cpu_budget() -> dict[str, Any]:
    """What pyc10d's policies count as this host's CPUs (``transport.cpus``), and why."""
    from pyc10d.transport import cpus

    return {"affinity_cpus": cpus.affinity(), "cpu_quota": cpus.cpu_quota(), "usable_cpus": cpus.usable_cpus()}


def torch_backends() -> dict[str, Any]:
    """Which of pyc10d's names torch sees, and how they got there."""
    import torch.distributed as tdist

    points = [e for e in importlib.metadata.entry_points(group="torch.backends") if e.name == "pyc10d"]
    plugins = getattr(tdist.Backend, "_plugins", {})
    return {
        "entry_point": points[0].value if points else None,
        "autoload": os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "0",
        "entry_point_loaded": "_pyc10d_autoload" in sys.modules,
        "registered": {name: name.upper() in plugins for name in TORCH_NAMES},
        "gloo": gloo_name(),
    }


def gloo_name() -> dict[str, Any]:
    """Who serves torch's name ``"gloo"``: torch's Gloo, or a pyc10d engine because the user
    asked (``PYC10D_SERVE_GLOO``, ``serve_gloo()``); and a setting that asks but does not act."""
    from pyc10d.torch_backend import gloo_name as served

    try:
        asked = served.engine_from(settings.SERVE_GLOO.raw())
    except ValueError as e:
        asked, problem = None, str(e)
    else:
        problem = None
    by = served.gloo_served_by()
    if problem is None and asked is not None and by is None:
        problem = (f"{settings.SERVE_GLOO.name} is set but does not act: "
                   + ("torch's autoload is off" if served.autoload_off() else "the autoload did not apply it"))
    return {"served_by": by, "setting": settings.SERVE_GLOO.raw(), "problem": problem}


def shared_memory() -> dict[str, Any]:
    """``/dev/shm``'s size, and one segment created, written, read back and removed."""
    from pyc10d.transport.shm import futex
    from pyc10d.transport.shm import segment as shm_segment

    out: dict[str, Any] = {"dir": shm_segment.SHM_DIR, "futex": futex.available()}
    try:
        st = os.statvfs(shm_segment.SHM_DIR)
        out["size_bytes"], out["free_bytes"] = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError as e:
        out["size_bytes"] = out["free_bytes"] = None
        out["error"] = f"{type(e).__name__}: {e}"
    name = shm_segment.new_name("info")
    out["probe"] = name
    try:
        seg = shm_segment.Segment(name, 4096, create=True)
        seg.words[1] = 0xC10D
        path = os.path.join(shm_segment.SHM_DIR, name)
        created = os.path.exists(path) and seg.view(4, 4).tolist() == list((0xC10D).to_bytes(4, sys.byteorder))
        seg.close()
        out["works"] = created and not os.path.exists(path) and out["futex"]
        if not created:
            out["error"] = "the segment was not visible or did not read back what was written"
        elif not out["futex"]:
            out["error"] = f"no futex system call known for {platform.machine()}: auto picks tcp"
    except OSError as e:
        out["works"] = False
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def network() -> dict[str, Any]:
    """The address a rank would advertise for its tcp listener, with the store where
    ``MASTER_ADDR`` says (this host when unset), and this host's interfaces (IPv4 address, else IPv6)."""
    from pyc10d.transport.tcp.netif import advertised_address, interface_addresses

    store_host = os.environ.get("MASTER_ADDR") or None
    out: dict[str, Any] = {"interfaces": interface_addresses(), "store_host": store_host or "127.0.0.1"}
    try:
        addr = advertised_address(os.environ, store_host, rank=0)
        out["advertised"] = addr
        out["interface"] = next((n for n, a in out["interfaces"].items() if a == addr), None)
        # a job across hosts whose store is a shared file: what this host's name resolves to
        out["file_store_advertised"] = advertised_address(os.environ, None, rank=0, shared_file=True)
    except Exception as e:  # noqa: BLE001 - reported, as the rank would report it
        out["advertised"] = out["interface"] = out["file_store_advertised"] = None
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def _tls() -> dict[str, Any]:
    """TLS as a rank would start it: off, on (the three files, each there or not), or refused
    (only some of the three set: the rank would fail, saying which)."""
    from . import tls

    try:
        files = tls.settings()
    except tls.TLSError as e:
        return {"state": "refused", "error": str(e)}
    if files is None:
        return {"state": "off"}
    return {"state": "on", "files": {name: {"path": path, "exists": os.path.isfile(path)}
                                     for name, path in zip((tls.ENV_CERT, tls.ENV_KEY, tls.ENV_CA), files)}}


def _peer_timeout() -> Any:
    from . import keepalive

    try:
        return keepalive.peer_timeout()
    except ValueError as e:
        return f"invalid: {e}"


def security() -> dict[str, Any]:

    return {"auth_token_set": bool(settings.AUTH_TOKEN.get()),
            "tls": _tls(),
            "peer_timeout_s": _peer_timeout(),  # None: silent-peer detection off
            "bind": settings.BIND.get(),
            "variables": {k: ("<set>" if k in SECRET_VARS else v) for k, v in sorted(os.environ.items())
                          if k.startswith("PYC10D_") or k in OTHER_VARS}}


def collect() -> dict[str, Any]:
    return {"versions": versions(), "torch_backends": torch_backends(), "shm": shared_memory(),
            "network": network(), "security": security()}


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.1f} GiB"


def _render_tls(t: dict[str, Any]) -> str:
    if t["state"] == "off":
        return "off: store and peer connections in clear (set PYC10D_TLS_CERT, _KEY and _CA)"
    if t["state"] == "refused":
        return f"REFUSED: {t['error']}"
    missing = [name for name, f in t["files"].items() if not f["exists"]]
    return ("on: mutual TLS 1.3 on every store and peer connection"
            + (f"; MISSING files: {', '.join(missing)}" if missing else ""))


def render(info: dict[str, Any]) -> str:
    v, tb, shm, net, sec = (info[k] for k in ("versions", "torch_backends", "shm", "network", "security"))
    seen = ", ".join(f"{n} {'yes' if ok else 'NO'}" for n, ok in tb["registered"].items())
    lines = [
        f"pyc10d      {v['pyc10d']} ({v['pyc10d_path']})",
        f"torch       {v['torch']}" + (f": {v['torch_note']}" if v["torch_note"] else "")
        + (f"; the plugin cannot run, torch lacks {', '.join(v['torch_lacks'])}" if v["torch_lacks"] else ""),
        f"python      {v['python']} on {v['platform']} ({v['machine']}, {v['cpus']} CPUs)",
        f"cpus        {v['usable_cpus']} usable: {v['affinity_cpus']} in the affinity set, "
        + (f"a cgroup quota of {v['cpu_quota']:g} CPUs" if v["cpu_quota"] is not None else "no cgroup CPU quota"),
        f"torch sees  {seen}",
        f"entry point {tb['entry_point'] or 'not installed (pip install pyc10d declares it)'}; "
        f"autoload {'on' if tb['autoload'] else 'off (TORCH_DEVICE_BACKEND_AUTOLOAD=0)'}, "
        f"{'loaded' if tb['entry_point_loaded'] else 'not loaded'}",
        "gloo        " + (f"served by pyc10d's {tb['gloo']['served_by']} engine ({settings.SERVE_GLOO.name})"
                           if tb["gloo"]["served_by"] else "torch's Gloo")
        + (f"; {tb['gloo']['problem']}" if tb["gloo"]["problem"] else ""),
        f"/dev/shm    {_size(shm['size_bytes'])}, {_size(shm['free_bytes'])} free; "
        f"shm backend {'works here' if shm['works'] else 'does NOT work here'}"
        + (f" ({shm['error']})" if shm.get("error") else ""),
        f"tcp         advertises {net['advertised'] or '?'}"
        + (f" ({net['interface']})" if net.get("interface") else "")
        + f" to peers, store at {net['store_host']}"
        + (f" (file:// across hosts: {net['file_store_advertised']})" if net.get("file_store_advertised") else "")
        + (f"; {net['error']}" if net.get("error") else ""),
        "interfaces  " + (", ".join(f"{n} {a}" for n, a in net["interfaces"].items()) or "none with an address"),
        f"auth        PYC10D_AUTH_TOKEN {'set: connections authenticated' if sec['auth_token_set'] else 'unset: connections not authenticated'}",
        "tls         " + _render_tls(sec["tls"]),
        "silent peer " + (f"named after {sec['peer_timeout_s']:g} s (PYC10D_PEER_TIMEOUT_S)"
                          if isinstance(sec["peer_timeout_s"], (int, float))
                          else str(sec["peer_timeout_s"] or "detection off (PYC10D_PEER_TIMEOUT_S=0)")),
        f"placement   PYC10D_BIND={sec['bind']}"
        + (": each rank of a host on CPUs of its own" if sec["bind"] == "auto" else ""),
        "variables   " + (", ".join(f"{k}={val}" for k, val in sec["variables"].items()) or "none set"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyc10d.info", description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = ap.parse_args(argv)
    info = collect()
    print(json.dumps(info, indent=1) if args.json else render(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
