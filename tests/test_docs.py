"""README.md and docs/ against the code: links resolve, the generated tables are what their
generators give today, the environment-variable table names every variable the code reads
(and nothing else), and the names pyc10d leaves out are the test suite's list. The examples
themselves run in ``tests/test_docs_examples.py``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from _doc_blocks import ROOT, doc_files

from pyc10d.bench import readme
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
