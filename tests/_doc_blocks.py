"""The ```python blocks of README.md and docs/*.md, with the marker that says how each runs.

A marker is an HTML comment on the last non-blank line before the block's fence (invisible
on GitHub):

* ``<!-- run: python -->``: the block is a script, run alone in one process;
* ``<!-- run: pyc10d.run N -->``: a script run as ``python -m pyc10d.run --nproc-per-node N``
  would run it (``env://`` variables set, one process per rank);
* ``<!-- run: threaded N -->``: run by N threads of one process, each rank's thread after
  ``pyc10d.init_process_group("threaded", rank=r, world_size=N, store=<shared>)``;
* ``<!-- run: no (why) -->``: shown, not run; the reason is required.

Each block is pinned by a hash of its text in ``tests/test_docs_examples.py``, next to what
its run must print, so a block cannot change without its test being looked at.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^\s*<!--\s*run:\s*(python|pyc10d\.run (\d+)|threaded (\d+)|no \((.+)\))\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    code: str
    marker: str | None  # the marker's text after "run:", None when missing or malformed
    mode: str | None  # "python", "pyc10d.run", "threaded", "no"
    ranks: int = 1

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()[:12]

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every ```python block of one file, with its marker."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    rel = path.relative_to(ROOT).as_posix()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        start = i
        i += 1
        body = []
        while i < len(lines) and not re.match(rf"^{re.escape(indent)}```\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1  # the closing fence
        if lang != "python":
            continue
        prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mk = MARKER.match(prev)
        if mk is None:
            out.append(Block(rel, start + 1, "\n".join(body) + "\n", None, None))
            continue
        text = mk.group(1)
        mode = text.split(" ", 1)[0]
        ranks = int(mk.group(2) or mk.group(3) or 1)
        out.append(Block(rel, start + 1, "\n".join(body) + "\n", text, mode, ranks))
    return out


def all_blocks() -> list[Block]:
    return [b for f in doc_files() for b in blocks(f)]
