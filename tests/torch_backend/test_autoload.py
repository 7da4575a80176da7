"""No import line: torch's backend autoload registers pyc10d's names on ``import torch``.

pyc10d declares ``_pyc10d_autoload:register`` in the ``torch.backends`` entry-point group, so a
program (or a launcher config, or Lightning's ``process_group_backend``) that only names
``"pyc10d"`` runs on it. Checked in fresh interpreters: from this (editable) install, from a
normal install into a new virtualenv, under torch's own torchrun, and switched off with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path

import pytest
import torch.distributed as tdist

import _pyc10d_autoload
import pyc10d.torch_backend as tb
from pyc10d.torch_version import AT_LEAST_2_14

pytestmark = pytest.mark.interpreters
ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import sys, torch.distributed as d; "
         "print('pyc10d' in d.Backend.backend_list, 'pyc10d_shm' in d.Backend.backend_list, "
         "'pyc10d' in sys.modules, d.Backend.default_device_backend_map['cpu'])")


def _python(python: str, code: str, **env: str) -> str:
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env}, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_names_are_the_plugins() -> None:
    assert set(_pyc10d_autoload.NAMES) == set(tb.BACKENDS)


@pytest.mark.timeout(60)
def test_import_torch_registers_pyc10d_lazily() -> None:
    # registered, pyc10d itself not imported, torch's default CPU backend untouched
    assert _python(sys.executable, PROBE) == "True True False gloo"
    assert _python(sys.executable, PROBE, TORCH_DEVICE_BACKEND_AUTOLOAD="0") == "False False False gloo"


def test_a_failing_registration_warns_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(tdist.Backend, "_plugins", {})
    monkeypatch.setattr(tdist.Backend, "register_backend", broken)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _pyc10d_autoload.register()
    assert any("could not register" in str(w.message) and "boom" in str(w.message) for w in seen)


SCRIPT = textwrap.dedent("""
    import sys

    import torch
    import torch.distributed as dist

    dist.init_process_group("pyc10d")
    t = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 3.0, 3.0], t
    # one write per rank (the ranks share torchrun's stdout: print's pieces could interleave)
    line = f"rank {dist.get_rank()} {type(dist.distributed_c10d._get_default_group()).__name__}"
    sys.stdout.write(line + chr(10))
    sys.stdout.flush()
    dist.destroy_process_group()
""")


@pytest.mark.timeout(90)
def test_torchrun_runs_a_script_that_never_names_pyc10d(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True, text=True, timeout=80, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rank 0 TorchProcessGroup" in out.stdout and "rank 1 TorchProcessGroup" in out.stdout, out.stdout


@pytest.mark.timeout(90)
def test_with_autoload_off_torch_2_14_finds_pyc10d_by_its_entry_point(tmp_path: Path) -> None:
    """torch 2.14 loads the ``torch.distributed.backends`` entry point named like the backend
    that ``init_process_group`` meets; torch 2.13 has no such discovery: there the script
    fails, saying the backend is unknown."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True, text=True, timeout=80, cwd=tmp_path,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    if AT_LEAST_2_14:
        assert out.returncode == 0, out.stdout + out.stderr
        assert "rank 0 TorchProcessGroup" in out.stdout and "rank 1 TorchProcessGroup" in out.stdout, out.stdout
    else:
        assert out.returncode != 0 and "PYC10D" in out.stderr.upper(), out.stdout + out.stderr


@pytest.mark.timeout(120)
def test_a_normal_install_in_a_fresh_venv(tmp_path: Path) -> None:
    """A wheel of this tree, ``pip install``ed (not editable) into a new virtualenv; torch
    comes from this one's site-packages through a ``.pth`` line (no second 700 MB download).
    This venv's pip builds the wheel and installs it there (``pip --python``): the new venv
    needs no pip or setuptools of its own."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "_pyc10d_autoload.py"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "pyc10d", src / "pyc10d", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = str(venv / "bin" / "python")
    site = _python(py, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    Path(site, "torch_from_parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=100)
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    (built,) = (tmp_path / "dist").glob("pyc10d-*.whl")
    # Into this venv, dependencies and all: the torch here (2.13 or 2.14) satisfies the wheel,
    # so pip would install pyc10d alone and change no torch package.
    plan = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "-q", "--report", "-",
                           str(built)], capture_output=True, text=True, timeout=100)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert [i["metadata"]["name"] for i in json.loads(plan.stdout)["install"]] == ["pyc10d"], plan.stdout
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index", str(built)],
                         capture_output=True, text=True, timeout=100)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    probe, where = _python(py, PROBE + "; import pyc10d; print(pyc10d.__file__)").splitlines()
    assert probe == "True True False gloo"
    assert where.startswith(site), where  # the installed copy, not this checkout
