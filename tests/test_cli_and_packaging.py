"""The `vitfast` console command, package layout, and no CUDA at import time."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VITFAST = Path(sys.executable).parent / "vitfast"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(VITFAST), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_info_json_is_one_object_with_versions_and_gpu():
    out = run("info", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["versions"]["torch"] and "onnxruntime" in info["versions"] and "tensorrt" in info["versions"]
    assert info["gpu"]["available"] in (True, False)
    if not info["gpu"]["available"]:
        assert info["gpu"]["name"] is None
    assert info["tensorrt_available"] == (info["versions"]["tensorrt"] is not None)


def test_info_table_reports_gpu_line():
    out = run("info")
    assert out.returncode == 0 and "GPU" in out.stdout and "torch" in out.stdout


def test_models_json_has_params_and_gflops():
    out = run("models", "--json", "--filter", "vit_base_patch16_224")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["models"]
    assert row["name"] == "vit_base_patch16_224"
    assert abs(row["params_m"] - 86.568) < 0.01  # timm reports 86.57 M
    assert 17.5 <= row["gmacs"] <= 17.6 and row["gflops"] == pytest.approx(2 * row["gmacs"], abs=0.002)


def test_models_table_lists_every_model():
    out = run("models")
    assert out.returncode == 0
    assert "deit_base_distilled_patch16_224" in out.stdout and "vit_base_r50_s16_384" in out.stdout


def test_user_error_is_one_line_exit_2_and_debug_shows_traceback():
    out = run("models", "--filter", "nothing*")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "no registered model matches" in out.stderr
    debug = run("models", "--filter", "nothing*", "--debug")
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_unknown_command_exits_2():
    out = run("frobnicate")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_no_cuda_call_at_import_or_on_the_cpu_path(tmp_path):
    """Poison every CUDA entry point, then import everything and run a model and a checkpoint."""
    script = """
import torch
def boom(*a, **k): raise RuntimeError("CUDA touched")
for name in ("is_available", "init", "_lazy_init", "device_count", "current_device", "get_device_properties"):
    setattr(torch.cuda, name, boom)
import vitfast, vitfast.kernels, vitfast.export, vitfast.cli, vitfast.info, vitfast.flops
m = vitfast.create_model("vit_cifar_patch4_32")
vitfast.save_checkpoint(m, "m.safetensors")
m = vitfast.load_checkpoint("m.safetensors")
m(torch.randn(2, 3, 32, 32))
vitfast.flops.count_params(m.config)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_subpackages_map_to_top_level_folders_and_nothing_else_is_installed(tmp_path):
    script = (
        "import importlib.util as u, vitfast.kernels as k, vitfast.export as e;"
        "print(k.__file__); print(e.__file__); print(u.find_spec('kernels'), u.find_spec('export'))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    kernels_file, export_file, top_level = out.stdout.strip().splitlines()
    assert Path(kernels_file).parent.name == "kernels" and Path(export_file).parent.name == "export"
    assert top_level == "None None"


def test_regular_wheel_maps_kernels_and_export(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("vitfast-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "vitfast/kernels/__init__.py" in names and "vitfast/export/__init__.py" in names
    assert "vitfast/kernels/mlp_dispatch.json" in names  # package data read by vitfast.fused
    assert not any(n.startswith(("kernels/", "export/", "tests/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "vitfast = vitfast.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
