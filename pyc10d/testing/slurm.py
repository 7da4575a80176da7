"""A real Slurm cluster on namespace hosts (``pyc10d.testing.hosts``), for ``make test-slurm``.

Needs root and Debian's ``slurm-wlm`` and ``munge`` (``make test-slurm`` installs them).
``Cluster(hosts)`` starts, as a small cluster runs them:

* ``munged`` on the machine, with a key and socket of its own in the cluster's folder: the
  hosts share the machine's ``/tmp`` as a cluster shares its file system, so every daemon
  and client reaches the one socket (``AuthInfo=socket=``), and a machine's own munged, if
  any, is left alone;
* ``slurmctld`` on h0 and one ``slurmd`` per host, each in its host's namespaces: the tasks
  ``slurmstepd`` starts are that host's processes (its network, hostname, ``/dev/shm``), and
  ``Host.kill()`` takes a node down, daemon and tasks at once, as a power cut would;
* a ``slurm.conf`` naming each node by its host name and address, with no cgroup, MPI or
  accounting plugin (process tracking by ``/proc``): nothing outside the folder is touched.

Client commands (``srun``, ``sbatch``, ``scontrol``, ``scancel``) run on h0, as from a login
node, through :meth:`Cluster.spawn` / :meth:`Cluster.run`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .hosts import Host, Hosts
from .hosts import unavailable_reason as hosts_unavailable

TOOLS = ("slurmctld", "slurmd", "slurmstepd", "srun", "sbatch", "scontrol", "scancel", "sinfo",
         "munged", "mungekey")


def unavailable_reason() -> str | None:
    """Why a cluster cannot start here (namespace hosts, a missing tool), or None."""
    missing = [t for t in TOOLS if shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}")]
    if missing:
        return f"needs {', '.join(missing)} (Debian's slurm-wlm and munge: make test-slurm installs them)"
    return hosts_unavailable()


def _launcher_variable(name: str) -> bool:
    return name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                    "MASTER_PORT") or name.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_"))


_CONF = """\
ClusterName=pyc10d
SlurmctldHost={h0}({addr0})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge/socket
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
"""


class Cluster:
    """slurmctld and one slurmd per host of ``hosts``, each node ``cpus`` CPUs; a context
    manager (``close`` stops the daemons and removes the folder)."""

    def __init__(self, hosts: Hosts, cpus: int = 2, start_timeout: float = 30.0) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"pyc10d.testing.slurm: {reason}")
        self.hosts = hosts
        self.dir = Path(tempfile.mkdtemp(prefix="pyc10d-slurm-"))
        os.chmod(self.dir, 0o755)
        self.conf = self.dir / "slurm.conf"
        # A user's shell, not this process's: a launcher's variables here (a test that set
        # WORLD_SIZE, an outer srun) would reach every task and take precedence over srun's.
        self.env = {k: v for k, v in os.environ.items() if not _launcher_variable(k)}
        self.env["SLURM_CONF"] = str(self.conf)
        self._daemons: dict[str, Any] = {}
        self._munged: subprocess.Popen[Any] | None = None
        try:
            self._write_conf(cpus)
            self._start_munge()
            self._daemons["slurmctld"] = self._daemon(hosts[0], ["slurmctld", "-D", "-c", "-i"])
            for h in hosts.hosts:
                self.start_node(h.index)
            self.wait_idle(start_timeout)
        except BaseException:
            self.close()
            raise

    def _write_conf(self, cpus: int) -> None:
        (self.dir / "state").mkdir()
        nodes = "".join(f"NodeName={h.name} NodeAddr={h.addr} CPUs={cpus} State=UNKNOWN\n" for h in self.hosts.hosts)
        names = ",".join(h.name for h in self.hosts.hosts)
        self.conf.write_text(_CONF.format(h0=self.hosts[0].name, addr0=self.hosts[0].addr, dir=self.dir) + nodes
                             + f"PartitionName=main Nodes={names} Default=YES MaxTime=INFINITE State=UP\n")

    def _start_munge(self) -> None:
        munge = self.dir / "munge"
        munge.mkdir(mode=0o711)  # munged refuses a socket folder others may write to
        subprocess.run(["mungekey", "--create", f"--keyfile={munge}/key"], check=True, capture_output=True)
        self._munged = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={munge}/socket", f"--key-file={munge}/key",
             f"--log-file={munge}/log", f"--pid-file={munge}/pid", f"--seed-file={munge}/seed"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not (munge / "socket").exists():
            if self._munged.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self._tail(munge / 'log')}")
            time.sleep(0.02)

    def _daemon(self, host: Host, argv: Sequence[str]) -> subprocess.Popen[Any]:
        # No pipes: a daemon holding one open would keep a reader waiting after it is done.
        return host.spawn(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)

    def start_node(self, index: int) -> None:
        """Start host ``index``'s slurmd (again, after ``Host.kill()``)."""
        (self.dir / f"spool-{self.hosts[index].name}").mkdir(exist_ok=True)
        self._daemons[f"slurmd-{index}"] = self._daemon(self.hosts[index], ["slurmd", "-D"])

    def wait_idle(self, timeout: float) -> None:
        """Until every node is up and idle (registered, no job), or RuntimeError with the logs."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], timeout=10).stdout.split()
            if states and all(s == "idle" for s in states[1::2]) and len(states) == 2 * len(self.hosts):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm's nodes are not idle after {timeout:.0f} s: {states}\n{self.logs()}")
            time.sleep(0.2)

    def spawn(self, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start a client command (``srun ...``) on h0, with this cluster's ``SLURM_CONF``
        (``env=`` adds variables)."""
        env = {**self.env, **popen.pop("env", {})}
        return self.hosts[0].spawn(argv, env=env, **popen)

    def run(self, argv: Sequence[str], timeout: float, **popen: Any) -> subprocess.CompletedProcess[str]:
        """Run a client command on h0 to its end (``timeout`` s: then killed and raised as
        ``subprocess.TimeoutExpired``); stdout and stderr captured as text."""
        proc = self.spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **popen)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)

    def batch(self, argv: Sequence[str], output: Path, timeout: float,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``sbatch argv`` (a batch script and its arguments) to the job's end: its exit code,
        and the job's output (``output``) as stdout. Polls the job's state every 0.2 s:
        ``sbatch --wait`` polls with a back-off that added 20 s to a 20 s job here."""
        submit = self.run(["sbatch", "--parsable", f"--output={output}", *argv], timeout=20, env=env or {})
        if submit.returncode != 0:
            return submit
        job = submit.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout
        while True:
            state = dict(f.split("=", 1) for f in self.run(["scontrol", "--oneliner", "show", "job", job],
                                                            timeout=10).stdout.split() if "=" in f)
            if state.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                break
            if time.monotonic() > deadline:
                self.run(["scancel", job], timeout=10)
                raise subprocess.TimeoutExpired(["sbatch", *argv], timeout)
            time.sleep(0.2)
        code = int(state.get("ExitCode", "1:0").split(":")[0])
        text = output.read_text(errors="replace") if output.exists() else ""
        return subprocess.CompletedProcess(list(argv), code, text, f"job {job}: {state.get('JobState')}")

    @staticmethod
    def _tail(path: Path, chars: int = 2000) -> str:
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def logs(self) -> str:
        """The daemons' logs, each one's tail, for a failure's message."""
        return "\n".join(f"--- {p.name}\n{self._tail(p)}" for p in sorted(self.dir.glob("*.log")))

    def close(self) -> None:
        """Stop the daemons and munged, remove the folder (idempotent)."""
        for proc in self._daemons.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self._daemons.clear()
        if self._munged is not None:
            self._munged.terminate()
            self._munged.wait()
            self._munged = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["TOOLS", "Cluster", "unavailable_reason"]
