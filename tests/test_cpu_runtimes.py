"""benchmarks/cpu_runtimes.py --dry-run: every row of the CPU comparison runs (tiny model, 2 calls per
row), so the script cannot rot; the figures themselves are taken on a quiet machine, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openvino", reason="the comparison needs OpenVINO (pip install 'vitfast[openvino]')")
pytest.importorskip("nncf", reason="the comparison needs NNCF (test extra)")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_runtimes.py"


def test_dry_run_measures_every_runtime_and_records_the_machine(tmp_path):
    out = tmp_path / "cpu-runtimes.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    runtimes = {r["runtime"] for r in rows}
    # only another tool's baseline may be missing, with the reason (ONNX Runtime 1.30's quantize_dynamic fails on the graph)
    missing = result["environment"]["not_measured"].get("vit_tiny_patch16_224", {})
    assert set(missing) <= {"onnxruntime int8 quantize_dynamic"} and all("quantize_dynamic failed" in why for why in missing.values())
    assert {"onnxruntime fp32", "onnxruntime int8 quantize_dynamic", "onnxruntime int8 vitfast QDQ (openvino target)", "openvino fp32",
            "openvino int8 NNCF (latency)", "openvino int8 vitfast QDQ (openvino target, throughput)"} - set(missing) <= runtimes  # fmt: skip
    assert not set(missing) & runtimes
    assert {(r["model"], r["batch"]) for r in rows} == {("vit_tiny_patch16_224", 1), ("vit_tiny_patch16_224", 2)}
    for r in rows:
        assert len(r["samples_ms"]) == 2 and r["median_ms"] > 0 and r["images_per_s"] > 0
        if r["runtime"] == "onnxruntime fp32":
            assert r["vs_ort_fp32"] == 1.0
        if r["runtime"].startswith("openvino int8 vitfast"):  # against NNCF's file under the same hint
            nncf = next(n for n in rows if n["batch"] == r["batch"] and n["runtime"] == "openvino int8 NNCF (" + r["runtime"].rsplit(", ")[1])
            assert r["vs_nncf"] == pytest.approx(nncf["median_ms"] / r["median_ms"], rel=1e-2)
    auto = result["environment"]["auto"]["vit_tiny_patch16_224"]  # what load_engine picks, and the row that measured it
    assert auto["fp32"]["backend"] == "onnxruntime" and auto["fp32"]["row"] == "onnxruntime fp32"
    assert auto["int8-openvino"]["backend"] == "openvino" and auto["int8-openvino"]["row"].startswith("openvino int8 vitfast QDQ (openvino target")
    assert {r["auto"] for r in rows if r["auto"]} == {"fp32", "int8-openvino"}
    env = result["environment"]
    assert env["dry_run"] and env["command"].endswith("--dry-run --out " + str(out))
    assert len(env["loadavg_start"]) == 3 and env["cpu"] and env["versions"]["openvino"] and env["versions"]["nncf"]
    assert "| openvino int8 NNCF (throughput)" in done.stdout
