"""A real Ray cluster on namespace hosts (``pyc10d.testing.hosts``), and ``make test-ray``.

``Cluster(hosts)``: ``ray start --head`` on h0 and ``ray start --address`` on every other host,
each in its host's namespaces (``--block``: the host's PID namespace lives as long as its
``ray start``), every node ``cpus`` logical CPUs and a small object store. Drivers run on h0
(:meth:`Cluster.run`, ``RAY_ADDRESS`` set).

``python -m pyc10d.testing.raycluster`` (``make test-ray``, in the venv that make target
builds with Ray installed) starts two hosts and a cluster, then runs

* ``examples/ray/train.py``: Ray Train's ``TorchTrainer`` with ``TorchConfig(backend=
  "pyc10d")`` and again with ``"gloo"``, 4 workers (2 per node): each run's losses and
  parameters equal to ``pyc10d.testing.tiny_ddp.reference(4)``, its workers on both hosts,
  its group on the backend asked for;
* ``examples/ray/collective.py``: ``ray.util.collective`` on ``PYC10D``
  (``pyc10d.integrations.ray``) and Ray's ``GLOO`` in the same run: results checked, then
  all-reduce timed at 8 B, 64 KiB and 1 MiB, printed side by side and written to
  ``benchmarks/results/ray_collective.json``.

Exit 1 naming each problem.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .hosts import Hosts

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "ray"
PORT = 6379


class Cluster:
    """A Ray head on ``hosts[0]`` and a worker node on each other host (context manager)."""

    def __init__(self, hosts: Hosts, cpus: int = 2, start_timeout: float = 90.0) -> None:
        ray = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
        if ray is None:
            raise RuntimeError("pyc10d.testing.raycluster: Ray is not installed here (make test-ray installs it)")
        self.hosts = hosts
        self.dir = Path(tempfile.mkdtemp(prefix="pr-"))  # short: Ray's socket paths must fit 107 bytes
        self.address = f"{hosts[0].addr}:{PORT}"
        self.env = dict(os.environ, RAY_ADDRESS=self.address, RAY_USAGE_STATS_ENABLED="0")
        self._nodes: list[subprocess.Popen[Any]] = []
        common = [f"--num-cpus={cpus}", "--num-gpus=0", "--object-store-memory=200000000", "--block",
                  "--disable-usage-stats"]
        try:
            for h in hosts.hosts:
                role = ["--head", f"--port={PORT}", "--include-dashboard=false", f"--temp-dir={self.dir}"] \
                    if h.index == 0 else [f"--address={self.address}"]
                log = open(self.dir / f"ray-{h.name}.log", "w")  # the node keeps its copy; ours is closed below
                self._nodes.append(h.spawn([ray, "start", f"--node-ip-address={h.addr}", *role, *common],
                                           env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT))
                log.close()
                if h.index == 0:
                    self._wait_nodes(1, start_timeout)
            self._wait_nodes(len(hosts), start_timeout)
        except BaseException:
            self.close()
            raise

    def _wait_nodes(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        probe = "import ray; ray.init(); print(sum(1 for x in ray.nodes() if x['Alive']))"
        while True:
            if any(p.poll() is not None for p in self._nodes):
                raise RuntimeError(f"a Ray node exited\n{self.logs()}")
            r = self.run([sys.executable, "-c", probe], timeout=60)
            if r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [str(n)]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray: {n} nodes not alive after {timeout:.0f} s\n{r.stderr[-2000:]}\n{self.logs()}")
            time.sleep(1)

    def run(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a driver on h0 to its end, captured (killed and returned with code -9 after ``timeout``)."""
        # in the head's own namespaces: a driver shares its node's /dev/shm and PIDs
        proc = self.hosts[0].spawn_into(self._nodes[0], argv, env=self.env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n(killed after {timeout:.0f} s)"
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(self.dir.glob("*.log")))

    def close(self) -> None:
        for h in self.hosts.hosts:  # the nodes' namespaces go down with their ray start
            h.kill()
        self._nodes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_train(got: dict | str, backend: str) -> list[str]:
    """Problems with one TorchTrainer run's report (or its failure, a string)."""
    from . import clients, tiny_ddp

    if isinstance(got, str):
        return [got]
    problems = clients.compare("TorchTrainer", f"on {backend}", {**got, "group": "pyc10d"}, tiny_ddp.reference(4))
    if got["group"] != backend:
        problems.append(f"TorchTrainer on {backend}: the workers' group was on {got['group']!r}")
    if sorted(got["hosts"]) != ["h0", "h0", "h1", "h1"]:
        problems.append(f"TorchTrainer on {backend}: workers on {got['hosts']}, not two per host")
    return problems


