"""README.md and docs/ against the code: links resolve, the generated tables are what their
generators give today, the environment-variable table names every variable the code reads
(and nothing else), and the names pyc10d leaves out are the test suite's list. The examples
themselves run in ``tests/test_docs_examples.py``."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from _doc_blocks import ROOT, doc_files

from pyc10d.bench import readme, reference
from pyc10d.bench.report import read_json

README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
ENV_NAME = re.compile(r"PYC10D_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")  # not a prefix such as PYC10D_SOCKET_


def test_readme_stays_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # no headings inside code
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)}


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_point_at_files_and_headings_that_exist(doc: Path) -> None:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, "\n".join(broken)


def test_no_page_is_named_after_an_issue() -> None:
    for page in DOCS.glob("*.md"):
        title = page.read_text().splitlines()[0]
        assert not re.search(r"issue|#\d", title + page.name, re.I), f"{page.name}: {title}"


# -- generated tables ----------------------------------------------------------------------
def _reference(block: str) -> Path:
    m = re.search(r"From `(benchmarks/reference/[^`]+\.json)`", block)
    assert m, "the generated block does not name its reference run"
    return ROOT / m.group(1)


def _between(text: str, begin: str, end: str) -> str:
    assert begin in text and end in text, f"no {begin} ... {end} block"
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def test_performance_tables_are_what_the_reference_run_gives() -> None:
    block = _between((DOCS / "collectives-grid.md").read_text(), readme.BEGIN, readme.END)
    ref = _reference(block)
    assert block == readme.markdown(read_json(ref), ref.relative_to(ROOT).as_posix()), \
        "docs/collectives-grid.md's tables differ from `python -m pyc10d.bench.readme <ref> --write docs/collectives-grid.md`"


def test_readme_speed_table_is_what_the_reference_run_gives() -> None:
    block = _between(README.read_text(), readme.HEADLINE_BEGIN, readme.HEADLINE_END)
    ref = _reference(block)
    assert block == readme.headline(read_json(ref), ref.relative_to(ROOT).as_posix()), \
        "README's speed table differs from `python -m pyc10d.bench.readme <ref> --headline README.md`"
    # the same run as the manual's tables
    assert ref == _reference(_between((DOCS / "collectives-grid.md").read_text(), readme.BEGIN, readme.END))


# -- coming from torch: the names pyc10d leaves out ----------------------------------------
def _absent_in_tests() -> set[str]:
    tree = ast.parse((ROOT / "tests" / "test_public_api.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "ABSENT":
            return set(ast.literal_eval(node.value))
    raise AssertionError("tests/test_public_api.py has no ABSENT")


def test_coming_from_torch_lists_exactly_the_names_left_out() -> None:
    block = _between((DOCS / "coming-from-torch.md").read_text(), "<!-- absent-names:begin -->",
                     "<!-- absent-names:end -->")
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    listed = [n for row in rows for n in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
    assert len(listed) == len(set(listed)), "a name is listed twice"
    absent = _absent_in_tests()
    assert set(listed) == absent, (f"docs/coming-from-torch.md lists {sorted(set(listed) - absent)} that pyc10d has, "
                                   f"and misses {sorted(absent - set(listed))} (tests/test_public_api.py's ABSENT)")


def test_the_changelog_has_a_section_for_this_version() -> None:
    """CHANGELOG.md (Keep a Changelog) has a dated section for the version pyproject.toml
    declares, the one ``pyc10d.__version__`` reports: a release cannot go out unrecorded."""
    import pyc10d

    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared is not None, "pyproject.toml declares no version"
    assert pyc10d.__version__ == declared.group(1), "pyc10d.__version__ and pyproject.toml's version differ"
    sections = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?", (ROOT / "CHANGELOG.md").read_text(), re.M)
    dated = {version: date for version, date in sections if date}
    assert declared.group(1) in dated, f"CHANGELOG.md has no dated section for {declared.group(1)}: {sections}"
    assert not re.search(r"#\d+|issue \d+", (ROOT / "CHANGELOG.md").read_text(), re.I), "issue numbers in CHANGELOG.md"


# -- performance.md: every table from its reference file -------------------------------------
def test_every_generated_table_is_what_its_reference_file_gives() -> None:
    """Each ``<!-- table: NAME -->`` block of every page is what ``benchmarks/reference/NAME.json``
    gives today (``python -m pyc10d.bench.reference --write <page>`` rewrites them)."""
    differ = []
    for doc in doc_files():
        text = doc.read_text()
        for name, block in reference.blocks(text).items():
            rel = reference.reference_path(name)
            assert (ROOT / rel).exists(), f"{doc.name}: table {name} has no {rel}"
            want = reference.table(json.loads((ROOT / rel).read_text()), rel) + "\n"
            if block != want:
                differ.append(f"{doc.relative_to(ROOT)}: table {name}")
    assert not differ, "generated tables differ from their files (python -m pyc10d.bench.reference --write DOC):\n" \
        + "\n".join(differ)


def test_performance_has_no_table_typed_by_hand() -> None:
    """Every table row of docs/performance.md lies inside a generated block, the page is a
    reference (at most 350 lines), and its first table is all_reduce beside Gloo and Open MPI."""
    text = (DOCS / "performance.md").read_text()
    outside = reference.BLOCK.sub("", text)
    rows = [line for line in outside.splitlines() if line.lstrip().startswith("|")]
    assert not rows, f"table rows outside a generated block: {rows[:3]}"
    assert len(text.splitlines()) <= 350
    names = list(reference.blocks(text))
    assert len(names) >= 10 and names[0] == "allreduce", names
    first = json.loads((ROOT / reference.reference_path(names[0])).read_text())
    assert [h for _, h in first.get("columns", [])][:3] == ["shm µs", "Gloo µs", "Open MPI µs"]


def test_reference_tables_fail_on_a_changed_figure() -> None:
    """The comparison above can fail: one figure changed in a copy of a reference file changes
    the table made from it, and a ratio is recomputed from the figures, not copied."""
    spec = json.loads((ROOT / reference.reference_path("windows")).read_text())
    before = reference.table(spec, "x")
    spec["rows"][0][1] *= 2
    after = reference.table(spec, "x")
    assert before != after
    assert before.splitlines()[2].endswith("| 0.12 | 9.84 |")  # 18.7 / 152.5 and 18.7 / 1.9
    assert after.splitlines()[2].endswith("| 0.25 | 19.68 |")  # 37.4 / 152.5 and 37.4 / 1.9


# -- no diaries: what is true now, without the project's tracker or a log --------------------
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+|\b[Ii]ssue #\d+")
LOG_REF = re.compile(r"\bRuns? \d+\b|\(run \d+\)|\brun \d+'s\b|\bruns \d+-\d+\b|\b[Ss]top \d+\b")
DATED_HEADING = re.compile(r"^#+ .*20\d\d-\d\d-\d\d", re.M)


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_doc_names_an_issue_a_dated_heading_or_a_numbered_run(doc: Path) -> None:
    text = doc.read_text()
    found = [f"issue: {m.group(0)!r}" for m in ISSUE.finditer(text)]
    found += [f"dated heading: {m.group(0)!r}" for m in DATED_HEADING.finditer(text)]
    found += [f"log reference: {m.group(0)!r}" for m in LOG_REF.finditer(text)]
    assert not found, f"{doc.name} says what happened, not what is true: {found[:8]}"


def test_testing_page_has_no_run_log() -> None:
    text = (DOCS / "testing.md").read_text()
    header = [line for line in text.splitlines()
              if line.startswith("|") and re.search(r"\|\s*run\s*\|", line, re.I)]
    commits = [line for line in text.splitlines() if re.match(r"^\|\s*\w+\s*\|\s*[0-9a-f]{7,40}\b", line)]
    assert not header and not commits, (header + commits)[:3]
    assert len(text.splitlines()) <= 170


# -- commands the docs show exist -------------------------------------------------------------
MAKE = re.compile(r"`make ([a-z][\w-]*)|^make ([a-z][\w-]*)", re.M)
MODULE_CMD = re.compile(r"python -m (pyc10d(?:\.\w+)*)((?:[ \t]+(?:-[-\w]+|[^\s`|)-][^\s`|)]*))*)")


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def test_every_make_target_named_exists() -> None:
    targets = _make_targets()
    named = {doc.name: {a or b for a, b in MAKE.findall(doc.read_text())} for doc in doc_files()}
    missing = {name: sorted(t - targets) for name, t in named.items() if t - targets}
    assert not missing, f"make targets the Makefile lacks: {missing}"


def _module_options() -> dict[str, set[str]]:
    """Each ``python -m pyc10d...`` module the docs show, with the ``--options`` they pass it."""
    from pyc10d.bench.__main__ import (
        _OTHER_BENCHES,  # --tp and the like hand the rest to another module
    )

    out: dict[str, set[str]] = {}
    for doc in doc_files():
        for m in MODULE_CMD.finditer(doc.read_text()):
            module, words = m.group(1), m.group(2).split()
            script = next((i for i, w in enumerate(words) if w.endswith(".py")), len(words))
            options = {w.split("=")[0] for w in words[:script] if re.fullmatch(r"--[a-z][\w-]*(=\S*)?", w)}
            other = sorted(options & set(_OTHER_BENCHES)) if module == "pyc10d.bench" else []
            out.setdefault(module, set()).update(other)
            if other:
                module, options = _OTHER_BENCHES[other[0]], options - set(_OTHER_BENCHES)
            out.setdefault(module, set()).update(options)  # options after a script are the script's
    return out


def _help(module: str) -> tuple[int, str]:
    """``python -m module --help`` in this process (torch is imported once, not per module):
    its exit code and what it printed."""
    import contextlib
    import io
    import runpy
    import sys
    import warnings

    buf, argv = io.StringIO(), sys.argv
    sys.argv = [module, "--help"]
    code = 0
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # noqa: BLE001 - reported as the module's failure
        code = 99
        buf.write(repr(e))
    finally:
        sys.argv = argv
    return code, buf.getvalue()


def test_every_python_m_command_shown_parses_its_options() -> None:
    """``python -m <module> --help`` exits 0 for every pyc10d module a doc shows, and every
    ``--option`` the docs pass it is in its help."""

    wanted = _module_options()
    assert "pyc10d.bench" in wanted and "pyc10d.bench.reference" in wanted
    bad = []
    for mod, options in sorted(wanted.items()):
        code, text = _help(mod)
        if code != 0:
            bad.append(f"python -m {mod} --help exited {code}: {text[-300:]}")
            continue
        bad += [f"python -m {mod}: no {opt} in its --help" for opt in sorted(options) if opt not in text]
    assert not bad, "\n".join(bad)
