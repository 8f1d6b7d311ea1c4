"""The import graph of vitfast's own modules, read from the source with `ast` (nothing is imported).

Rules (docs/architecture.md): no import cycle; only the command line imports `vitfast.cli`; the
runtime never imports `vitfast.export` (export builds, runtime runs); kernels import nothing else of
vitfast but its errors; vitfast's own modules are imported at module top, and one imported inside a
function says why on that line (`# lazy: <reason>`: it pulls in a heavy optional dependency); and
`import vitfast` / `vitfast --help` load none of the heavy optional dependencies.
"""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import tokenize
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


def _targets(module: str, node: ast.AST) -> list[str]:
    """The vitfast modules an import statement in `module` imports (none for anything else)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(module, node)
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    else:
        return []
    return [t for t in targets if t in MODULES]


def imports(module: str) -> list[tuple[str, bool]]:
    """(imported vitfast module, at module level?) for each import statement in `module`."""
    tree = ast.parse(MODULES[module].read_text())
    top = set(map(id, tree.body))
    return [(t, id(node) in top) for node in ast.walk(tree) for t in _targets(module, node)]


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
    command_line = lambda m: m.startswith("vitfast.cli") or m == "vitfast.__main__"  # noqa: E731 - `python -m vitfast`
    assert [m for m, targets in GRAPH.items() if not command_line(m) and any(t.startswith("vitfast.cli") for t in targets)] == []


def test_runtime_never_imports_export():
    assert _offenders("vitfast.runtime", "vitfast.export") == []


def test_kernels_import_only_kernels_and_the_errors():
    allowed = ("-> vitfast.kernels", "-> vitfast.errors")
    assert [o for o in _offenders("vitfast.kernels", "vitfast") if not any(a in o for a in allowed)] == []


# ---------------------------------------------------------------------------- imports inside functions
def _imports_by_name(node: ast.AST) -> bool:
    """`importlib.import_module("vitfast...")` / `import_module(f"vitfast.{name}")`: an import all the same."""
    if not (isinstance(node, ast.Call) and node.args):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    first = node.args[0]
    if isinstance(first, ast.JoinedStr):
        first = first.values[0] if first.values else None
    return name in ("import_module", "__import__") and isinstance(first, ast.Constant) and str(first.value).startswith("vitfast")


def unexplained_lazy_imports(module: str, source: str | None = None) -> list[tuple[int, str]]:
    """(line, statement) of each import of a vitfast module inside a function of `module` whose lines
    carry no `# lazy: <reason>` comment."""
    source = MODULES[module].read_text() if source is None else source
    reasons = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
               if tok.type == tokenize.COMMENT and tok.string.removeprefix("#").strip().startswith("lazy:")
               and tok.string.split("lazy:", 1)[1].strip()}  # fmt: skip
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(function):
            if (_targets(module, node) or _imports_by_name(node)) and not reasons & set(range(node.lineno, node.end_lineno + 1)):
                found.append((node.lineno, ast.get_source_segment(source, node)))
    return sorted(set(found))


def test_vitfast_modules_are_imported_at_module_top_or_say_why():
    found = [f"{MODULES[m].relative_to(ROOT)}:{line}: {text}" for m in MODULES for line, text in unexplained_lazy_imports(m)]
    assert found == [], "move these imports to the module top, or add `# lazy: <reason>` (a heavy optional dependency):\n" + "\n".join(found)


def test_lazy_import_check_finds_imports_without_a_reason():
    source = """
import vitfast.config
def a():
    from .model import VisionTransformer
def b():
    from vitfast import foreign, errors  # lazy:
def c():
    import vitfast.kernels.attention  # lazy: needs triton
def d():
    from .fused import (  # lazy: needs triton
        FusedBlock,
    )
def e():
    return importlib.import_module(f"vitfast.kernels.{name}")
def f():
    from .model import VisionTransformer  # lazy later: not a reason
def g():
    import numpy, json
"""
    assert [line for line, _ in unexplained_lazy_imports("vitfast.registry", source)] == [4, 6, 14, 16]


HEAVY = ("onnxruntime", "openvino", "nncf", "matplotlib", "tensorrt", "pytriton", "tritonclient", "triton", "onnx", "transformers")


def heavy_modules_loaded(code: str) -> dict[str, list[str]]:
    """Run `code` in a fresh interpreter; after it, which of HEAVY are in `sys.modules`, keyed by what `code` records."""
    probe = f"""import contextlib, io, json, sys
seen = {{}}
def record(label):
    seen[label] = sorted({{m.split(".")[0] for m in sys.modules}} & {set(HEAVY)!r})
{code}
print(json.dumps(seen))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


HELP = """
import vitfast
record("import vitfast")
from vitfast.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
    main(["--help"])
record("vitfast --help" if out.getvalue().startswith("usage: vitfast") else "no help: " + out.getvalue())
"""


def test_import_vitfast_and_help_load_no_heavy_optional_dependency():
    assert heavy_modules_loaded(HELP) == {"import vitfast": [], "vitfast --help": []}


def test_heavy_dependency_probe_sees_one():
    pytest.importorskip("onnxruntime")
    assert "onnxruntime" in heavy_modules_loaded("import vitfast.runtime.onnx_engine, onnxruntime\nrecord('ort')")["ort"]
