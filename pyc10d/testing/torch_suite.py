"""Run torch's own backend suite on pyc10d beside Gloo and print the comparison table.

``python -m pyc10d.testing.torch_suite`` (``make torch-suite``) runs torch's
``distributed_test`` suite (the one torch's ``test_distributed_spawn.py`` drives) once per
configuration, each in a fresh interpreter because torch's module decides at import which tests
apply to ``BACKEND``:

* the *plugin pass*: Gloo, then pyc10d_shm and pyc10d_tcp at world size 2 and Gloo and
  pyc10d_shm at world size 4, pyc10d declared as a plugin with DDP and subgroups
  (``torch_suite_case.FEATURES``);
* the *gloo-name pass*: the tests Gloo passed that the plugin pass skipped, run again with
  ``BACKEND=gloo`` while every "gloo" group is a pyc10d group (``PYC10D_SERVE_GLOO=shm|tcp``, the
  setting users have for frameworks that hard-code the name). These
  are the tests torch gates on the name gloo; run this way only checks of the name itself can
  tell the two apart.

Ranks are forked from an interpreter that has imported torch and the suite (``--start fork``,
the default): torch's own driver spawns fresh interpreters (``--start spawn``), which costs about
45 s a test on a loaded 2-core machine against under a second forked; the tests are the same.

Results go to ``benchmarks/results/torch_suite/<pass>-<backend>-<world>.json`` (one record per
test: outcome, reason, seconds) and the table (``table.md`` there too) lists, for every test
Gloo passes that pyc10d does not pass in either pass, the reason. A test pyc10d passes only under
the name gloo is listed apart with torch's reason for refusing other names: those are torch's
refusals, not pyc10d's gaps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import unittest
from pathlib import Path
from typing import Any

RESULTS = Path("benchmarks/results/torch_suite")
#: (backend, world size) of the plugin pass; Gloo runs at every world size that pyc10d does.
CONFIGS: tuple[tuple[str, int], ...] = (
    ("gloo", 2), ("pyc10d_shm", 2), ("pyc10d_tcp", 2), ("gloo", 4), ("pyc10d_shm", 4),
)
PER_TEST_TIMEOUT_S = 120


# -- one configuration, in this interpreter ---------------------------------------------------
class Recorder(unittest.TextTestResult):
    """Keeps each test's outcome, its reason (skip reason or the error's last lines) and time,
    under its name (``name``: torchft's suite keys them by class too)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records: dict[str, dict[str, Any]] = {}
        self._t0 = 0.0

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's name
        self._t0 = time.monotonic()
        super().startTest(test)

    @staticmethod
    def name(test: unittest.TestCase) -> str:
        return test.id().rsplit(".", 1)[-1]

    def _put(self, test: unittest.TestCase, outcome: str, reason: str = "") -> None:
        self.records[self.name(test)] = {"outcome": outcome, "reason": reason.strip(),
                                         "seconds": round(time.monotonic() - self._t0, 2)}

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addSuccess(test)
        self._put(test, "passed")

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self._put(test, "skipped", reason)

    def _fail(self, test: unittest.TestCase, err: Any) -> None:
        self._put(test, "failed", _summary(self._exc_info_to_string(err, test)))

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self._fail(test, err)

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self._fail(test, err)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)
        self._put(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._put(test, "failed", "unexpected success")


def _summary(text: str, limit: int = 600) -> str:
    """The lines of a failure that say what went wrong: the last exception lines of each rank."""
    keep = [ln for ln in text.splitlines()
            if ln.strip() and not ln.startswith((" ", "Traceback", "During handling", "The above"))]
    out = " | ".join(dict.fromkeys(keep))  # de-duplicated, in order
    return out[-limit:]


def run_config(backend: str, world_size: int, out: Path, only: list[str] | None,
               pattern: str | None, gloo_as: str | None, start: str) -> dict[str, Any]:
    """Run the suite for one backend in this interpreter (the env must be set before import)."""
    os.environ.update(BACKEND=backend, WORLD_SIZE=str(world_size))
    os.environ["PYC10D_SUITE_START"] = start
    os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", str(PER_TEST_TIMEOUT_S))
    if gloo_as:
        os.environ["PYC10D_SERVE_GLOO"] = gloo_as
    from pyc10d.testing import torch_suite_case as case

    cls = case.TestDistBackendWithSpawn
    names = sorted(n for n in dir(cls) if n.startswith("test_"))
    if only is not None:
        names = [n for n in names if n in set(only)]
    if pattern:
        names = [n for n in names if pattern in n]
    suite = unittest.TestSuite(cls(n) for n in names)
    runner = unittest.TextTestRunner(resultclass=Recorder, verbosity=2, stream=sys.stderr)
    t0 = time.monotonic()
    result = runner.run(suite)
    import torch

    report = {"backend": backend, "world_size": world_size, "gloo_as": gloo_as, "start": start,
              "torch": torch.__version__, "seconds": round(time.monotonic() - t0, 1),
              "tests": result.records}  # type: ignore[attr-defined]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, sort_keys=True))
    return report


# -- the whole comparison, one subprocess per configuration -----------------------------------
def _path(kind: str, backend: str, world_size: int) -> Path:
    return RESULTS / f"{kind}-{backend}-{world_size}.json"


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _child(args: list[str], log: Path) -> None:
    """One configuration in a fresh interpreter; a ``PYC10D_SERVE_GLOO`` of the caller's is not
    passed on (torch's autoload would make the Gloo reference pyc10d): ``--gloo-as`` sets it."""
    cmd = [sys.executable, "-m", "pyc10d.testing.torch_suite", "one", *args]
    env = {k: v for k, v in os.environ.items() if k != "PYC10D_SERVE_GLOO"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False, env=env)


def _count(tests: dict[str, Any], outcome: str) -> int:
    return sum(1 for r in tests.values() if r["outcome"] == outcome)


def _passed(report: dict[str, Any] | None) -> set[str]:
    if report is None:
        return set()
    return {n for n, r in report["tests"].items() if r["outcome"] == "passed"}


def run_all(configs: list[tuple[str, int]], start: str, reuse: bool, pattern: str | None) -> None:
    """Both passes for every configuration, then the table (printed and saved)."""
    for backend, ws in configs:
        path = _path("plugin", backend, ws)
        if reuse and path.exists():
            continue
        t0 = time.monotonic()
        print(f"torch-suite: {backend} world size {ws} ...", flush=True)
        extra = ["-k", pattern] if pattern else []
        _child(["--backend", backend, "--world-size", str(ws), "--json", str(path),
                "--start", start, *extra], path.with_suffix(".log"))
        print(f"  done in {time.monotonic() - t0:.0f} s", flush=True)
    for backend, ws in configs:
        if backend == "gloo":
            continue
        gloo = _passed(_load(_path("plugin", "gloo", ws)))
        mine = _load(_path("plugin", backend, ws))
        if mine is None:
            continue
        todo = sorted(n for n in gloo if mine["tests"].get(n, {}).get("outcome") == "skipped")
        path = _path("gloo-name", backend, ws)
        if not todo or (reuse and path.exists()):
            continue
        t0 = time.monotonic()
        print(f"torch-suite: {len(todo)} gloo-gated tests on {backend} world size {ws} ...",
              flush=True)
        _child(["--backend", "gloo", "--world-size", str(ws), "--json", str(path), "--start", start,
                "--gloo-as", backend.removeprefix("pyc10d_"), "--only", ",".join(todo)],
               path.with_suffix(".log"))
        print(f"  done in {time.monotonic() - t0:.0f} s", flush=True)
    table = render(configs)
    (RESULTS / "table.md").write_text(table)
    print(table)


def render(configs: list[tuple[str, int]]) -> str:
    """The README's table: counts per configuration, then every gap with its reason."""
    rows = ["| backend | world size | passed | failed | skipped | Gloo passed | "
            "passed under the name gloo | Gloo passes, pyc10d does not | seconds |",
            "|---|---|---|---|---|---|---|---|---|"]
    gaps: list[str] = []
    refusals: dict[str, tuple[list[str], str]] = {}  # test -> (configurations, torch's reason)
    for backend, ws in configs:
        rep = _load(_path("plugin", backend, ws))
        if rep is None:
            continue
        t = rep["tests"]
        gloo_rep = _load(_path("plugin", "gloo", ws))
        gloo = _passed(gloo_rep)
        if backend == "gloo":
            rows.append(f"| gloo | {ws} | {_count(t, 'passed')} | {_count(t, 'failed')} | "
                        f"{_count(t, 'skipped')} | - | - | - | {rep['seconds']:.0f} |")
            continue
        alias = _load(_path("gloo-name", backend, ws))
        alias_passed = _passed(alias)
        plugin_passed = _passed(rep)
        missing = sorted(gloo - plugin_passed - alias_passed)
        for name in sorted(alias_passed & (gloo - plugin_passed)):
            reason = t[name]["reason"].replace(backend, "<backend>")
            refusals.setdefault(name, ([], reason))[0].append(f"{backend} {ws}")
        for name in missing:
            rec = (alias or {}).get("tests", {}).get(name) or t.get(name) or {}
            how = "under the name gloo" if name in (alias or {}).get("tests", {}) else "as plugin"
            gaps.append(f"- `{name}` ({backend}, {ws}, {how}): {rec.get('outcome', 'not run')}: "
                        f"{rec.get('reason', '')}")
        rows.append(f"| {backend} | {ws} | {_count(t, 'passed')} | {_count(t, 'failed')} | "
                    f"{_count(t, 'skipped')} | {len(gloo)} | {len(alias_passed)} | {len(missing)} "
                    f"| {rep['seconds']:.0f} |")
    first = next((r for r in map(_load, (_path("plugin", b, w) for b, w in configs)) if r), None)
    head = (f"torch {first['torch']}, ranks started by {first['start']}; pyc10d declared to the "
            f"suite as a plugin with ddp and subgroup.\n\n") if first else ""
    out = head + "\n".join(rows) + "\n\nTests Gloo passes that pyc10d does not:\n\n"
    out += "\n".join(gaps) if gaps else "- none"
    out += "\n\nTests torch refuses to run on a backend not named gloo (pyc10d passes them "
    listed = [f"- `{n}` ({', '.join(where)}): {why}" for n, (where, why) in sorted(refusals.items())]
    out += "under the name gloo), with torch's reason:\n\n" + ("\n".join(listed) or "- none") + "\n"
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    one = sub.add_parser("one", help="one configuration in this interpreter")
    one.add_argument("--backend", required=True)
    one.add_argument("--world-size", type=int, required=True)
    one.add_argument("--json", type=Path, required=True)
    one.add_argument("--only", default=None, help="comma-separated test names")
    one.add_argument("-k", dest="pattern", default=None, help="substring of test names")
    one.add_argument("--gloo-as", default=None, choices=("shm", "tcp"))
    one.add_argument("--start", default="fork", choices=("spawn", "fork"))
    p.add_argument("--configs", default=",".join(f"{b}:{w}" for b, w in CONFIGS))
    p.add_argument("--start", default="fork", choices=("spawn", "fork"),
                   help="how ranks start: fork (ms) or spawn (torch's own driver; ~45 s a test here)")
    p.add_argument("--reuse", action="store_true", help="keep results already saved")
    p.add_argument("--table", action="store_true", help="only print the table of saved results")
    p.add_argument("-k", dest="pattern", default=None, help="substring of test names")
    a = p.parse_args(argv)
    if a.cmd == "one":
        only = a.only.split(",") if a.only else None
        run_config(a.backend, a.world_size, a.json, only, a.pattern, a.gloo_as, a.start)
        return
    configs = [(b, int(w)) for b, w in (c.split(":") for c in a.configs.split(","))]
    if a.table:
        print(render(configs))
        return
    run_all(configs, a.start, a.reuse, a.pattern)


if __name__ == "__main__":
    main()
