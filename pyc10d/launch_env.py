"""Who launched this process, and what that says about rank, world size and rendezvous.

``init_process_group()`` with no ``init_method`` (``env://``) works under any of:

* **torchrun** and ``python -m pyc10d.run`` (or a user setting the variables by hand):
  ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``;
* **Open MPI** (``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``, ``_LOCAL_SIZE``) and
  **MPICH / Intel MPI** (Hydra: ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID`` or
  ``PMI_LOCAL_RANK``, ``MPI_LOCALNRANKS`` or ``PMI_LOCAL_SIZE``);
* **Slurm's srun** (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, the node lists).

They are tried in that order. The torchrun variables come first because torchrun run under
srun or mpirun sets them for its own children; MPI comes before Slurm because ``mpirun``
inside an ``sbatch`` script hands every rank the batch step's ``SLURM_PROCID=0``.

Where the store lives: ``MASTER_ADDR`` / ``MASTER_PORT`` when set (``mpirun -x MASTER_ADDR
-x MASTER_PORT``, ``srun --export=ALL``), as torch users pass them. Otherwise

* Slurm: the first host of ``SLURM_STEP_NODELIST`` / ``SLURM_JOB_NODELIST`` /
  ``SLURM_NODELIST`` (where srun's block distribution puts task 0), port
  ``20000 + SLURM_JOB_ID % 10000`` (below Linux's ephemeral range, so no client socket
  holds it; two job steps running at once in one job need their own ``MASTER_PORT``);
* MPI with every rank on this host (local size == world size): rank 0 serves the store on
  a free port of 127.0.0.1 and writes the port to a file in ``$TMPDIR`` (``/tmp``) named
  after the launcher's job id, so ``mpirun -np 4 python script.py`` needs no variables and
  two jobs never share a port; the other ranks read the file;
* MPI across hosts inside a Slurm allocation: the Slurm node list and port, as above;
* torch's own ``torchrun`` (``TORCHELASTIC_USE_AGENT_STORE=True``): its agent already serves
  torch's store on ``MASTER_ADDR:MASTER_PORT``; every rank joins it as a client, as torch's
  ranks do (``store.torch_tcp`` speaks torch's protocol), on one host or many.

:func:`detect` is a pure function of an environment mapping so that every launcher's case
can be tested without that launcher.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LaunchEnv", "detect", "local_rank", "parse_hostlist", "slurm_port"]

_TORCH_ERR = "Error initializing torch.distributed using env:// rendezvous: "

# (name, rank, size, local rank(s), local size(s)) for each MPI flavour, tried in order.
_MPI = (
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    ("MPICH", "PMI_RANK", "PMI_SIZE",
     ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"), ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")),
)
# Variables that name one run of mpirun/mpiexec: ranks of a job agree on them, the next
# job differs. PMIX_NAMESPACE carries mpirun's pid (Open MPI 4 and 5), the ORTE ones are
# Open MPI 4's job family.
_JOB_KEYS = ("PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid",
             "OMPI_MCA_orte_jobfam_session_dir", "PMI_KVSNAME", "SLURM_JOB_ID")
_SLURM_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


@dataclass(frozen=True)
class LaunchEnv:
    """Where this rank stands, as :func:`detect` read it from the environment.

    Exactly one of ``master_port`` and ``port_file`` is set: a store at
    ``master_addr:master_port``, or (single-host MPI jobs) a store on 127.0.0.1 whose port
    rank 0 writes to ``port_file``. ``torch_store``: the store at ``master_addr:master_port``
    is torch's, served by torch's torchrun agent; every rank joins it as a client.
    """

    source: str  # "torchrun", "Open MPI", "MPICH", "Slurm", or "env" (explicit arguments)
    rank: int
    world_size: int
    local_rank: int | None
    master_addr: str
    master_port: int | None
    port_file: str | None = None
    torch_store: bool = False


def _int(env: Mapping[str, str], name: str, launcher: str) -> int:
    raw = env.get(name)
    if raw is None or not raw.strip():
        if launcher == "torchrun":  # torch's own words, which callers and tests look for
            raise ValueError(_TORCH_ERR + f"environment variable {name} expected, but not set")
        raise ValueError(f"pyc10d env:// rendezvous under {launcher}: environment variable "
                         f"{name} expected, but not set")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"pyc10d env:// rendezvous under {launcher}: {name}={raw!r} is not "
                         f"an integer") from None


def _first_int(env: Mapping[str, str], names: tuple[str, ...], launcher: str) -> int | None:
    for name in names:
        if env.get(name, "").strip():
            return _int(env, name, launcher)
    return None


def parse_hostlist(spec: str) -> list[str]:
    """Expand Slurm's compressed host list: ``"node[01-03,07],gpu5"`` -> node01 ... gpu5.

    Zero padding is kept (``[08-10]`` gives 08, 09, 10), several brackets in one name
    multiply (``r[1-2]n[1-2]`` gives r1n1, r1n2, r2n1, r2n2), order is preserved.
    """
    hosts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(spec + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"bad Slurm host list {spec!r}: unmatched ']'")
        elif ch == "," and depth == 0:
            item = spec[start:i].strip()
            if item:
                hosts.extend(_expand(item, spec))
            start = i + 1
    if depth:
        raise ValueError(f"bad Slurm host list {spec!r}: unmatched '['")
    return hosts


def _expand(item: str, spec: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", item)
    if m is None:
        if "[" in item or "]" in item:
            raise ValueError(f"bad Slurm host list {spec!r}: nested brackets in {item!r}")
        return [item]
    numbers: list[str] = []
    for part in m.group(1).split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"bad Slurm host list {spec!r}: range {part!r} in {item!r}")
        if not dash:
            numbers.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"bad Slurm host list {spec!r}: range {part!r} runs backwards")
        numbers.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    tails = _expand(item[m.end():], spec) if item[m.end():] else [""]
    return [item[:m.start()] + n + t for n in numbers for t in tails]


def slurm_port(job_id: int) -> int:
    """The store port of a Slurm job that set no ``MASTER_PORT``: 20000 + job id mod 10000."""
    return 20000 + job_id % 10000


def _slurm_master(env: Mapping[str, str], launcher: str) -> tuple[str, int] | None:
    """The first node of the Slurm node list and the job's port, or None outside Slurm."""
    nodelist = next((env[k] for k in _SLURM_NODELISTS if env.get(k, "").strip()), None)
    if nodelist is None or not env.get("SLURM_JOB_ID", "").strip():
        return None
    hosts = parse_hostlist(nodelist)
    if not hosts:
        raise ValueError(f"pyc10d env:// rendezvous under {launcher}: empty Slurm node list")
    port = _int(env, "MASTER_PORT", launcher) if env.get("MASTER_PORT") else \
        slurm_port(_int(env, "SLURM_JOB_ID", launcher))
    return env.get("MASTER_ADDR") or hosts[0], port


