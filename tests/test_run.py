"""Tests of the ``python -m pyc10d.run`` launcher (no collectives involved)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.interpreters  # starts Python interpreters: see conftest.py

REPO = Path(__file__).resolve().parents[1]
ENV_KEYS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
            "MASTER_ADDR", "MASTER_PORT"]


def _env(extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO)] + ([str(extra_path)] if extra_path else [])
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _launch(args: list[str], extra_path: Path | None = None, timeout: float = 45
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyc10d.run", *args], env=_env(extra_path),
                          capture_output=True, text=True, timeout=timeout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _write(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


DUMP_ENV = """
    import json, os, sys
    out = sys.argv[1]
    keys = {keys!r}
    data = {{k: os.environ.get(k) for k in keys}}
    data["argv"] = sys.argv[2:]
    with open(os.path.join(out, "env_" + os.environ["RANK"] + ".json"), "w") as f:
        json.dump(data, f)
"""

# Each rank records its pid; rank FAIL waits until every rank has, then fails (or is
# killed); the others sleep far longer than the test's patience.
FAIL_ONE = """
    import os, signal, sys, time
    out, fail, how, nproc = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    rank = int(os.environ["RANK"])
    if how == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(out, f"pid_{{rank}}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(out, f"pid_{{rank}}.tmp"), os.path.join(out, f"pid_{{rank}}"))
    def dead(pid):
        try:
            with open(f"/proc/{{pid}}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True
    if rank == fail:
        while len([n for n in os.listdir(out) if n.startswith("pid_") and "." not in n]) < nproc:
            time.sleep(0.02)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(3)
    if how == "cascade":  # die of the failing rank's death, as a peer would
        while not os.path.exists(os.path.join(out, f"pid_{{fail}}")):
            time.sleep(0.01)
        pid = int(open(os.path.join(out, f"pid_{{fail}}")).read())
        while not dead(pid):
            time.sleep(0.001)
        time.sleep(0.2)  # a peer learns of a death through its connections, not at once
        sys.exit(7)
    time.sleep(300)
"""


def _pids(out: Path, n: int) -> dict[int, int]:
    return {r: int((out / f"pid_{r}").read_text()) for r in range(n)}


@pytest.mark.timeout(60)
def test_env_vars(tmp_path: Path) -> None:
    script = _write(tmp_path / "dump.py", DUMP_ENV.format(keys=ENV_KEYS))
    out = tmp_path / "out"
    out.mkdir()
    res = _launch(["--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1",
                   "--master-addr", "127.0.0.2", "--master-port", "31234",
                   str(script), str(out), "--flag", "x"])
    assert res.returncode == 0, res.stderr
    seen = sorted(p.name for p in out.iterdir())
    assert seen == ["env_3.json", "env_4.json", "env_5.json"]
    for local in range(3):
        data = json.loads((out / f"env_{3 + local}.json").read_text())
        assert data == {
            "RANK": str(3 + local), "WORLD_SIZE": "6", "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "1", "NODE_RANK": "1",
            "MASTER_ADDR": "127.0.0.2", "MASTER_PORT": "31234", "argv": ["--flag", "x"],
        }


@pytest.mark.timeout(60)
def test_underscore_spellings_and_module(tmp_path: Path) -> None:
    pkg = tmp_path / "mods"
    pkg.mkdir()
    _write(pkg / "dumpmod.py", DUMP_ENV.format(keys=ENV_KEYS))
    out = tmp_path / "out"
    out.mkdir()
    res = _launch(["--nproc_per_node=2", "--master_port", "40000", "--node_rank", "0",
                   "-m", "dumpmod", str(out)], extra_path=pkg)
    assert res.returncode == 0, res.stderr
    for rank in range(2):
        data = json.loads((out / f"env_{rank}.json").read_text())
        assert data["RANK"] == str(rank) and data["WORLD_SIZE"] == "2"
        assert data["MASTER_PORT"] == "40000" and data["MASTER_ADDR"] == "127.0.0.1"


@pytest.mark.timeout(60)
def test_failing_rank_stops_the_job(tmp_path: Path) -> None:
    script = _write(tmp_path / "fail.py", FAIL_ONE.format())
    # The others sleep 300 s: _launch's timeout (45 s) fails the test if the launcher waited.
    res = _launch(["--nproc-per-node", "3", str(script), str(tmp_path), "1", "exit", "3"])
    assert res.returncode == 3
    assert "pyc10d.run: rank 1 exited with code 3" in res.stderr
    for rank, pid in _pids(tmp_path, 3).items():
        assert not _alive(pid), f"rank {rank} (pid {pid}) outlived the launcher"


@pytest.mark.timeout(60)
def test_first_failure_is_reported(tmp_path: Path) -> None:
    # rank 2 fails; ranks 0 and 1 exit 7 right after it: rank 2 is the one to blame
    script = _write(tmp_path / "fail.py", FAIL_ONE.format())
    res = _launch(["--nproc-per-node", "3", str(script), str(tmp_path), "2", "cascade", "3"])
    assert res.returncode == 3, res.stderr
    assert "pyc10d.run: rank 2 exited with code 3" in res.stderr
    assert "rank 0" not in res.stderr and "rank 1" not in res.stderr


@pytest.mark.timeout(60)
def test_killed_rank_reports_signal(tmp_path: Path) -> None:
    script = _write(tmp_path / "fail.py", FAIL_ONE.format())
    res = _launch(["--nproc-per-node", "2", str(script), str(tmp_path), "0", "kill", "2"])
    assert res.returncode == 128 + signal.SIGKILL
    assert "pyc10d.run: rank 0 exited with code -9 (SIGKILL)" in res.stderr
    assert not any(_alive(pid) for pid in _pids(tmp_path, 2).values())


@pytest.mark.timeout(60)
def test_ranks_ignoring_sigterm_get_killed(tmp_path: Path) -> None:
    script = _write(tmp_path / "fail.py", FAIL_ONE.format())
    # Rank 0 ignores SIGTERM and sleeps 300 s: _launch's timeout (45 s) fails the test if the
    # launcher did not kill it after the 1 s --term-timeout.
    res = _launch(["--nproc-per-node", "2", "--term-timeout", "1", str(script),
                   str(tmp_path), "1", "ignore-term", "2"])
    assert res.returncode == 3
    assert not any(_alive(pid) for pid in _pids(tmp_path, 2).values())


def _sleeping_job(tmp_path: Path, *flags: str) -> subprocess.Popen[str]:
    """A launcher (``flags`` added) with 2 ranks that sleep, once both have recorded their pid."""
    script = _write(tmp_path / "fail.py", FAIL_ONE.format())
    # fail = -1: nobody fails, every rank sleeps.
    launcher = subprocess.Popen(
        [sys.executable, "-m", "pyc10d.run", "--nproc-per-node", "2", *flags, str(script),
         str(tmp_path), "-1", "exit", "2"],
        env=_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("pid_[0-9]"))) < 2:
        if time.monotonic() > deadline or launcher.poll() is not None:
            launcher.kill()
            _, err = launcher.communicate()
            pytest.fail(f"ranks never started: {err[-2000:]}")
        time.sleep(0.05)
    return launcher


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_is_forwarded(tmp_path: Path, sig: signal.Signals) -> None:
    launcher = _sleeping_job(tmp_path)
    try:
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + sig
    assert signal.Signals(sig).name in err
    assert not any(_alive(pid) for pid in _pids(tmp_path, 2).values())


@pytest.mark.timeout(60)
def test_bad_arguments() -> None:
    res = _launch(["--nproc-per-node", "0", "x.py"])
    assert res.returncode == 2
    assert "nproc-per-node" in res.stderr


@pytest.mark.timeout(60)
def test_rdzv_endpoint_sets_master(tmp_path: Path) -> None:
    script = _write(tmp_path / "dump.py", DUMP_ENV.format(keys=ENV_KEYS))
    out = tmp_path / "out"
    out.mkdir()
    res = _launch(["--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
                   "--rdzv_endpoint=127.0.0.3:31999", str(script), str(out)])
    assert res.returncode == 0, res.stderr
    for rank in (2, 3):
        data = json.loads((out / f"env_{rank}.json").read_text())
        assert (data["MASTER_ADDR"], data["MASTER_PORT"], data["WORLD_SIZE"]) == \
            ("127.0.0.3", "31999", "4")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("endpoint, want", [
    ("node7:29400", ("node7", 29400)),
    ("10.0.0.1", ("10.0.0.1", 29500)),
    ("[fe80::1]:1234", ("fe80::1", 1234)),
    ("[::1]", ("::1", 29500)),
    ("::1", ("::1", 29500)),
])
def test_split_endpoint(endpoint: str, want: tuple[str, int]) -> None:
    from pyc10d.run import split_endpoint

    assert split_endpoint(endpoint) == want


@pytest.mark.timeout(10)
@pytest.mark.parametrize("endpoint", ["host:0", "host:http", ":29500", "[::1", "[::1]x"])
def test_split_endpoint_errors(endpoint: str) -> None:
    from pyc10d.run import split_endpoint

    with pytest.raises(ValueError, match="bad --rdzv-endpoint"):
        split_endpoint(endpoint)


@pytest.mark.timeout(60)
def test_rdzv_endpoint_conflicts_with_master_addr() -> None:
    res = _launch(["--rdzv-endpoint", "h:1", "--master-addr", "h", "x.py"])
    assert res.returncode == 2
    assert "either --rdzv-endpoint or --master-addr" in res.stderr
    res = _launch(["--rdzv-endpoint", "h:99999", "x.py"])
    assert res.returncode == 2 and "port '99999'" in res.stderr


# -- --start-method fork: ranks forked from the launcher ----------------------------------------
FORKED = """
    import atexit, json, os, sys, threading, time
    out = sys.argv[1]
    rank = os.environ["RANK"]
    data = {{k: os.environ.get(k) for k in {keys!r}}}
    data.update(argv=sys.argv[1:], name=__name__, path0=sys.path[0], pid=os.getpid(),
                ppid=os.getppid(), torch_loaded="torch" in sys.modules, omp=os.environ.get("OMP_NUM_THREADS"))
    with open(os.path.join(out, "env_" + rank + ".json"), "w") as f:
        json.dump(data, f)
    def late():  # a non-daemon thread: the rank waits for it before its atexit handlers
        time.sleep(0.2)
        open(os.path.join(out, "thread_" + rank), "w").close()
    threading.Thread(target=late).start()
    atexit.register(lambda: open(os.path.join(out, "atexit_" + rank), "w").write(
        str(os.path.exists(os.path.join(out, "thread_" + rank)))))
    print("rank " + rank + " says hello", flush=False)  # one string: one write, whole (ranks share the pipe)
    if rank == "1":  # its failure stops the others (SIGTERM): first let rank 0 finish its own exit
        t0 = time.monotonic()
        done = os.path.join(out, "atexit_0")
        while not (os.path.exists(done) and os.path.getsize(done)) and time.monotonic() - t0 < 20:
            time.sleep(0.01)  # (written and closed, not only created)
    sys.exit(int(sys.argv[2]) if rank == "1" else 0)
"""


@pytest.mark.timeout(60)
def test_fork_start_runs_the_script_as_python_would(tmp_path: Path) -> None:
    """Each rank is a child of the launcher with torch already imported, and otherwise sees what
    a fresh ``python -u script`` sees: its environment, ``__main__``, argv, ``sys.path[0]``;
    non-daemon threads joined, then atexit, then the exit code of ``sys.exit``."""
    script = _write(tmp_path / "forked.py", FORKED.format(keys=ENV_KEYS))
    out = tmp_path / "out"
    out.mkdir()
    launcher = subprocess.run([sys.executable, "-m", "pyc10d.run", "--nproc-per-node", "2", "--start-method",
                               "fork", "--master-port", "31235", str(script), str(out), "5"],
                              env={k: v for k, v in _env().items() if k != "OMP_NUM_THREADS"},
                              capture_output=True, text=True, timeout=45)
    assert launcher.returncode == 5, launcher.stderr
    assert "pyc10d.run: rank 1 exited with code 5" in launcher.stderr
    for rank in range(2):
        data = json.loads((out / f"env_{rank}.json").read_text())
        assert data["RANK"] == str(rank) and data["LOCAL_WORLD_SIZE"] == "2" and data["MASTER_PORT"] == "31235"
        assert data["argv"] == [str(out), "5"] and data["name"] == "__main__"
        assert data["path0"] == str(tmp_path) and data["torch_loaded"] and data["omp"] == "1"
        assert (out / f"atexit_{rank}").read_text() == "True"  # the thread had finished
    assert "rank 0 says hello" in launcher.stdout  # flushed at exit though print did not


@pytest.mark.timeout(60)
def test_fork_start_module_and_failures(tmp_path: Path) -> None:
    """``-m`` under fork, then the failure paths: a rank SIGKILLed is named with its signal, an
    exception's traceback reaches stderr (exit code 1) and the other ranks are stopped."""
    pkg = tmp_path / "mods"
    pkg.mkdir()
    _write(pkg / "dumpmod.py", DUMP_ENV.format(keys=ENV_KEYS))
    out = tmp_path / "out"
    out.mkdir()
    res = _launch(["--nproc-per-node", "2", "--start-method", "fork", "-m", "dumpmod", str(out)], extra_path=pkg)
    assert res.returncode == 0, res.stderr
    assert {json.loads((out / f"env_{r}.json").read_text())["RANK"] for r in range(2)} == {"0", "1"}

    script = _write(tmp_path / "fail.py", FAIL_ONE.format())
    res = _launch(["--nproc-per-node", "2", "--start-method", "fork", str(script), str(tmp_path), "0", "kill", "2"])
    assert res.returncode == 128 + signal.SIGKILL, res.stderr
    assert "pyc10d.run: rank 0 exited with code -9 (SIGKILL)" in res.stderr
    assert not any(_alive(pid) for pid in _pids(tmp_path, 2).values())

    boom = _write(tmp_path / "boom.py", """
        import os
        if os.environ["RANK"] == "1":
            raise ValueError("rank one is unhappy")
        import time
        time.sleep(300)
    """)
    res = _launch(["--nproc-per-node", "2", "--start-method", "fork", "--term-timeout", "1", str(boom)])
    assert res.returncode == 1, res.stderr
    assert "ValueError: rank one is unhappy" in res.stderr and "pyc10d.run: rank 1 exited with code 1" in res.stderr


@pytest.mark.timeout(60)
def test_fork_start_forwards_sigint(tmp_path: Path) -> None:
    """Ctrl-C to the launcher: forked ranks get KeyboardInterrupt and die of SIGINT, as a
    fresh interpreter would; the launcher exits 128 + SIGINT."""
    launcher = _sleeping_job(tmp_path, "--start-method", "fork")
    try:
        pids = _pids(tmp_path, 2)
        assert all(int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]) == launcher.pid
                   for pid in pids.values())  # children of the launcher itself
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + signal.SIGINT, err
    assert "KeyboardInterrupt" in err
    assert not any(_alive(pid) for pid in pids.values())


