"""Several "hosts" on one Linux machine, for multi-host tests and benchmarks (needs root).

A host here is what distributed code can tell apart from another machine: its own network
stack, hostname, ``/dev/shm`` and processes. ``Hosts(n)`` makes n of them:

* a network namespace per host with ``lo`` up and one interface, ``eth0``, addressed
  ``10.213.0.<i+1>/24``; its other end is a port of a bridge living in a further namespace
  (the switch). The addresses exist only inside these namespaces: nothing is added to, or
  sent through, the machine's own network namespace or interfaces;
* ``Hosts(n, links=2)``: a second interface per host, ``eth1``, on a second bridge (a second
  network: ``10.214.0.<i+1>/24``), as hosts with two NICs; ``ipv6_only=True``: the hosts'
  interfaces have IPv6 addresses only, ``fd00:213::<i+1>/64`` (``fd00:214::`` on ``eth1``),
  added without duplicate address detection (``nodad``: usable at once, not after 1-2 s);
  ``lo`` keeps 127.0.0.1 and ::1, as on any IPv6-only machine;
* processes started with ``Host.spawn`` run in the host's network namespace and, through
  ``unshare``, in a UTS namespace (``hostname`` is the host's name), a mount namespace with
  a private tmpfs on ``/dev/shm`` and an ``/etc/hosts`` that names every host (``h0``,
  ``h1``, ...: names resolve as on a cluster with DNS), and a PID namespace. The rest of the
  file system (``/tmp``, ``/run``) is the machine's, shared as a cluster's network file
  system would be, and so are ``/sys`` and its cgroups (``nsenter`` enters the network
  namespace: ``ip netns exec`` would mount a ``/sys`` without them, where slurmd cannot start). One ``spawn`` is one PID namespace:
  start every process of a host from one spawn (a launcher) so they share ``/dev/shm``, and
  ``Host.kill()`` SIGKILLs that whole namespace at once (``--kill-child``) as a power cut would.

Names carry the creating process's pid and a counter, so parallel runs never collide, and
``close()`` (also at interpreter exit) kills what was spawned and deletes every namespace
(the veth pairs and the bridge go with them). ``shape()`` puts a tc qdisc on every host's
uplink (``netem`` delay, ``tbf`` rate); kernels without ``sch_netem`` raise
``ShapingUnsupported`` saying so.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from ..run import _die_with_parent

SUBNET = "10.213.0"
SUBNET6 = "fd00:213::"
_COUNTER = itertools.count()
# Inside the new namespaces: a private /dev/shm, the host's name and the hosts' names
# ($1: the hosts file), then the command.
_ENTER = ('mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname "$0" && mount --bind "$1" /etc/hosts '
          '&& shift && exec "$@"')


_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWPID, _CLONE_NEWNET = 0x20000, 0x4000000, 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
_libc = ctypes.CDLL(None, use_errno=True)


def _sys(name: str, *args: Any) -> None:
    """libc's ``name(*args)``, raising ``OSError`` on failure."""
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _mirror(pid: int) -> None:
    """Wait for ``pid`` and end this process as it ended (its code, or its signal), as
    ``unshare --fork`` does; never returns."""
    code = 1
    try:
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
            code = 128 - code  # (a signal that does not end a process)
    finally:
        os._exit(code & 0xFF)


class ShapingUnsupported(RuntimeError):
    """The kernel lacks the queueing discipline asked for (e.g. no ``sch_netem``)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable_reason() -> str | None:
    """Why ``Hosts`` cannot work here (not root, tools missing), or None when it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nsenter", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"needs the {tool!r} command"
    probe = f"pyc10d-probe-{os.getpid()}-{next(_COUNTER)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return None