def _job_key(env: Mapping[str, str], ppid: int | None) -> str | None:
    for name in _JOB_KEYS:
        if env.get(name, "").strip():
            return re.sub(r"[^A-Za-z0-9_.-]+", "_", env[name].strip()).strip("_")[-80:]
    # Hydra sets no job id, but the ranks of one host are the children of one proxy.
    return f"ppid{ppid}" if ppid is not None else None


def _mpi(env: Mapping[str, str], rank: int, world_size: int, ppid: int | None) -> LaunchEnv | None:
    for name, rank_var, size_var, local_vars, local_size_vars in _MPI:
        if not env.get(rank_var, "").strip():
            continue
        r = rank if rank >= 0 else _int(env, rank_var, name)
        n = world_size if world_size > 0 else _int(env, size_var, name)
        local = _first_int(env, local_vars, name)
        local_size = _first_int(env, local_size_vars, name)
        addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        if addr and port:
            return LaunchEnv(name, r, n, local, addr, _int(env, "MASTER_PORT", name))
        if not addr and local_size is not None and local_size == n:
            key = _job_key(env, ppid)
            if key is not None:
                tmp = env.get("TMPDIR") or "/tmp"
                path = f"{tmp.rstrip('/')}/pyc10d-{env.get('USER', 'user')}-{key}.port"
                return LaunchEnv(name, r, n, local, "127.0.0.1", None, path)
        slurm = _slurm_master(env, name)
        if slurm is not None:
            return LaunchEnv(name, r, n, local, *slurm)
        missing = "MASTER_PORT" if addr else "MASTER_ADDR"
        raise ValueError(
            f"pyc10d env:// rendezvous under {name} ({rank_var}={env[rank_var]}): environment "
            f"variable {missing} expected, but not set; the ranks are not all on one host, so "
            f"pass the address and port of rank 0's host, e.g. mpirun -x MASTER_ADDR=host "
            f"-x MASTER_PORT=29500"
        )
    return None