def check_collective(got: dict) -> list[str]:
    """Problems with ``examples/ray/collective.py``'s results: wrong values, wrong placement."""
    problems = []
    if sorted(got["hosts"]) != ["h0", "h0", "h1", "h1"]:
        problems.append(f"ray.util.collective: actors on {got['hosts']}, not two per host")
    for backend, res in got["backends"].items():
        problems += [f"ray.util.collective on {backend}: {p}" for p in res["problems"]]
        problems += [f"ray.util.collective on {backend}: all-reduce of {row['bytes']} B: wrong result after "
                     f"the timed loop" for row in res["allreduce"] if not row["ok"]]
    return problems


def _driver(cluster: Cluster, script: str, args: list[str], out: Path, timeout: float) -> dict | str:
    r = cluster.run([sys.executable, str(EXAMPLES / script), *args, str(out)], timeout=timeout)
    if r.returncode != 0 or not out.exists():
        return f"{script} {' '.join(args)}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-4000:]}"
    return json.loads(out.read_text())


def _plot(got: dict) -> Any:
    def draw(path: Path) -> bool:
        from ..bench.report import pyplot

        plt = pyplot()
        if plt is None:
            return False
        fig, ax = plt.subplots(figsize=(6, 4))
        for backend, res in got["backends"].items():
            rows = res["allreduce"]
            ax.plot([r["bytes"] for r in rows], [r["us"] for r in rows], marker="o", label=backend)
        ax.set(xscale="log", yscale="log", xlabel="bytes", ylabel="µs per all-reduce (slowest actor)",
               title="ray.util.collective, 4 actors on 2 namespace hosts")
        ax.legend()
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        return True
    return draw


def main(argv: list[str] | None = None) -> int:
    from ..bench.report import finish

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=50, help="all-reduces per timed loop")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per driver")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pyc10d-ray-") as tmp, Hosts(2) as hosts, Cluster(hosts) as cluster:
        for backend in ("pyc10d", "gloo"):
            got = _driver(cluster, "train.py", [backend], Path(tmp) / f"train-{backend}.json", args.timeout)
            found = check_train(got, backend)
            problems += found
            if not found:
                print(f"TorchTrainer(backend={backend!r}): 4 workers on h0, h1; losses and parameters equal "
                      f"to the one-process reference (last loss {got['losses'][-1]:.6f})")  # type: ignore[index]
        col = _driver(cluster, "collective.py", [str(args.iters)], Path(tmp) / "collective.json", args.timeout)
    if isinstance(col, str):
        problems.append(col)
        col = {"hosts": [], "backends": {}}
    else:
        problems += check_collective(col)
        sizes = [r["bytes"] for r in next(iter(col["backends"].values()))["allreduce"]]
        us = {b: [r["us"] for r in res["allreduce"]] for b, res in col["backends"].items()}
        print("ray.util.collective all-reduce, 4 actors (2 per host), µs per call (slowest actor):")
        print(f"{'bytes':>9} " + " ".join(f"{b:>9}" for b in us) + "  GLOO/PYC10D")
        for i, n in enumerate(sizes):
            print(f"{n:>9} " + " ".join(f"{us[b][i]:>9.1f}" for b in us) + f"  {us['GLOO'][i] / us['PYC10D'][i]:>10.2f}")
    return finish(args.out, "ray_collective", {**col, "args": vars(args), "problems": problems}, problems,
                  label="FAILED:", plot=_plot(col) if col["backends"] else None)


if __name__ == "__main__":
    sys.exit(main())
