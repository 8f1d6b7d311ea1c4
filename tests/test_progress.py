"""Long commands say what they are doing: one `COMMAND: phase` line per phase on stderr off a terminal,
a live display with counts on one, nothing with --quiet; stdout stays the result (`--json`: one object)."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rich.console import Console

from vitfast.cli import main
from vitfast.cli.progress import PlainReporter, RichReporter, reporter
from vitfast.progress import SILENT

pytest.importorskip("onnxruntime", reason="the artifacts here are ONNX exports: pip install 'vitfast[onnx]'")
MODEL = "vit_cifar_patch4_32"  # 32x32 images, 10 classes
VITFAST = Path(sys.executable).parent / "vitfast"


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """An fp32 ONNX export of MODEL and an image folder with one subfolder per class."""
    root = tmp_path_factory.mktemp("progress")
    rng = np.random.default_rng(0)
    for c in range(10):
        (root / "data" / f"class{c}").mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (36, 40, 3), dtype=np.uint8)).save(root / "data" / f"class{c}" / f"{i}.png")
    assert main(["export", "--model", MODEL, "--format", "onnx", "--out", str(root / "m.onnx"), "--quiet"]) == 0
    return root


def run(capsys, *args) -> tuple[int, str, list[str]]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.splitlines()


# ---------------------------------------------------------------------------- off a terminal: one line per phase
def test_export_prints_one_line_per_phase_then_the_summary(work, tmp_path, capsys):
    code, out, err = run(capsys, "export", "--model", MODEL, "--format", "onnx", "--opset", "17", "--out", tmp_path / "m.onnx")
    assert code == 0 and out == ""
    assert err[:-1] == ["export: tracing fp32 ONNX (opset 17)", "export: checking the graph, parity with PyTorch fp32 on 4 images"]
    assert err[-1].startswith(f"wrote {tmp_path / 'm.onnx'} (fp32); parity vs fp32")


def test_int8_export_names_the_calibration_and_held_out_images(work, tmp_path, capsys):
    code, _, err = run(capsys, "export", "--model", MODEL, "--format", "onnx", "--precision", "int8", "--calib-dir", work / "data",
                       "--calib-samples", "12", "--out", tmp_path / "q.onnx")  # fmt: skip
    assert code == 0
    assert err[:-1] == [
        "export: tracing fp32 ONNX (opset 18)",
        "export: checking the graph, parity with PyTorch fp32 on 4 images",
        "export: preparing the graph for quantization (shape inference)",
        "export: calibrating int8 (minmax) on 12 images",
        "export: int8 parity with the fp32 ONNX on 8 held-out images",  # the 20 images left after the 12 calibrated on, at most 64
    ]  # fmt: skip


def test_triton_repo_export_says_when_it_writes_the_repository(work, tmp_path, capsys):
    code, out, err = run(capsys, "export", "--model", MODEL, "--format", "triton-repo", "--out", tmp_path / "repo")
    assert code == 0 and out == ""
    assert err[-2] == f"export: writing the Triton model repository {tmp_path / 'repo'}" and err[-1].startswith("wrote Triton model")


@pytest.mark.parametrize("against", [False, True])
def test_check_json_keeps_stdout_one_object_and_says_what_it_runs(work, capsys, against):
    extra = ["--against", work / "m.onnx"] if against else []
    code, out, err = run(capsys, "check", work / "m.onnx", "--json", "--samples", "20", *extra)
    assert code == 0 and json.loads(out)["n"] == 20
    assert err == ["check: running 20 images through both" if against else "check: running 20 images through m.onnx and the fp32 reference"]


def test_eval_json_keeps_stdout_one_object_and_counts_both_artifacts(work, capsys):
    code, out, err = run(capsys, "eval", work / "m.onnx", "--data", work / "data", "--against", work / "m.onnx", "--json")
    assert code == 0 and json.loads(out)["n"] == 20
    assert err == ["eval: evaluating m.onnx and m.onnx on 20 images"]  # preprocessed alike: one pass runs both


@pytest.mark.parametrize("command", ["export", "triton-repo", "check", "eval"])
def test_quiet_prints_nothing_on_success(work, tmp_path, capsys, command):
    args = {"export": ["export", "--model", MODEL, "--format", "onnx", "--out", tmp_path / "m.onnx"],
            "triton-repo": ["export", "--model", MODEL, "--format", "triton-repo", "--out", tmp_path / "repo"],
            "check": ["check", work / "m.onnx", "--json"],
            "eval": ["eval", work / "m.onnx", "--data", work / "data", "--json"]}[command]  # fmt: skip
    code, out, err = run(capsys, *args, "--quiet")
    assert code == 0 and err == []
    assert out == "" if command in ("export", "triton-repo") else json.loads(out)["n"] > 0


def test_quiet_still_prints_errors(work, capsys):
    code, _, err = run(capsys, "eval", work / "m.onnx", "--data", work / "data" / "class0", "--quiet")
    assert code == 2 and len(err) == 1 and err[0].startswith("vitfast: error:")


# ---------------------------------------------------------------------------- on a terminal: a live display
def test_the_reporter_is_plain_off_a_terminal_rich_on_one_and_silent_when_quiet():
    with reporter("eval", console=Console(file=io.StringIO())) as plain:
        assert isinstance(plain, PlainReporter)
    with reporter("eval", console=Console(file=io.StringIO(), force_terminal=True)) as rich:
        assert isinstance(rich, RichReporter)
    with reporter("eval", quiet=True, console=Console(file=io.StringIO(), force_terminal=True)) as quiet:
        assert quiet is SILENT


def test_a_tracked_step_on_a_terminal_is_a_bar_with_counts():
    screen = io.StringIO()
    seen = []
    with reporter("eval", console=Console(file=screen, force_terminal=True, width=80)) as progress:
        progress.phase("loading")
        for batch in progress.track([[1, 2, 3], [4, 5, 6], [7]], "evaluating m.onnx on 7 images", total=7, size=len):
            seen.append(batch)
            progress.display.refresh()  # what the terminal shows after each batch (the timer refreshes on its own)
    drawn = screen.getvalue()
    assert seen == [[1, 2, 3], [4, 5, 6], [7]]  # the items pass through unchanged
    assert "eval: loading" in drawn and "eval: evaluating m.onnx on 7 images" in drawn
    assert "3/7" in drawn and "6/7" in drawn and "━" in drawn  # counts in images, and the bar
    assert "\x1b[?25h" in drawn and drawn.endswith("\x1b[2K")  # the cursor is back and the display erased (transient)


def test_a_long_step_on_80_columns_wraps_its_text_and_keeps_the_counts_whole():
    screen = io.StringIO()
    with reporter("check", console=Console(file=screen, force_terminal=True, width=80)) as progress:
        for _ in progress.track(range(4), "running 3200 images through a_model_file_with_a_long_name.onnx and the fp32 reference",
                                total=3200, size=lambda _: 800):  # fmt: skip
            progress.display.refresh()
    drawn = screen.getvalue()
    assert "1600/3200" in drawn and "3200/3200" in drawn and "…" not in drawn


def test_eval_on_a_pseudo_terminal_draws_a_bar_and_keeps_stdout_json(work):
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm"}
    proc = subprocess.Popen([str(VITFAST), "eval", str(work / "m.onnx"), "--data", str(work / "data"), "--json", "--batch-size", "4"],
                            stdout=subprocess.PIPE, stderr=slave, env=env)  # fmt: skip
    os.close(slave)
    screen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        screen += chunk
    out = proc.stdout.read()
    assert proc.wait(timeout=120) == 0
    os.close(master)
    assert json.loads(out)["n"] == 20
    text = screen.decode(errors="replace")
    assert "eval: evaluating m.onnx on 20 images" in text and "20/20" in text and "━" in text


def test_a_library_bar_gets_the_terminal_to_itself_meanwhile():
    from vitfast.cli.progress import paused

    with reporter("export", console=Console(file=io.StringIO(), force_terminal=True)) as progress:
        progress.phase("building the fp16 TensorRT engine")
        with paused(progress):
            assert not progress.display.live.is_started  # TensorRT's own bar draws now
        assert progress.display.live.is_started


def test_library_calls_are_silent_by_default_even_on_a_terminal(work, tmp_path, capsys, monkeypatch):
    import vitfast
    from vitfast import pipeline
    from vitfast.export import quantize_int8

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    quantize_int8(work / "m.onnx", tmp_path / "q.onnx", work / "data", samples=8)
    engine = vitfast.load_engine(work / "m.onnx")
    pipeline.check_artifact(engine, work / "m.onnx", samples=20)
    pipeline.evaluate(engine, work / "data")
    assert capsys.readouterr() == ("", "")