def _slurm(env: Mapping[str, str], rank: int, world_size: int) -> LaunchEnv | None:
    if not env.get("SLURM_PROCID", "").strip():
        return None
    r = rank if rank >= 0 else _int(env, "SLURM_PROCID", "Slurm")
    n = world_size if world_size > 0 else _int(env, "SLURM_NTASKS", "Slurm")
    local = _first_int(env, ("SLURM_LOCALID",), "Slurm")
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return LaunchEnv("Slurm", r, n, local, env["MASTER_ADDR"],
                         _int(env, "MASTER_PORT", "Slurm"))
    master = _slurm_master(env, "Slurm")
    if master is None:
        missing = "SLURM_JOB_ID" if any(env.get(k) for k in _SLURM_NODELISTS) else \
            "SLURM_JOB_NODELIST"
        raise ValueError(f"pyc10d env:// rendezvous under Slurm (SLURM_PROCID="
                         f"{env['SLURM_PROCID']}): environment variable {missing} expected, but "
                         f"not set (or set MASTER_ADDR and MASTER_PORT)")
    return LaunchEnv("Slurm", r, n, local, *master)


def detect(env: Mapping[str, str], rank: int = -1, world_size: int = -1,
           ppid: int | None = None) -> LaunchEnv:
    """Read rank, world size, local rank and the store's address from ``env``.

    ``rank`` / ``world_size`` >= 0 (``init_process_group``'s arguments) take precedence over
    the environment's. ``ppid`` is the parent's pid: the key of a single-host MPICH job,
    which exports no job id. Raises ValueError naming the launcher and the missing variable.
    """
    if env.get("RANK", "").strip() or env.get("WORLD_SIZE", "").strip():
        return _torchrun(env, rank, world_size, "torchrun")
    found = _mpi(env, rank, world_size, ppid) or _slurm(env, rank, world_size)
    if found is not None:
        return found
    return _torchrun(env, rank, world_size, "env")


def _torchrun(env: Mapping[str, str], rank: int, world_size: int, source: str) -> LaunchEnv:
    r = rank if rank >= 0 else _int(env, "RANK", "torchrun")
    n = world_size if world_size > 0 else _int(env, "WORLD_SIZE", "torchrun")
    if not env.get("MASTER_ADDR"):
        raise ValueError(_TORCH_ERR + "environment variable MASTER_ADDR expected, but not set")
    port = _int(env, "MASTER_PORT", "torchrun")
    # torch's torchrun: its agent already serves torch's store at MASTER_ADDR:MASTER_PORT
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return LaunchEnv(source, r, n, _first_int(env, ("LOCAL_RANK",), "torchrun"),
                     env["MASTER_ADDR"], port, torch_store=agent)


def local_rank(env: Mapping[str, str]) -> int | None:
    """This process's index among the ranks of its host, from whichever launcher set one."""
    names = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
             "SLURM_LOCALID")
    return _first_int(env, names, "env://")
