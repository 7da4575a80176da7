"""``init_process_group()`` under torchrun, Slurm, Open MPI and MPICH, and interface choice.

Three kinds of test: the pure detection (:func:`pyc10d.launch_env.detect`) and interface
choice on crafted environments; real ranks started as subprocesses with a launcher's
variables crafted by hand (so every launcher is exercised without it being installed); and
real ``mpirun`` (``make test-launchers`` installs Open MPI) and two ``pyc10d.run``
invocations acting as two nodes.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from pyc10d.errors import DistNetworkError
from pyc10d.launch_env import LaunchEnv, detect, local_rank, parse_hostlist, slurm_port
from pyc10d.transport.tcp.netif import advertised_address, choose_interface, interface_addresses

pytestmark = pytest.mark.interpreters  # starts Python interpreters: see conftest.py

REPO = Path(__file__).resolve().parents[1]
_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "TORCHELASTIC_",
                      "PYC10D_SOCKET_", "GLOO_SOCKET_")
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")

# -- (a) detection from crafted environments ----------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("spec, hosts", [
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a,b", ["a", "b"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("r[1-2]n[1,3]", ["r1n1", "r1n3", "r2n1", "r2n3"]),
    ("gpu-a[3]-ib,login", ["gpu-a3-ib", "login"]),
    ("single", ["single"]),
])
def test_hostlist(spec: str, hosts: list[str]) -> None:
    assert parse_hostlist(spec) == hosts


@pytest.mark.timeout(10)
@pytest.mark.parametrize("spec", ["n[1-", "n]1", "n[3-1]", "n[a-b]", "n[[1]]", "n[1-x]"])
def test_hostlist_errors(spec: str) -> None:
    with pytest.raises(ValueError, match="bad Slurm host list"):
        parse_hostlist(spec)


TORCHRUN = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "10.1.2.3",
            "MASTER_PORT": "29500"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
         "SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "node[07-08]"}
OMPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "PMIX_NAMESPACE": "1077805057", "TMPDIR": "/scratch/"}


@pytest.mark.timeout(10)
def test_torchrun_env() -> None:
    assert detect(TORCHRUN) == LaunchEnv("torchrun", 2, 4, 0, "10.1.2.3", 29500)
    # torchrun under srun or mpirun: its own variables win
    assert detect({**SLURM, **OMPI, **TORCHRUN}).source == "torchrun"
    # explicit init_process_group(rank=, world_size=) arguments beat the environment
    given = detect(TORCHRUN, rank=1, world_size=2)
    assert (given.rank, given.world_size) == (1, 2)
    explicit = detect({"MASTER_ADDR": "h", "MASTER_PORT": "1"}, rank=0, world_size=1)
    assert (explicit.source, explicit.rank, explicit.world_size) == ("env", 0, 1)


AGENT = {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "abc"}


@pytest.mark.timeout(10)
def test_torch_torchrun_agent_store() -> None:
    # torch's torchrun serves torch's store on MASTER_PORT: every rank joins it as a client
    assert detect(AGENT) == LaunchEnv("torchrun", 2, 4, 0, "10.1.2.3", 29500, torch_store=True)
    assert not detect(TORCHRUN).torch_store  # pyc10d.run, or variables set by hand


@pytest.mark.timeout(10)
@pytest.mark.parametrize("drop", ["WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_torchrun_missing(drop: str) -> None:
    env = {k: v for k, v in TORCHRUN.items() if k != drop}
    with pytest.raises(ValueError, match=f"env:// rendezvous: environment variable {drop} "
                                         "expected, but not set"):
        detect(env)


@pytest.mark.timeout(10)
def test_no_launcher() -> None:
    with pytest.raises(ValueError, match="environment variable RANK expected"):
        detect({})


@pytest.mark.timeout(10)
def test_slurm_env() -> None:
    assert detect(SLURM) == LaunchEnv("Slurm", 5, 8, 1, "node07", 23456)
    assert slurm_port(123456) == 23456 and slurm_port(7) == 20007
    # the step's node list is where its task 0 runs
    step = detect({**SLURM, "SLURM_STEP_NODELIST": "gpu[3-4]"})
    assert step.master_addr == "gpu3"
    assert detect({**SLURM, "SLURM_JOB_NODELIST": "", "SLURM_NODELIST": "x1,x2"}).master_addr == "x1"
    given = detect({**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "4000"})
    assert (given.master_addr, given.master_port) == ("head", 4000)
    port_only = detect({**SLURM, "MASTER_PORT": "4001"})
    assert (port_only.master_addr, port_only.master_port) == ("node07", 4001)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("drop, named", [
    ("SLURM_NTASKS", "SLURM_NTASKS"),
    ("SLURM_JOB_NODELIST", "SLURM_JOB_NODELIST"),
    ("SLURM_JOB_ID", "SLURM_JOB_ID"),
])
def test_slurm_missing(drop: str, named: str) -> None:
    env = {k: v for k, v in SLURM.items() if k != drop}
    with pytest.raises(ValueError, match=f"under Slurm.*{named} expected, but not set"):
        detect(env)


@pytest.mark.timeout(10)
def test_openmpi_env() -> None:
    info = detect(OMPI, ppid=99)
    assert (info.source, info.rank, info.world_size, info.local_rank) == ("Open MPI", 3, 4, 3)
    assert (info.master_addr, info.master_port) == ("127.0.0.1", None)
    assert info.port_file == "/scratch/pyc10d-user-1077805057.port"
    # mpirun inside an sbatch script: ranks inherit the batch step's SLURM_PROCID=0
    assert detect({**SLURM, "SLURM_PROCID": "0", **OMPI}).rank == 3
    given = detect({**OMPI, "MASTER_ADDR": "head", "MASTER_PORT": "4000"})
    assert (given.master_addr, given.master_port, given.port_file) == ("head", 4000, None)


@pytest.mark.timeout(10)
def test_openmpi_across_hosts() -> None:
    spread = {**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(ValueError, match=r"under Open MPI \(OMPI_COMM_WORLD_RANK=3\).*"
                                         "MASTER_ADDR expected.*mpirun -x MASTER_ADDR"):
        detect(spread)
    with pytest.raises(ValueError, match="under Open MPI.*MASTER_PORT expected"):
        detect({**spread, "MASTER_ADDR": "head"})
    # across the nodes of a Slurm allocation: its first node and the job's port
    in_alloc = detect({**spread, "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "c[5-6]"})
    assert (in_alloc.source, in_alloc.master_addr, in_alloc.master_port) == \
        ("Open MPI", "c5", 20042)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("local_vars", [
    {"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
    {"PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "2"},
])
def test_mpich_env(local_vars: dict[str, str]) -> None:
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "USER": "ann", **local_vars}
    info = detect(env, ppid=4321)
    assert (info.source, info.rank, info.world_size, info.local_rank) == ("MPICH", 1, 2, 1)
    # Hydra exports no job id: the ranks of a host share their parent, the proxy
    assert info.port_file == "/tmp/pyc10d-ann-ppid4321.port"
    with pytest.raises(ValueError, match="under MPICH.*PMI_SIZE expected"):
        detect({"PMI_RANK": "0"})
    with pytest.raises(ValueError, match="under MPICH.*MASTER_ADDR expected"):
        detect({"PMI_RANK": "1", "PMI_SIZE": "2"})  # local size unknown: maybe several hosts


@pytest.mark.timeout(10)
def test_local_rank_from_any_launcher() -> None:
    assert local_rank({**SLURM, "LOCAL_RANK": "3"}) == 3
    assert local_rank({**SLURM, **OMPI}) == 3
    assert local_rank({"MPI_LOCALRANKID": "2"}) == 2
    assert local_rank(SLURM) == 1
    assert local_rank({}) is None


# -- interface choice ----------------------------------------------------------------------

ADDRS = {"lo": "127.0.0.1", "docker0": "172.17.0.1", "eth0": "10.0.0.5", "eth1": "10.1.0.5",
         "ib0": "192.168.5.5"}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("spec, name", [
    ("eth1", "eth1"), ("eth", "eth0"), ("ib,eth", "ib0"), ("nope,eth1", "eth1"),
    ("=eth0", "eth0"), ("^lo", "docker0"), ("^docker0,lo", "eth0"), ("^docker,lo,eth", "ib0"),
    ("^=eth", "docker0"), ("^docker0,eth,ib", "lo"), (" eth1 ", "eth1"),
])
def test_choose_interface(spec: str, name: str) -> None:
    assert choose_interface(spec, ADDRS) == (name, ADDRS[name])


@pytest.mark.timeout(10)
@pytest.mark.parametrize("spec", ["=eth", "wlan", "^lo,docker0,eth,ib"])
def test_choose_interface_no_match(spec: str) -> None:
    with pytest.raises(DistNetworkError, match=re.escape(f"matches {spec!r}")) as e:
        choose_interface(spec, ADDRS)
    assert "eth0=10.0.0.5" in str(e.value)


@pytest.mark.timeout(10)
def test_interface_addresses_reads_loopback() -> None:
    addrs = interface_addresses()
    assert addrs.get("lo") == "127.0.0.1", addrs


@pytest.mark.timeout(10)
def test_advertised_address_precedence() -> None:
    local = "127.0.0.1"
    assert advertised_address({}, local, 0) == "127.0.0.1"
    assert advertised_address({}, None, 0) == "127.0.0.1"
    assert advertised_address({"PYC10D_SOCKET_ADDR": "10.9.9.9", "PYC10D_SOCKET_IFNAME": "lo"},
                              local, 0) == "10.9.9.9"
    assert advertised_address({"GLOO_SOCKET_IFNAME": "=lo"}, local, 0) == "127.0.0.1"
    with pytest.raises(DistNetworkError, match="matches 'nosuchif0'"):
        advertised_address({"PYC10D_SOCKET_IFNAME": "nosuchif0", "GLOO_SOCKET_IFNAME": "lo"},
                           local, 0)


@pytest.mark.timeout(10)
def test_a_shared_file_store_advertises_this_hosts_address(monkeypatch: pytest.MonkeyPatch) -> None:
    # file:// ranks may sit on any host that shares the file: never loopback when the host
    # has another address (its name's, as Gloo takes it, else its first other interface's)
    from pyc10d.transport.tcp import netif

    monkeypatch.setattr(netif.socket, "gethostname", lambda: "nodeA")
    monkeypatch.setattr(netif, "interface_addresses",
                        lambda: {"lo": "127.0.0.1", "eth0": "10.2.2.2", "ib0": "10.1.1.1"})
    monkeypatch.setattr(netif.socket, "gethostbyname", lambda name: "10.1.1.1")
    assert advertised_address({}, None, 0, shared_file=True) == "10.1.1.1"
    monkeypatch.setattr(netif.socket, "gethostbyname", lambda name: "127.0.1.1")  # Debian
    assert advertised_address({}, None, 0, shared_file=True) == "10.2.2.2"
    monkeypatch.setattr(netif.socket, "gethostbyname", lambda name: "10.9.9.9")  # not ours
    assert advertised_address({}, None, 0, shared_file=True) == "10.2.2.2"
    monkeypatch.setattr(netif, "interface_addresses", lambda: {"lo": "127.0.0.1"})
    assert advertised_address({}, None, 0, shared_file=True) == "127.0.0.1"
    assert advertised_address({"GLOO_SOCKET_IFNAME": "=lo"}, None, 0, shared_file=True) == "127.0.0.1"


@pytest.mark.timeout(10)
@pytest.mark.parametrize("env, how", [
    ({"PYC10D_SOCKET_IFNAME": "lo"}, "interface lo, from PYC10D_SOCKET_IFNAME=lo"),
    ({"GLOO_SOCKET_IFNAME": "=lo"}, "interface lo, from GLOO_SOCKET_IFNAME==lo"),
    ({"PYC10D_SOCKET_ADDR": "127.0.0.1"}, "from PYC10D_SOCKET_ADDR"),
])
def test_loopback_towards_another_host_fails(env: dict[str, str], how: str) -> None:
    # 203.0.113.0/24 is TEST-NET-3: never this host, never routed anywhere
    with pytest.raises(DistNetworkError) as e:
        advertised_address(env, "203.0.113.7", 3)
    msg = str(e.value)
    assert "rank 3 would advertise the loopback address 127.0.0.1" in msg
    assert how in msg and "store is on 203.0.113.7" in msg and "PYC10D_SOCKET_IFNAME" in msg


# -- (b) real ranks under crafted launcher environments ------------------------------------

RANK_SCRIPT = """
    import json, os, sys
    import torch
    import pyc10d as dist

    out, backend = sys.argv[1], sys.argv[2]
    dist.init_process_group(backend=None if backend == "auto" else backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    store = dist._get_default_store()
    info = {"rank": rank, "world": world, "sum": t.tolist(), "backend": dist.get_backend(),
            "local_rank": dist.get_node_local_rank(-1), "store_port": store.port,
            "store_host": store.host}
    if dist.get_backend() == "tcp":
        # (the group met under a prefix of its forming's own: pyc10d/store/attempt.py)
        key = next(k for k in store.list_keys() if k.startswith("0//attempt/") and k.endswith(f"/tcp_addr/{rank}"))
        info["addr"] = store.get(key).decode().rsplit(":", 2)[0]
    dist.barrier()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(info, f)
    dist.destroy_process_group()
"""


def _clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in _TORCHRUN_VARS and not k.startswith(_LAUNCHER_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _script(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    out = tmp_path / "out"
    out.mkdir()
    return script, out


def _run_ranks(envs: list[dict[str, str]], script: Path, out: Path, backend: str,
               timeout: float = 40) -> list[dict]:
    """One process per environment, each a rank running ``script``; their results.

    The ranks are forked from this test process and run the script as ``python script``
    would (``pyc10d.run_fork``), with only the launcher's variables in their environment:
    what is tested is how ``init_process_group`` reads them, and a fresh interpreter per rank
    would add an ``import torch`` (2.5 s of CPU) each. Real launchers start real interpreters
    below (torchrun, pyc10d.run, mpirun)."""
    from pyc10d.run_fork import start

    ranks = [start([str(script), str(out), backend], False, env, None) for env in envs]
    try:
        deadline = time.monotonic() + timeout
        for i, p in enumerate(ranks):
            code = p.wait(max(deadline - time.monotonic(), 0.1))
            assert code == 0, f"rank process {i} exited {code} (its stderr is in the captured output)"
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    return _results(out, len(envs))


def _two_nodes(cmds: list[list[str]], out: Path) -> list[dict]:
    """One launcher command per node (2 ranks each), run at once; the ranks' results."""
    return _run_all([(cmd, _clean_env()) for cmd in cmds], out, 2 * len(cmds), 40)


def _run_all(runs: list[tuple[list[str], dict[str, str]]], out: Path, n: int,
             timeout: float) -> list[dict]:
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for cmd, env in runs]
    try:
        for i, p in enumerate(procs):
            _, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{err[-3000:]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return _results(out, n)


def _results(out: Path, n: int) -> list[dict]:
    got = sorted(p.name for p in out.iterdir())
    assert got == sorted(f"rank{r}.json" for r in range(n))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def _check_world(results: list[dict], n: int) -> None:
    total = float(sum(range(1, n + 1)))
    for r, info in enumerate(results):
        assert (info["rank"], info["world"], info["sum"]) == (r, n, [total] * 4), info


@pytest.mark.timeout(50)
def test_slurm_ranks(tmp_path: Path) -> None:
    script, out = _script(tmp_path)
    job = next(j for j in (random.randrange(10**6, 10**7) for _ in range(200))
               if _port_is_free(slurm_port(j)))
    n = 3
    envs = [_clean_env(SLURM_PROCID=str(r), SLURM_NTASKS=str(n), SLURM_LOCALID=str(r),
                       SLURM_JOB_ID=str(job), SLURM_JOB_NODELIST="localhost,node[2-3]",
                       PYC10D_SOCKET_IFNAME="lo")
            for r in range(n)]
    results = _run_ranks(envs, script, out, "tcp")
    _check_world(results, n)
    for r, info in enumerate(results):
        assert info["local_rank"] == r
        assert (info["store_host"], info["store_port"]) == ("localhost", slurm_port(job))
        assert info["addr"] == "127.0.0.1"


@pytest.mark.timeout(50)
def test_torchrun_ranks_with_interface_choice(tmp_path: Path) -> None:
    script, out = _script(tmp_path)
    addrs = interface_addresses()
    # exclusion syntax when this host has another interface than lo, else an exact name
    spec = "^docker0,lo" if any(a != "127.0.0.1" for a in addrs.values()) else "=lo"
    want = choose_interface(spec, addrs)[1]
    port = _free_port()
    envs = [_clean_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=spec)
            for r in range(2)]
    results = _run_ranks(envs, script, out, "tcp")
    _check_world(results, 2)
    assert [info["addr"] for info in results] == [want, want]
    assert [info["store_port"] for info in results] == [port, port]