class Host:
    """One namespace host: ``name`` (its hostname), ``addr`` (its address; ``addrs``: one
    per interface of ``ifaces``), ``netns``."""

    def __init__(self, index: int, netns: str, links: int = 1, ipv6_only: bool = False,
                 hosts_file: str = "/etc/hosts") -> None:
        self.index = index
        self.hosts_file = hosts_file
        self.name = f"h{index}"
        self.netns = netns
        self.ifaces = [f"eth{j}" for j in range(links)]
        self.prefixes = [_ipv6_subnet(j) if ipv6_only else _ipv4_subnet(j) for j in range(links)]
        self.addrs = [f"{p}{index + 1}" if ipv6_only else f"{p}.{index + 1}" for p in self.prefixes]
        self.addr, self.iface = self.addrs[0], self.ifaces[0]
        self.procs: list[subprocess.Popen[Any]] = []

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run on this host (own network, hostname, /dev/shm, pids)."""
        return ["nsenter", f"--net=/var/run/netns/{self.netns}", "unshare", "--uts", "--mount", "--pid",
                "--fork", "--kill-child", "--mount-proc", "sh", "-c", _ENTER, self.name, self.hosts_file, *argv]

    def spawn(self, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` on this host (``popen``: ``subprocess.Popen``'s keywords)."""
        proc = subprocess.Popen(self.command(argv), **popen)
        self.procs.append(proc)
        return proc

    def spawn_into(self, into: subprocess.Popen[Any], argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the namespaces of ``into``, a running ``spawn`` of this host:
        the same ``/dev/shm`` and PIDs as its processes (a Ray driver beside its node's
        raylet), where a plain ``spawn`` would start a namespace of its own."""
        deadline = time.monotonic() + 10
        while True:  # unshare's child, PID 1 of the host's namespaces, once it has forked
            with open(f"/proc/{into.pid}/task/{into.pid}/children") as f:
                first = f.read().split()
            if first:
                break
            if into.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"spawn_into: {list(into.args)[-1]!r} on {self.name} is not running")
            time.sleep(0.01)
        proc = subprocess.Popen(["nsenter", f"--target={first[0]}", "--net", "--uts", "--mount", "--pid", "--",
                                 *argv], **popen)
        self.procs.append(proc)
        return proc

    def spawn_script(self, script: str, args: Sequence[str], log: str, *, module: bool = False) -> Any:
        """Run the Python file ``script`` (the module ``script`` with ``module=True``) with
        ``args`` on this host, as ``spawn`` would run ``python script args`` (own network,
        hostname, /dev/shm, pids; stdout and stderr to the file ``log``), but forked from this
        process instead of a fresh interpreter: torch and pyc10d are imported already (a fresh
        interpreter spends ~2.5 s of CPU importing torch). Returns a ``Popen``-like handle
        (``poll``, ``wait``, ``send_signal``, ``kill``); ``kill()`` takes the host's processes
        down as for ``spawn``."""
        from ..run_fork import start

        proc = start([script, *args], module, dict(os.environ), lambda: self._enter(log))
        self.procs.append(proc)
        return proc

    def _enter(self, log: str) -> None:
        """In a child forked by ``spawn_script``: what ``command`` has ``ip netns exec`` and
        ``unshare --fork --kill-child --mount-proc`` do. This process stays outside the new
        PID namespace and waits, mirroring its child's exit; the child, PID 1 there, runs on."""
        fd = os.open(f"/var/run/netns/{self.netns}", os.O_RDONLY)
        try:
            _sys("setns", fd, _CLONE_NEWNET)
        finally:
            os.close(fd)
        _sys("unshare", _CLONE_NEWNS | _CLONE_NEWUTS | _CLONE_NEWPID)
        pid = os.fork()
        if pid:
            _mirror(pid)
        _die_with_parent()()  # type: ignore[misc] - Linux, where the hook exists
        _sys("mount", None, b"/", None, _MS_REC | _MS_PRIVATE, None)  # nothing leaks to the machine
        _sys("mount", b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"mode=1777")
        _sys("mount", b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
        name = self.name.encode()
        _sys("sethostname", name, len(name))
        _sys("mount", self.hosts_file.encode(), b"/etc/hosts", None, _MS_BIND, None)
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run a command in this host's network namespace only (e.g. ``tc``), checked."""
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True,
                              check=True)

    def kill(self) -> None:
        """SIGKILL every process spawned here: ``unshare --kill-child`` takes the PID
        namespace down with it, so no process of this host survives."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _ipv4_subnet(link: int) -> str:
    return f"10.{213 + link}.0"


def _ipv6_subnet(link: int) -> str:
    return f"fd00:{213 + link}::"


class Hosts:
    """``n`` namespace hosts joined by ``links`` bridges (one per interface of a host); a
    context manager that always cleans up. ``ipv6_only``: IPv6 addresses only."""

    def __init__(self, n: int, links: int = 1, ipv6_only: bool = False) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"pyc10d.testing.hosts: {reason}")
        tag = f"pyc10d-{os.getpid()}-{next(_COUNTER)}"
        self.switch = f"{tag}-sw"
        self.ipv6_only = ipv6_only
        self._dir = tempfile.mkdtemp(prefix=f"{tag}-")
        hosts_file = os.path.join(self._dir, "hosts")
        self.hosts = [Host(i, f"{tag}-h{i}", links, ipv6_only, hosts_file) for i in range(n)]
        with open("/etc/hosts") as f:
            machine = f.read()
        with open(hosts_file, "w") as f:  # the machine's names, then the hosts'
            f.write(machine.rstrip("\n") + "\n" + "".join(f"{h.addr} {h.name}\n" for h in self.hosts))
        os.chmod(self._dir, 0o755)
        self._namespaces: list[str] = []
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._netns(self.switch)
        links = len(self.hosts[0].ifaces) if self.hosts else 1
        for j in range(links):
            _ip("-n", self.switch, "link", "add", f"br{j}", "type", "bridge")
            _ip("-n", self.switch, "link", "set", f"br{j}", "up")
        for h in self.hosts:
            self._netns(h.netns)
            if self.ipv6_only:  # (a machine may default new namespaces to IPv6 off)
                subprocess.run(["ip", "netns", "exec", h.netns, "sysctl", "-qw",
                                "net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.default.disable_ipv6=0"],
                               capture_output=True, check=True)
            for j, (iface, addr) in enumerate(zip(h.ifaces, h.addrs)):
                port = f"p{h.index}-{j}"
                # Both ends are created straight inside their namespaces: never in the root one.
                _ip("link", "add", iface, "netns", h.netns, "type", "veth", "peer", "name", port,
                    "netns", self.switch)
                _ip("-n", self.switch, "link", "set", port, "master", f"br{j}")
                _ip("-n", self.switch, "link", "set", port, "up")
                if self.ipv6_only:
                    _ip("-n", h.netns, "addr", "add", f"{addr}/64", "dev", iface, "nodad")
                else:
                    _ip("-n", h.netns, "addr", "add", f"{addr}/24", "dev", iface)
                _ip("-n", h.netns, "link", "set", iface, "up")

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def shape(self, delay_ms: float | None = None, rate: str | None = None) -> None:
        """Every host's uplinks (each interface): ``delay_ms`` one-way delay (netem), or a ``rate`` such as
        ``"1gbit"`` (tbf). Each packet leaves exactly one host, so a delay d gives an RTT
        of 2d between hosts and nothing within a host."""
        if delay_ms is not None and rate is not None:
            raise ValueError("shape: one of delay_ms or rate")
        if delay_ms is not None:
            qdisc = ["netem", "delay", f"{delay_ms}ms"]
        elif rate is not None:
            qdisc = ["tbf", "rate", rate, "burst", "512kb", "latency", "100ms"]
        else:
            return
        for h, iface in ((host, i) for host in self.hosts for i in host.ifaces):
            try:
                h.exec("tc", "qdisc", "replace", "dev", iface, "root", *qdisc)
            except subprocess.CalledProcessError as e:
                why = e.stderr.strip()
                if "unknown" in why.lower():
                    raise ShapingUnsupported(
                        f"tc qdisc {qdisc[0]}: this kernel ({os.uname().release}) has no sch_{qdisc[0]} ({why})"
                    ) from None
                raise

    def close(self) -> None:
        """Kill every spawned process and delete every namespace (idempotent)."""
        for h in self.hosts:
            h.kill()
        while self._namespaces:
            _ip("netns", "delete", self._namespaces.pop(), check=False)
        shutil.rmtree(self._dir, ignore_errors=True)
        atexit.unregister(self.close)


__all__ = ["SUBNET", "SUBNET6", "Host", "Hosts", "ShapingUnsupported", "unavailable_reason"]
