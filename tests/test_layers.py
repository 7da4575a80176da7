"""pyc10d's layers, as docs/internals.md draws them: no import circle among its modules, and
no import from a lower layer to a higher one.

Every ``import`` counts, the ones inside functions and under ``TYPE_CHECKING`` too: a
circle hidden in a function is still a circle to a reader, and an upward import in a
function still makes the lower layer know the higher one. Read from the source (ast), so a
module that is never imported in a test is checked as well.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pyc10d

ROOT = Path(pyc10d.__file__).parent

#: Bottom to top. A module may import its own layer and the ones below. Keys are the first
#: name under ``pyc10d`` (a top-level module or a subpackage).
LAYERS: list[tuple[str, set[str]]] = [
    ("leaves", {"errors", "types", "env", "settings", "hostport", "launch_env", "world", "timeline",
                "threads", "constants", "auth", "tls", "admission", "keepalive",
                "torch_version"}),
    ("store", {"store"}),
    ("transport", {"transport"}),
    ("algorithms", {"algorithms"}),
    ("backends", {"backends"}),
    ("process group", {"process_group", "groups", "rendezvous", "shrink", "reconfigure"}),
    ("public API", {"_preamble", "collectives", "p2p", "object_collectives", "distributed_c10d",
                    "device_mesh"}),
    ("on top", {"functional", "nn", "symmetric_memory", "window", "torch_backend", "integrations"}),
    # ``import pyc10d`` re-exports every layer (``pyc10d.nn``, ``pyc10d.functional``), as
    # ``torch.distributed`` exports ``GradBucket``: the front door sits above what it opens.
    ("the package's front door", {"__init__", "_api", "_lazy_api"}),
    ("tools", {"bench", "testing", "sim", "run", "run_fork", "info", "status", "flight_recorder"}),
]


def _modules() -> dict[str, tuple[Path, list[str]]]:
    """Dotted module name -> (file, the package its relative imports start from)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            package = parts
        else:
            package = parts[:-1]
        out[".".join(parts)] = (path, package)
    return out


def _graph() -> dict[str, set[str]]:
    """Module -> the pyc10d modules it imports (``from pkg import module`` counts as the
    module, not the package)."""
    mods = _modules()
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, (path, package) in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for n in names:
                if not n.startswith("pyc10d"):
                    continue
                while n not in mods and "." in n:  # a name defined in a module: that module
                    n = n.rsplit(".", 1)[0]
                if n in mods and n != name:
                    graph[name].add(n)
    return graph


def _layer(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    for i, (_, keys) in enumerate(LAYERS):
        if key in keys:
            return i
    raise AssertionError(f"{module}: in no layer of tests/test_layers.py (add it where it belongs)")


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_circle() -> None:
    graph = _graph()
    circles = _circles(graph)
    assert not circles, "import circles: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{a} imports {sorted(graph[a] & set(c))}" for a in c) + ")"
        for c in circles)


def test_no_import_upward() -> None:
    graph = _graph()
    upward = [f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
              for a in sorted(graph) for b in sorted(graph[a]) if _layer(b) > _layer(a)]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_the_checks_can_fail() -> None:
    """The two checks find what they look for (a circle, an upward arrow) when it is there."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    assert _layer("pyc10d.transport.tcp") < _layer("pyc10d.backends.engine") < _layer("pyc10d.torch_backend")
    graph = _graph()
    assert "pyc10d.backends.lane" in graph["pyc10d.backends.engine"]  # relative imports resolve
    assert "pyc10d.settings" in graph["pyc10d.backends.base"]  # ``from .. import settings``
