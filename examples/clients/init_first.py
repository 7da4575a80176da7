"""Run a script unchanged with the default group already made on the backend named first.

``torchrun --nproc-per-node 2 examples/clients/init_first.py pyc10d script.py args...``: the
recipe for a framework that builds its group only when none exists (accelerate's
``Accelerator()``, Lightning's strategies): ``init_process_group("pyc10d")`` comes first, the
framework then finds the group made and uses it. ``pyc10d.testing.clients`` runs
``accelerate_ddp.py`` this way.
"""

from __future__ import annotations

import runpy
import sys

import torch.distributed as dist


def main() -> None:
    backend, script, *rest = sys.argv[1:]
    dist.init_process_group(backend)
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
