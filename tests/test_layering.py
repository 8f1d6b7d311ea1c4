"""The import graph of vitfast's own modules, read from the source with `ast` (nothing is imported).

Rules (docs/architecture.md): no import cycle; only the command line imports `vitfast.cli`; the
runtime never imports `vitfast.export` (export builds, runtime runs); kernels import nothing else of
vitfast but its errors.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"vitfast": ROOT / "vitfast", "vitfast.kernels": ROOT / "kernels", "vitfast.export": ROOT / "export"}


def module_files() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the installed package."""
    modules = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


MODULES = module_files()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str) -> list[tuple[str, bool]]:
    """(imported vitfast module, at module level?) for each import statement in `module`."""
    tree = ast.parse(MODULES[module].read_text())
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found += [(t, id(node) in top) for t in targets if t in MODULES]
    return found


GRAPH = {m: {t for t, _ in imports(m)} - {m} for m in MODULES}


def test_the_graph_sees_the_package():
    assert {"vitfast.cli.main", "vitfast.runtime", "vitfast.export.tensorrt", "vitfast.kernels.attention"} <= set(MODULES)
    assert "vitfast.runtime.engine" in GRAPH["vitfast.runtime.torch_engine"]
    assert "vitfast.pipeline" in GRAPH["vitfast.cli.export"]


def cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
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

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert cycles() == []


def test_cycle_detector_finds_one(monkeypatch):
    engine = "vitfast.runtime.tensorrt_engine"  # export.tensorrt imports it; the reverse edge closes a circle
    monkeypatch.setitem(GRAPH, engine, GRAPH[engine] | {"vitfast.export.tensorrt"})
    assert any({engine, "vitfast.export.tensorrt"} <= set(c) for c in cycles())


def _offenders(importers: str, imported: str) -> list[str]:
    inside = lambda name, package: name == package or name.startswith(package + ".")  # noqa: E731
    return sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if inside(m, importers) for t in targets if inside(t, imported))


@pytest.mark.parametrize("library", ["vitfast.runtime", "vitfast.export", "vitfast.bench", "vitfast.serve", "vitfast.pipeline",
                                     "vitfast.sources", "vitfast.kernels", "vitfast.inspect"])  # fmt: skip
def test_library_never_imports_the_command_line(library):
    assert _offenders(library, "vitfast.cli") == []


def test_library_modules_do_not_import_the_cli_at_all():
    assert [m for m, targets in GRAPH.items() if not m.startswith("vitfast.cli") and any(t.startswith("vitfast.cli") for t in targets)] == []


def test_runtime_never_imports_export():
    assert _offenders("vitfast.runtime", "vitfast.export") == []


def test_kernels_import_only_kernels_and_the_errors():
    allowed = ("-> vitfast.kernels", "-> vitfast.errors")
    assert [o for o in _offenders("vitfast.kernels", "vitfast") if not any(a in o for a in allowed)] == []
