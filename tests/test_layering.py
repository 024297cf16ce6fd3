"""The import graph of relax_memplan has no circle, and no layer imports one above it.

The graph is read from the source with ``ast`` (nothing is imported): one node per module,
an edge for every ``import`` at module level or inside a function. Imports under
``if TYPE_CHECKING:`` are left out: they never run, they name types for annotations.

A module may import any module of its own package and of the layers below; packages of one
layer do not import each other. ``docs/architecture.md`` draws these layers.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Dict, List, Set, Tuple

from tests.conftest import REPO_ROOT

PACKAGE = "relax_memplan"

LAYERS: Tuple[Tuple[str, ...], ...] = (  # bottom to top; "" is the package's own __init__
    ("_version", "errors"),
    ("planner", "kernels", "schedules"),
    ("analysis", "targets"),
    ("frontend", "transform", "runtime"),
    ("pipeline", "library"),
    ("config",),
    ("report",),
    ("compile",),
    ("tools",),
    ("cli",),
    ("",),
)
"""Each top-level package or module of relax_memplan, by layer."""


# ----------------------------------------------------------------------------- the graph
def _module_name(path: Path, root: Path) -> Tuple[str, bool]:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _type_checking_lines(tree: ast.AST) -> Set[int]:
    """Line numbers of the statements under ``if TYPE_CHECKING:``."""
    lines: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                lines.update(range(stmt.lineno, stmt.end_lineno + 1))
    return lines


def _imported(node, module: str, is_package: bool, modules: Set[str]) -> List[str]:
    """The modules of the package an import statement names (most specific first found)."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = module.split(".") if is_package else module.split(".")[:-1]
        if node.level:
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin
                   for a in node.names]
    found = []
    for target in targets:
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in modules:
            found.append(target)
    return found


def import_graph(root: Path) -> Dict[str, Set[str]]:
    """Module -> the modules of the package it imports, for the package at ``root``."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = {name for name, _ in files}
    graph: Dict[str, Set[str]] = {}
    for (module, is_package), path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skipped = _type_checking_lines(tree)
        edges = graph.setdefault(module, set())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in skipped:
                edges.update(t for t in _imported(node, module, is_package, modules)
                             if t != module)
    return graph


# ----------------------------------------------------------------------------- the checks
def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def component(module: str) -> str:
    """The top-level package or module of the package that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_errors(graph: Dict[str, Set[str]], layers=LAYERS) -> List[str]:
    """Each import that does not go down the layers (or into its own package), and each
    top-level package or module no layer names."""
    layer_of = {name: k for k, names in enumerate(layers) for name in names}
    errors = [f"{c or PACKAGE}: in no layer" for c in sorted({component(m) for m in graph})
              if c not in layer_of]
    for source, targets in sorted(graph.items()):
        a = component(source)
        for target in sorted(targets):
            b = component(target)
            if a == b or a not in layer_of or b not in layer_of:
                continue
            if layer_of[b] > layer_of[a]:
                errors.append(f"{source} imports {target}: up from layer {layer_of[a]} to "
                              f"{layer_of[b]}")
            elif layer_of[b] == layer_of[a]:
                errors.append(f"{source} imports {target}: {a} and {b} share layer "
                              f"{layer_of[a]}")
    return errors


# ----------------------------------------------------------------------------- the tests
def test_the_package_has_no_import_circle():
    graph = import_graph(REPO_ROOT / PACKAGE)
    assert len(graph) > 100 and any(graph.values())  # the package was read
    assert circles(graph) == []


def test_every_import_goes_down_the_layers():
    assert layer_errors(import_graph(REPO_ROOT / PACKAGE)) == []


def test_function_level_and_relative_imports_are_edges():
    graph = import_graph(REPO_ROOT / PACKAGE)
    assert "relax_memplan.tools.inspect" in graph["relax_memplan.cli.commands"]  # in _inspect
    assert "relax_memplan.frontend.importer" in graph["relax_memplan.frontend.reference"]
    assert "relax_memplan.frontend" in graph["relax_memplan.compile.model"]  # from .. import frontend


def test_a_planted_circle_and_an_upward_import_fail(tmp_path):
    root = tmp_path / PACKAGE
    shutil.copytree(REPO_ROOT / PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "planner" / "planted.py").write_text(
        "def late():\n    from ..compile import build\n", encoding="utf-8")
    (root / "report" / "planted.py").write_text("from .records import CompileReport\n",
                                                encoding="utf-8")
    records = root / "report" / "records.py"
    records.write_text(records.read_text(encoding="utf-8") + "\nfrom . import planted\n",
                       encoding="utf-8")
    graph = import_graph(root)
    assert ["relax_memplan.report.planted", "relax_memplan.report.records"] in circles(graph)
    assert layer_errors(graph) == ["relax_memplan.planner.planted imports "
                                   "relax_memplan.compile.build: up from layer 1 to 7"]


def test_the_checks_fail_on_a_synthetic_graph():
    graph = {"relax_memplan.planner.a": {"relax_memplan.planner.b"},
             "relax_memplan.planner.b": {"relax_memplan.planner.c"},
             "relax_memplan.planner.c": {"relax_memplan.planner.a"},
             "relax_memplan.errors": {"relax_memplan.cli.entry"},
             "relax_memplan.frontend.x": {"relax_memplan.transform.y"},
             "relax_memplan.cli.entry": set(), "relax_memplan.transform.y": set(),
             "relax_memplan.extra": set()}
    assert circles(graph) == [["relax_memplan.planner.a", "relax_memplan.planner.b",
                               "relax_memplan.planner.c"]]
    assert layer_errors(graph) == [
        "extra: in no layer",
        "relax_memplan.errors imports relax_memplan.cli.entry: up from layer 0 to 9",
        "relax_memplan.frontend.x imports relax_memplan.transform.y: frontend and transform "
        "share layer 3"]
    assert circles({"relax_memplan.a": {"relax_memplan.b"}, "relax_memplan.b": set()}) == []


def test_type_checking_imports_are_not_edges():
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
              "    from .records import CompileReport\nfrom .dispatch import lines\n")
    tree = ast.parse(source)
    assert _type_checking_lines(tree) == {3}
