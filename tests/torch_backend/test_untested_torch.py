"""A torch pyc10d was not tested on: ``import torch`` still works, and pyc10d refuses by name.

pyproject admits the next torch minor, untested. What the plugin needs of torch is checked by
feature (``pyc10d.torch_version.PLUGIN_NEEDS``): here a fresh interpreter loses one such name
while ``import torch`` runs (when torch's backend autoload loads pyc10d's hook, after torch's
own modules), as a torch that dropped it would look. ``import torch`` must succeed
(pyc10d warns, naming the torch version), and ``init_process_group("pyc10d")`` must fail
saying the torch version and the missing name.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from packaging.requirements import Requirement

from pyc10d import info
from pyc10d.torch_version import AT_LEAST_2_14

# One fresh interpreter a test: torch 2.14.1's CUDA build imports in 10-20 s on a loaded 2-core
# machine (measured), so the bound leaves room for that, not for a hang.
pytestmark = [pytest.mark.interpreters, pytest.mark.timeout(90)]

SCRIPT = textwrap.dedent("""
    import importlib.abc, importlib.util, sys, warnings

    TARGET = sys.argv[1]  # e.g. "_C._distributed_c10d.AllToAllOptions" (from torch), or "-"

    class DropBeforePyc10d(importlib.abc.MetaPathFinder):
        # Drops TARGET when torch's autoload, at the end of import torch, loads pyc10d's hook:
        # torch's own import is done with it, and pyc10d sees a torch that lacks it.
        def find_spec(self, name, path, target=None):
            if name != "_pyc10d_autoload":
                return None
            sys.meta_path.remove(self)
            if TARGET != "-":
                owner, attr = TARGET.rsplit(".", 1)
                obj = sys.modules["torch"]
                for part in owner.split("."):
                    obj = getattr(obj, part)
                delattr(obj, attr)
            return None  # (found by the usual finders)

    sys.meta_path.insert(0, DropBeforePyc10d())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import torch
    print("IMPORTED", torch.__version__)
    for w in seen:
        if "pyc10d" in str(w.message):
            print("WARNING", w.message)
    import torch.distributed as dist
    try:
        dist.init_process_group("pyc10d", store=dist.HashStore(), rank=0, world_size=1)
        t = torch.ones(2)
        dist.all_reduce(t)
        print("RAN", t.tolist())
        dist.destroy_process_group()
    except Exception as e:
        print("REFUSED", type(e).__name__, "|", str(e).replace(chr(10), " "))
""")


def _run(target: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, target], capture_output=True, text=True, timeout=80,
                         env=env, cwd="/")
    assert out.returncode == 0 and "IMPORTED" in out.stdout, out.stdout + out.stderr
    return out.stdout


def test_the_harness_runs_pyc10d_when_nothing_is_missing() -> None:
    out = _run("-")
    assert "RAN [1.0, 1.0]" in out and "WARNING" not in out, out


@pytest.mark.parametrize("target", ["_C._distributed_c10d.AllToAllOptions", "_C._distributed_c10d.Work"])
def test_a_name_the_group_needs_is_missing(target: str) -> None:
    """Registration works (it needs neither); building the group is refused by name."""
    out = _run(target)
    assert "WARNING" not in out, out
    refused = next(line for line in out.splitlines() if line.startswith("REFUSED") or line.startswith("RAN"))
    assert refused.startswith("REFUSED DistBackendError"), out
    assert f"torch {torch.__version__}" in refused and f"torch.{target}" in refused, refused
    assert "build a 'pyc10d' group" in refused, refused


def test_registration_itself_is_missing() -> None:
    """torch without ``Backend.register_backend``: ``import torch`` warns and works; on torch
    2.14, ``init_process_group`` asks pyc10d's ``torch.distributed.backends`` entry point,
    which refuses by name; torch 2.13 has no such entry point and says the name is unknown."""
    out = _run("distributed.Backend.register_backend")
    warning = next(line for line in out.splitlines() if line.startswith("WARNING"))
    assert f"torch {torch.__version__}" in warning and "torch.distributed.Backend.register_backend" in warning, out
    refused = next(line for line in out.splitlines() if line.startswith("REFUSED"))
    if AT_LEAST_2_14:
        assert f"torch {torch.__version__}" in refused, refused
        assert "torch.distributed.Backend.register_backend" in refused, refused
    else:
        assert "pyc10d" in refused.lower(), refused


def test_info_says_an_untested_torch_is_untested() -> None:
    code = ("import torch; from torch.torch_version import TorchVersion; "
            "torch.__version__ = TorchVersion('2.15.0'); from pyc10d import info; info.main([])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=80, cwd="/")
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("torch  "))
    assert line == "torch       2.15.0: not tested on torch 2.15.0 (pyc10d is tested on torch 2.13 and 2.14)", line
    here = info.render(info.collect())  # this torch, a tested one: no note
    assert f"torch       {torch.__version__}\n" in here, here


def test_the_metadata_admits_the_next_torch_and_not_the_one_after() -> None:
    """Installing pyc10d into an environment with the next torch minor must not downgrade it
    (the installed metadata: ``make venv`` reinstalls when pyproject.toml changes)."""
    (req,) = [r for r in map(Requirement, importlib.metadata.requires("pyc10d") or []) if r.name == "torch"]
    assert req.specifier.contains(torch.__version__.split("+")[0]), req
    assert req.specifier.contains("2.15.0") and not req.specifier.contains("2.16.0"), req