@pytest.mark.timeout(60)
def test_the_launcher_itself_does_not_import_torch(tmp_path: Path) -> None:
    """``python -m pyc10d.run`` (exec start) leaves torch out of its own process: the rank
    looks at its parent's memory map (the launcher's) and at its own modules."""
    script = _write(tmp_path / "look.py", """
        import os, sys
        maps = open(f"/proc/{os.getppid()}/maps").read()
        open(sys.argv[1], "w").write(f"{'libtorch' in maps} {'torch' in sys.modules}")
    """)
    res = _launch(["--nproc-per-node", "1", str(script), str(tmp_path / "seen")])
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "seen").read_text() == "False False"


AFFINITY = """
    import json, os, sys
    with open(os.path.join(sys.argv[1], os.environ["LOCAL_RANK"]), "w") as f:
        json.dump(sorted(os.sched_getaffinity(0)), f)
"""


@pytest.mark.parametrize("start", ["exec", pytest.param("fork", marks=pytest.mark.full)])
def test_bind_to_core_pins_each_local_rank_to_its_own_cpu(tmp_path: Path, start: str) -> None:
    """``--bind-to core`` (as mpirun binds two ranks): rank i on the i-th CPU of the launcher's
    set; unpinned by default, and with more ranks than CPUs (said on stderr)."""
    script = _write(tmp_path / "aff.py", AFFINITY)
    cpus = sorted(os.sched_getaffinity(0))
    n = min(2, len(cpus))
    res = _launch(["--nproc-per-node", str(n), "--bind-to", "core", "--start-method", start, str(script),
                   str(tmp_path)])
    assert res.returncode == 0, res.stderr
    assert [json.loads((tmp_path / str(i)).read_text()) for i in range(n)] == [[c] for c in cpus[:n]]
    res = _launch(["--nproc-per-node", str(n), "--start-method", start, str(script), str(tmp_path)])
    assert res.returncode == 0, res.stderr
    assert [json.loads((tmp_path / str(i)).read_text()) for i in range(n)] == [cpus] * n
    over = len(cpus) + 1
    res = _launch(["--nproc-per-node", str(over), "--bind-to", "core", "--start-method", start, str(script),
                   str(tmp_path)])
    assert res.returncode == 0, res.stderr
    assert f"--bind-to core: {over} ranks, {len(cpus)} CPUs: ranks left unpinned" in res.stderr
    assert [json.loads((tmp_path / str(i)).read_text()) for i in range(over)] == [cpus] * over
