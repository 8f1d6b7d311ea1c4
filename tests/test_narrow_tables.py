"""Every table and summary the CLI prints fits an 80-column terminal with its key values whole
(no "…"), and a pipe (160 columns) still gets the full tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console, Group

from vitfast.bench import report
from vitfast.bench.stats import compare_rows
from vitfast.bench.sweep import load_result
from vitfast.cli import main
from vitfast.cli.output import fitting
from vitfast.registry import list_models

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
BASE, NEW = RESULTS / "cpu-062e56b.json", RESULTS / "cpu-29721f8.json"  # real sweeps: 2 models x 4 backends x 2 precisions x 2 batches


def printed(capsys, monkeypatch, columns: int, *args) -> str:
    """stdout of `vitfast ARGS` on a terminal `columns` wide ($COLUMNS is how rich learns a terminal's width)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main([str(a) for a in args]) in (0, 1)
    return capsys.readouterr().out


def assert_fits(text: str, width: int = 80) -> None:
    wide = [line for line in text.splitlines() if len(line) > width]
    assert not wide, f"{len(wide)} lines wider than {width}, e.g. {wide[0]!r}"
    assert "…" not in text  # nothing cut


def test_models_fits_80_columns_with_every_name_and_number_whole(capsys, monkeypatch):
    text = printed(capsys, monkeypatch, 80, "models")
    assert_fits(text)
    rows = {r["name"]: r for r in json.loads(printed(capsys, monkeypatch, 80, "models", "--json"))["models"]}
    assert set(rows) == set(list_models())
    for line in text.splitlines():
        name = line.split(" ")[0]
        if name in rows:  # name, params M, GMACs, dim, depth, heads, classes
            r = rows.pop(name)
            assert line.split()[1:] == [f"{r['params_m']:.2f}", f"{r['gmacs']:.2f}", str(r["embed_dim"]), str(r["depth"]),
                                        str(r["num_heads"]), f"{r['num_classes']}{'e' if r['embedding_head'] else ''}"]  # fmt: skip
    assert not rows, f"models missing from the table: {sorted(rows)}"


def test_a_pipe_gets_the_full_models_table(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["models", "--filter", "deit_small_distilled_patch16_224"]) == 0
    text = capsys.readouterr().out
    assert "GFLOPs" in text and "patch" in text and "9.25" in text and "…" not in text  # GFLOPs and patch are folded on 80


def test_info_fits_80_columns(capsys, monkeypatch):
    text = printed(capsys, monkeypatch, 80, "info")
    assert_fits(text)
    assert "torch" in text and "GPU" in text


def test_bench_tables_fit_80_columns_with_every_measured_row():
    result = load_result(BASE)  # what `vitfast bench` prints after a sweep, rendered as cmd_bench does
    out = Console(width=80, record=True)
    out.print(fitting(out, Group(*report.rich_tables(result)), Group(*report.rich_tables(result, compact=True))))
    text = out.export_text()
    assert_fits(text)
    ok = [r for r in result["rows"] if r["status"] == "ok"]
    for r in ok:  # the latency, p99, throughput and memory of every measured row, whole
        assert any(f"{r['median_ms']:.2f}" in line and f"{r['p99_ms']:.2f}" in line and f"{r['images_per_s']:.1f}" in line
                   and line.split()[:3] == [r["backend"], r["precision"], str(r["batch"])] for line in text.splitlines()), r  # fmt: skip
    assert "not measured:" in text and "vit_tiny_patch16_224@224" in text


def test_bench_compare_fits_80_columns_with_every_ratio(capsys, monkeypatch):
    text = printed(capsys, monkeypatch, 80, "bench", "--compare", BASE, NEW)
    assert_fits(text)
    rows = [r for r in compare_rows(load_result(BASE)["rows"], load_result(NEW)["rows"], 0.02) if r["status"] == "ok"]
    assert rows
    for r in rows:
        assert any(f"{r['latency_ratio']:.3f}" in line and f"{r['p99_ratio']:.3f}" in line and r["verdict"] in line
                   and line.split()[:3] == [r["backend"], r["precision"], str(r["batch"])] for line in text.splitlines()), r  # fmt: skip


def test_bench_tables_stay_full_when_piped(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["bench", "--compare", str(BASE), str(NEW)]) == 0
    text = capsys.readouterr().out
    assert "img/s x" in text and "latency x" in text and "…" not in text


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory) -> Path:
    pytest.importorskip("onnxruntime", reason="the artifact here is an ONNX export: pip install 'vitfast[onnx]'")
    out = tmp_path_factory.mktemp("narrow") / "m.onnx"
    assert main(["export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--out", str(out), "--quiet"]) == 0
    return out


def test_check_summary_fits_80_columns(onnx_model, capsys, monkeypatch):
    result = json.loads(printed(capsys, monkeypatch, 80, "check", onnx_model, "--json", "--quiet"))
    monkeypatch.chdir(onnx_model.parent)
    text = printed(capsys, monkeypatch, 80, "check", "m.onnx", "--against", "m.onnx", "--quiet")
    assert_fits(text)
    assert "PASSED" in text and f"{result['cosine']:.6f}" in text and "top-1 agreement" in text


def test_eval_summary_against_a_reference_fits_80_columns(onnx_model, tmp_path, capsys, monkeypatch):
    import numpy as np
    from PIL import Image

    for c in range(10):
        (tmp_path / "data" / f"c{c}").mkdir(parents=True)
        Image.fromarray(np.full((32, 32, 3), 20 * c, np.uint8)).save(tmp_path / "data" / f"c{c}" / "0.png")
    (tmp_path / "m.onnx").symlink_to(onnx_model)
    (tmp_path / "m.onnx.json").symlink_to(Path(str(onnx_model) + ".json"))
    monkeypatch.chdir(tmp_path)
    text = printed(capsys, monkeypatch, 80, "eval", "m.onnx", "--data", "data", "--against", "m.onnx", "--quiet")
    assert_fits(text)
    assert "+0.00 points" in text and "same top-1 prediction on 100.00% of images" in text


def test_inspect_distances_of_16_heads_fit_80_columns(tmp_path, capsys, monkeypatch):
    import numpy as np
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "img.png")
    monkeypatch.chdir(tmp_path)  # short paths in the "wrote" lines
    text = printed(capsys, monkeypatch, 80, "inspect", "--model", "vit_base_patch16_gap_224", "--image", "img.png", "--out", "figs")
    assert_fits(text)
    layer1 = text.splitlines()[2:4]  # 16 heads: two lines of 8
    assert layer1[0].startswith("  layer  1: mean") and len(layer1[0].split()) == 5 + 8 and len(layer1[1].split()) == 8