@pytest.mark.timeout(50)
def test_torch_torchrun(tmp_path: Path) -> None:
    """torch's own launcher, unchanged: its agent serves torch's store on MASTER_PORT, which
    the ranks join as clients (two agents as two nodes, as for pyc10d.run below)."""
    script, out = _script(tmp_path)
    port = _free_port()
    results = _two_nodes([
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
         "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
         str(script), str(out), "tcp"] for node in range(2)], out)
    _check_world(results, 4)
    assert [info["local_rank"] for info in results] == [0, 1, 0, 1]
    assert {(info["store_host"], info["store_port"]) for info in results} == {("127.0.0.1", port)}


@pytest.mark.timeout(50)
def test_openmpi_style_ranks_without_master_vars(tmp_path: Path) -> None:
    script, out = _script(tmp_path)
    n = 4
    ns = f"pytest-{uuid.uuid4().hex[:8]}"
    envs = [_clean_env(OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE=str(n),
                       OMPI_COMM_WORLD_LOCAL_RANK=str(r), OMPI_COMM_WORLD_LOCAL_SIZE=str(n),
                       PMIX_NAMESPACE=ns, TMPDIR=str(tmp_path))
            for r in range(n)]
    results = _run_ranks(envs, script, out, "auto")
    _check_world(results, n)
    assert {info["store_host"] for info in results} == {"127.0.0.1"}
    assert [info["local_rank"] for info in results] == list(range(n))
    assert list(tmp_path.glob("*.port*")) == []  # rank 0 removed its port file


