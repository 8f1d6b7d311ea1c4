"""Every `pip install 'vitfast[EXTRA]'` hint in the source names an extra that pyproject.toml defines
and that itself lists the dependency the message is about (not an alias such as `[export]`)."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python >= 3.11")

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "vitfast", ROOT / "export", ROOT / "kernels"]  # the package's folders (vitfast.export, vitfast.kernels)
HINT = re.compile(r"(?:vitfast|\.)\[([\w,-]+)\]")  # pip install 'vitfast[onnx]', pip install -e .[test]
REQUIREMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def extras() -> dict[str, list[str]]:
    """extra -> the distribution names it lists itself (self-references like `vitfast[onnx]` left out)."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {extra: [REQUIREMENT_NAME.match(req).group().lower() for req in reqs] for extra, reqs in table.items()}
    return {extra: [name for name in dists if name != "vitfast"] for extra, dists in names.items()}


def import_names(dist: str) -> set[str]:
    """Names a message may call `dist` by: the distribution name, its last word (nvidia-pytriton -> pytriton)
    and, when it is installed, its top-level import packages."""
    installed = {top for top, owners in importlib.metadata.packages_distributions().items() if dist in {o.lower() for o in owners}}
    return {dist, dist.replace("-", "_"), dist.split("-")[-1], *(name.lower() for name in installed)}


def hints() -> list[tuple[str, int, str, str]]:
    """(file, line number, line, extra) for every install hint naming an extra in the package's source."""
    found = []
    for folder in SOURCES:
        for path in sorted(folder.rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if "pip install" in line:
                    found += [(str(path.relative_to(ROOT)), number, line, extra) for group in HINT.findall(line) for extra in group.split(",")]
    return found


def mentions(line: str, name: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", line, flags=re.IGNORECASE) is not None


def test_every_install_hint_names_the_extra_that_lists_its_dependency():
    defined = extras()
    found = hints()
    assert len(found) >= 8, found  # the scan sees the hints (onnx, openvino, plot, triton, serve, ...)
    about = set()
    for path, number, line, extra in found:
        assert extra in defined, f"{path}:{number} names vitfast[{extra}], which pyproject.toml does not define: {line.strip()}"
        dists = [d for d in defined[extra] if any(mentions(line, name) for name in import_names(d))]
        assert dists, (f"{path}:{number}: vitfast[{extra}] lists {defined[extra] or 'no dependency of its own'}, "
                       f"none of which the message names: {line.strip()}")  # fmt: skip
        about.update(dists)
    assert {"onnxruntime", "openvino", "matplotlib", "triton", "nvidia-pytriton"} <= about



@pytest.mark.parametrize("missing", ["onnx", "onnxruntime", "onnxscript"])
def test_onnx_export_names_each_missing_package_of_the_onnx_extra(missing, monkeypatch):
    """torch.onnx imports onnxscript half-way through an export: without it that was a traceback, not this hint."""
    from vitfast.errors import BackendUnavailable
    from vitfast.export.onnx_export import require_onnx

    monkeypatch.setitem(sys.modules, missing, None)  # what `import` of an absent package raises: ImportError
    with pytest.raises(BackendUnavailable, match=rf"^ONNX export needs onnx, onnxruntime and onnxscript \({missing} is missing\): "
                                                 r"pip install 'vitfast\[onnx\]'$"):  # fmt: skip
        require_onnx()
    assert "onnxscript" in extras()["onnx"]


def test_reading_an_onnx_graph_without_the_onnx_package_is_the_install_hint(tmp_path, monkeypatch, capsys):
    """ONNX Runtime alone runs a graph, but vitfast reads its inputs and outputs with the onnx package first."""
    from vitfast.cli import main

    graph = tmp_path / "m.onnx"
    graph.write_bytes(b"not read")
    monkeypatch.setitem(sys.modules, "onnx", None)
    assert main(["info", str(graph)]) == 2
    assert capsys.readouterr().err == "vitfast: error: reading an ONNX graph needs the onnx package: pip install 'vitfast[onnx]'\n"
