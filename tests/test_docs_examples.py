"""Every Python example of README.md and docs/ runs here, as its marker says (tests/_doc_blocks.py).

``PINNED`` records each block by file and the hash of its text, with a line its run must
print (blocks check their own results with ``assert``; the line shows the run reached its end).
A block edited, added or removed without ``PINNED`` following fails
``test_every_block_is_marked_and_pinned``, which prints the new hash: look at what the block
now shows, make its run prove it, then record the hash.

Blocks run in processes forked from this one (torch is imported already): a ``python`` block
as a script, a ``threaded N`` block on N threads of one such process, a ``pyc10d.run N``
block under the launcher's own code (``--start-method fork``), each with a time limit.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest
from _doc_blocks import ROOT, Block, all_blocks

from pyc10d import run_fork

#: (file, sha256[:12] of the block) -> a line the run prints (None: a block that is not run).
PINNED: dict[tuple[str, str], str | None] = {
    # README: the one-line switch, torch's API on 2 ranks with no pyc10d import
    ("README.md", "ce78b736bc29"): "all_reduce on pyc10d",
    # README: the native API tour on 4 ranks (tcp, env://)
    ("README.md", "ff152184fad5"): "mean grad 1.5 gathered [0.0, 1.0, 2.0, 3.0]",
    # api: functional collectives on a 2 x 2 DeviceMesh, results asserted in the block
    ("docs/api.md", "cd8ec6a1ee29"): "functional collectives on a 2 x 2 mesh: ok",
    # api: DDP's two imports resolve (exit 0 is the check)
    ("docs/api.md", "ace49efa03a4"): "",
    # coming from torch: init_process_group("pyc10d") with torch's API only
    ("docs/coming-from-torch.md", "9c9cd638acb2"): "rank 0 on pyc10d",
    # coming from torch: torch.distributed.checkpoint save and load on the plugin
    ("docs/coming-from-torch.md", "777f62b1cfb8"): "checkpoint saved and restored on pyc10d",
    # coming from torch: serve_gloo(), then init_process_group("gloo") runs on pyc10d
    ("docs/coming-from-torch.md", "b46357f79275"): "gloo <pyc10d TorchProcessGroup serving 'gloo'",
    # failures: profiler ranges of a collective
    ("docs/failures.md", "eb5adfd8a053"): "'pyc10d:allreduce'",
    # getting started: hello on 2 ranks, backend auto
    ("docs/getting-started.md", "09aa04bf54cd"): "sum 3.0 from",
    # testing: spawn_threads_and_init_comms, 4 rank-threads in a unittest
    ("docs/testing.md", "84ddccf2f4fa"): "Ran 1 test",
    # testing: the fake backend, rank 3 of 64 alone
    ("docs/testing.md", "0799e414662f"): "rank 3 of 64",
}

BLOCKS = all_blocks()
LIMIT_S = 45  # a block's whole run, ranks included


def test_every_block_is_marked_and_pinned() -> None:
    problems = [f"{b.id}: no `<!-- run: ... -->` marker before the block (see tests/_doc_blocks.py)"
                for b in BLOCKS if b.mode is None]
    found = {(b.path, b.digest): b for b in BLOCKS}
    for key, b in found.items():
        if key not in PINNED:
            first = b.code.strip().splitlines()[0] if b.code.strip() else ""
            problems.append(f"{b.id}: block {key!r} is not in PINNED (new or edited; first line {first!r})")
    problems += [f"PINNED entry {key!r} matches no block (removed or edited)" for key in PINNED if key not in found]
    for key, b in found.items():
        if key in PINNED and (PINNED[key] is None) != (b.mode == "no"):
            problems.append(f"{b.id}: a block that runs needs a line to expect; one that does not, None")
    assert not problems, "\n".join(problems)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _threaded_wrapper(block: Path, n: int) -> str:
    return textwrap.dedent(f"""\
        import pyc10d
        from pyc10d.testing.threaded import ThreadedRun

        code = compile(open({str(block)!r}).read(), {str(block)!r}, "exec")
        run = ThreadedRun({n}, {LIMIT_S - 10})

        def body(rank):
            pyc10d.init_process_group("threaded", rank=rank, world_size={n}, store=run.store)
            exec(code, {{"__name__": "__main__"}})

        run.start(body)
        run.join()
        """)


def _run(b: Block, tmp: Path) -> tuple[int | None, str]:
    script = tmp / "example.py"
    script.write_text(b.code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if b.mode == "python":
        target, module = [str(script)], False
    elif b.mode == "threaded":
        wrapper = tmp / "threaded_ranks.py"
        wrapper.write_text(_threaded_wrapper(script, b.ranks))
        target, module = [str(wrapper)], False
    else:  # pyc10d.run N: the launcher's code in a forked process, its ranks forked from it
        target, module = ["pyc10d.run", "--nproc-per-node", str(b.ranks), "--start-method", "fork",
                          "--master-port", str(_free_port()), str(script)], True
    log = tmp / "output.txt"

    def preexec() -> None:
        os.chdir(tmp)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    proc = run_fork.start(target, module, env, preexec)
    try:
        code = proc.wait(LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the launcher passes it on to its ranks
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        code = None
    return code, log.read_text() if log.exists() else ""


@pytest.mark.timeout(LIMIT_S + 15)
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mode not in (None, "no")], ids=lambda b: b.id)
def test_example_runs(block: Block, tmp_path: Path) -> None:
    expect = PINNED.get((block.path, block.digest))
    if expect is None:
        pytest.fail(f"{block.id} is not pinned: see test_every_block_is_marked_and_pinned")
    code, out = _run(block, tmp_path)
    assert code == 0, f"{block.id} ({block.marker}) " + ("timed out" if code is None else f"exited {code}") + f":\n{out}"
    assert expect in out, f"{block.id} ({block.marker}) did not print {expect!r}:\n{out}"