@pytest.mark.timeout(50)
def test_mpich_style_ranks_keyed_by_parent(tmp_path: Path) -> None:
    script, out = _script(tmp_path)
    envs = [_clean_env(PMI_RANK=str(r), PMI_SIZE="2", MPI_LOCALRANKID=str(r),
                       MPI_LOCALNRANKS="2", TMPDIR=str(tmp_path))
            for r in range(2)]
    _check_world(_run_ranks(envs, script, out, "tcp"), 2)
    assert list(tmp_path.glob("*.port*")) == []


@pytest.mark.timeout(50)
def test_two_launchers_as_two_nodes(tmp_path: Path) -> None:
    script, out = _script(tmp_path)
    port = _free_port()
    spellings = [["--rdzv-endpoint", f"127.0.0.1:{port}"], [f"--rdzv_endpoint=127.0.0.1:{port}"]]
    results = _two_nodes([
        [sys.executable, "-m", "pyc10d.run", "--nnodes", "2", "--node-rank", str(node),
         "--nproc-per-node", "2", *spellings[node], str(script), str(out), "tcp"] for node in range(2)], out)
    _check_world(results, 4)
    assert [info["local_rank"] for info in results] == [0, 1, 0, 1]
    assert {info["store_port"] for info in results} == {port}


# -- (c) real mpirun -----------------------------------------------------------------------

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None,
                                  reason="mpirun not installed (make test-launchers installs it)")


