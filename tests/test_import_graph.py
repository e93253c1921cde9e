"""No import circle in the shipped packages.

The graph: a module imports every module that one of its ``import`` statements names, wherever the statement is
(module level, under ``if TYPE_CHECKING:``, in ``try``, inside a function), and the packages whose ``__init__`` that
import runs on the way (``import nsqd.replication.store`` runs ``nsqd/replication/__init__.py``), except its own
parents, which every module needs. Imports inside functions and under ``TYPE_CHECKING`` count because they are
the usual places to hide a circle: two modules that each need the other are one design whether Python happens to
load them in a good order or not. A lazy import is still fine for what it is for (start-up time, an optional
dependency) as long as it closes no circle. ``importlib.import_module`` calls are not followed.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "runtime", "nsqd", "lookupd", "admin", "spark_connector", "trionsq", "nsq_tools")

Edge = tuple[str, str, int]  # importer, imported, line


def modules_of(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package) for every ``.py`` file under ``packages``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


def imported_modules(node: ast.Import | ast.ImportFrom, package: str, modules: dict) -> list[str]:
    """The modules of ``modules`` an import statement names (``from a import b``: a.b if it is a module, else a)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in modules]
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
    named = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in modules:
            named.append(submodule)
        elif base in modules:
            named.append(base)
    return named


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, list[Edge]]:
    """Module -> its edges (see the module notes for what counts)."""
    modules = modules_of(root, packages)
    graph: dict[str, list[Edge]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        own_parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in imported_modules(node, package, modules):
                # the target, and each package on the way to it whose __init__ the import runs
                parts = target.split(".")
                for step in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
                    if step in modules and step != name and step not in own_parents:
                        edges.setdefault(step, node.lineno)
        graph[name] = [(name, target, line) for target, line in sorted(edges.items())]
    return graph


def cycles(graph: dict[str, list[Edge]]) -> list[list[Edge]]:
    """One shortest circle through each module that is on one, each circle once."""
    found: dict[frozenset[str], list[Edge]] = {}
    for start in graph:
        came_by: dict[str, Edge] = {}
        queue = deque([start])
        while queue:
            module = queue.popleft()
            for edge in graph.get(module, ()):
                target = edge[1]
                if target == start:
                    path = [edge]
                    while path[0][0] != start:
                        path.insert(0, came_by[path[0][0]])
                    found.setdefault(frozenset(e[0] for e in path), path)
                    queue.clear()
                    break
                if target not in came_by:
                    came_by[target] = edge
                    queue.append(target)
    return list(found.values())


def describe(cycle: list[Edge]) -> str:
    return " -> ".join(f"{importer} (line {line})" for importer, _, line in cycle) + f" -> {cycle[0][0]}"


def test_no_import_circle():
    found = cycles(import_graph(ROOT))
    assert not found, "import circles:\n" + "\n".join(describe(cycle) for cycle in found)


def test_graph_sees_the_imports_it_must(tmp_path):
    # A circle closed by a TYPE_CHECKING import, one closed inside a function, and one through a package's __init__.
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "pkg/b.py": "from pkg import a\nB = 1\n",
        "pkg/c.py": "def late():\n    from . import d\n",
        "pkg/d.py": "import pkg.c\n",
        "pkg/sub/__init__.py": "from .inner import X\n",
        "pkg/sub/inner.py": "from pkg.e import Y\nX = 1\n",
        "pkg/e.py": "from pkg.sub.inner import X as Y\n",
        "pkg/f.py": "from .sub import inner\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("pkg",))
    found = {frozenset(edge[0] for edge in cycle) for cycle in cycles(graph)}
    assert found == {
        frozenset({"pkg.a", "pkg.b"}),
        frozenset({"pkg.c", "pkg.d"}),
        frozenset({"pkg.e", "pkg.sub.inner"}),
        frozenset({"pkg.e", "pkg.sub", "pkg.sub.inner"}),
    }, found
    assert [edge[1] for edge in graph["pkg.f"]] == ["pkg.sub", "pkg.sub.inner"]
    # a module's own parents are no edge: every submodule imports them
    assert "pkg.sub" not in [edge[1] for edge in graph["pkg.sub.inner"]]
