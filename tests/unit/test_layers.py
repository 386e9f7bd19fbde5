"""The import graph of tachyon/: no cycles, and imports point downward (STYLE.md: server -> engine -> model ->
layers -> kernels; `tachyon.build` is the factory above engine and worker).

Every import counts, also one inside a function, except under `if TYPE_CHECKING:` (annotations only).
`from tachyon.x import y` is an edge to the module tachyon.x.y if there is one, else to tachyon.x; a package's
__init__ is the node named after the package.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "tachyon"

# importer -> what it must not import
LAYERS = {
    "tachyon.kernels": ("tachyon.layers", "tachyon.models", "tachyon.worker", "tachyon.engine", "tachyon.server",
                        "tachyon.bench"),
    "tachyon.layers": ("tachyon.models", "tachyon.worker", "tachyon.engine", "tachyon.server", "tachyon.bench"),
    "tachyon.models": ("tachyon.worker", "tachyon.engine", "tachyon.server", "tachyon.bench"),
    "tachyon.worker": ("tachyon.server", "tachyon.bench"),  # and tachyon.engine: test_worker_does_not_import_engine
    "tachyon.engine": ("tachyon.worker", "tachyon.server", "tachyon.bench"),
    # the gateway speaks HTTP to its backends: nothing of the engine below them
    "tachyon.gateway": ("tachyon.build", "tachyon.engine", "tachyon.worker", "tachyon.models", "tachyon.layers",
                        "tachyon.kernels", "tachyon.llm"),
}
# the gateway answers with the server's OpenAI-style error bodies (tachyon.server.errors)
SERVER_IMPORTERS = ("tachyon.server", "tachyon.cli", "tachyon.build", "tachyon.gateway")


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    path: str  # relative to the repository
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.importer} imports {self.imported})"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST):
    """Every Import / ImportFrom / importlib.import_module("...") below node, but not under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
              and child.func.attr == "import_module" and child.args and isinstance(child.args[0], ast.Constant)):
            yield child
        yield from _import_nodes(child)


def _targets(node: ast.AST, importer: str, is_package: bool, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Call):
        return [node.args[0].value]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importer's package, one level up per extra dot
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


@functools.cache
def import_graph() -> tuple[Import, ...]:
    files = sorted(SRC.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    edges = set()
    for f in files:
        importer = _module_name(f)
        tree = ast.parse(f.read_text(), filename=str(f))
        for node in _import_nodes(tree):
            for target in _targets(node, importer, f.name == "__init__.py", modules):
                if target in modules and target != importer:
                    edges.add(Import(importer, target, str(f.relative_to(SRC.parent)), node.lineno))
    return tuple(sorted(edges, key=lambda e: (e.path, e.line, e.imported)))


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _violations(importer: str, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{e}: {importer} must not import {p}" for e in import_graph() for p in forbidden
            if _within(e.importer, importer) and _within(e.imported, p)]


def _cycles(edges: tuple[Import, ...]) -> list[list[Import]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as its import edges."""
    out: dict[str, list[Import]] = {}
    for e in edges:
        out.setdefault(e.importer, []).append(e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for e in out.get(v, []):
            w = e.imported
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(out):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:  # the shortest way from the first module back to itself, inside the component
        start = min(component)
        paths = {start: []}
        frontier = [start]
        while frontier and not any(e.imported == start for v in frontier for e in out.get(v, [])):
            nxt = []
            for v in frontier:
                for e in out.get(v, []):
                    if e.imported in component and e.imported not in paths:
                        paths[e.imported] = paths[v] + [e]
                        nxt.append(e.imported)
            frontier = nxt
        last = next(e for v in frontier for e in out.get(v, []) if e.imported == start)
        cycles.append(paths[last.importer] + [last])
    return cycles


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking():
    edges = {(e.importer, e.imported) for e in import_graph()}
    assert ("tachyon.layers.attention", "tachyon.layers.triton_backend") in edges  # inside get_attention_backend
    assert ("tachyon.layers.triton_backend", "tachyon.layers.attention") not in edges  # under TYPE_CHECKING
    assert ("tachyon.llm", "tachyon.build") in edges


def test_no_import_cycles():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(
        " -> ".join([c[0].importer] + [e.imported for e in c]) + "\n    " + "\n    ".join(map(str, c))
        for c in cycles)


@pytest.mark.parametrize("importer", sorted(LAYERS))
def test_imports_point_downward(importer):
    bad = _violations(importer, LAYERS[importer])
    assert not bad, "\n".join(bad)


def test_worker_does_not_import_engine():
    bad = _violations("tachyon.worker", ("tachyon.engine",))
    assert not bad, "\n".join(bad)


def test_only_the_server_cli_and_build_import_the_server():
    bad = [f"{e}: only {', '.join(SERVER_IMPORTERS)} may import tachyon.server" for e in import_graph()
           if _within(e.imported, "tachyon.server") and not any(_within(e.importer, s) for s in SERVER_IMPORTERS)]
    assert not bad, "\n".join(bad)