def _mpirun(n: int, script: Path, out: Path, tmp_path: Path, *flags: str) -> None:
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), "-x", "PYTHONPATH",
           *flags, sys.executable, str(script), str(out), "auto"]
    res = subprocess.run(cmd, env=_clean_env(TMPDIR=str(tmp_path)), capture_output=True,
                         text=True, timeout=45)
    assert res.returncode == 0, f"mpirun exited {res.returncode}:\n{res.stdout}\n{res.stderr}"


@needs_mpirun
@pytest.mark.timeout(55)
def test_mpirun_with_no_variables(tmp_path: Path) -> None:
    script, out = _script(tmp_path)
    _mpirun(4, script, out, tmp_path)
    results = _results(out, 4)
    _check_world(results, 4)
    assert [info["local_rank"] for info in results] == [0, 1, 2, 3]
    assert {info["store_host"] for info in results} == {"127.0.0.1"}
    assert list(tmp_path.glob("pyc10d-*.port*")) == []


@needs_mpirun
@pytest.mark.timeout(55)
def test_mpirun_passes_master_vars(tmp_path: Path) -> None:
    script, out = _script(tmp_path)
    port = _free_port()
    _mpirun(2, script, out, tmp_path, "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}")
    results = _results(out, 2)
    _check_world(results, 2)
    assert {info["store_port"] for info in results} == {port}
