"""The `vitfast` console command, package layout, and no CUDA at import time."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import venv
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


def test_an_unexpected_exception_is_one_line_exit_3_and_debug_shows_traceback(monkeypatch, capsys):
    """A bug is neither a user error (2) nor a failed parity (1), the code it shared as an uncaught traceback."""
    from vitfast.cli import info, main

    def broken(args):
        raise RuntimeError("index 7 is out of bounds\nsecond line")

    monkeypatch.setattr(info, "cmd_models", broken)
    assert main(["models"]) == 3
    assert capsys.readouterr().err == ("vitfast: error: internal error: RuntimeError: index 7 is out of bounds; rerun with --debug "
                                       "for the traceback and report it\n")  # fmt: skip
    assert main(["models", "--debug"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "second line" in err and err.endswith("report it\n")


def test_python_dash_m_vitfast_is_the_cli():
    out = subprocess.run([sys.executable, "-m", "vitfast", "models", "--filter", "nothing*"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr == "vitfast: error: no registered model matches 'nothing*'; run `vitfast models` to see them all\n"


@pytest.mark.parametrize("signum, code, said", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_a_signal_exits_128_plus_its_number(signum, code, said):
    """SIGTERM (docker stop, kill) exited 130, Ctrl-C's code. In a process of its own: in pytest's, a signal that arrives
    after an OpenVINO compiled model was freed (an earlier test's) crashes the process inside OpenVINO's threads."""
    # a shell starts background jobs (a CI runner's, nohup's) with SIGINT ignored, and Python then installs no Ctrl-C handler:
    # the child takes a terminal's default, as a user's vitfast has
    script = ("import os, signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\nfrom vitfast.cli import info, main\n"
              f"info.cmd_models = lambda args: os.kill(os.getpid(), {int(signum)})\nsys.exit(main(['models']))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (code, f"vitfast: {said}\n")


def test_unknown_command_exits_2():
    out = run("frobnicate")
    assert out.returncode == 2 and "invalid choice" in out.stderr


@pytest.mark.parametrize("argv, flag", [
    (["predict", "m.onnx", "a.png", "--out", ""], "--out"),
    (["predict", "m.onnx", "a.png", "--labels", ""], "--labels"),
    (["predict", "m.onnx", "a.png", "--config", ""], "--config"),
    (["bench", "--model", "vit_tiny_patch16_224", "--csv", ""], "--csv"),
    (["bench", "--model", "vit_tiny_patch16_224", "--artifact", "m.onnx", "--artifact", ""], "--artifact"),
    (["check", "m.onnx", "--checkpoint", ""], "--checkpoint"),
])  # fmt: skip
def test_an_empty_value_is_refused_not_taken_for_a_flag_not_given(argv, flag, capsys):
    """`--out "$OUT"` with OUT unset: predict printed to stdout and bench wrote nothing, exit 0."""
    from vitfast.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and f"error: argument {flag}: expected a value, got an empty string" in capsys.readouterr().err


def test_an_empty_string_stays_a_value_where_it_is_one_of_the_choices():
    from vitfast.cli.main import _refuse_empty_values, build_parser

    parser = build_parser()
    args = parser.parse_args(["check", "m.onnx", "--global-pool", ""])  # timm's name for no pooling
    _refuse_empty_values(parser, args)
    assert args.global_pool == ""


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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A regular (non-editable) wheel of this checkout."""
    # Built from a copy of the source files alone: a stale build/ folder in the checkout would
    # otherwise put modules into the wheel that the package configuration leaves out.
    source = tmp_path_factory.mktemp("source")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in files.stdout.splitlines():
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out_dir = tmp_path_factory.mktemp("wheel")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out_dir), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (path,) = out_dir.glob("vitfast-*.whl")
    return path


def test_regular_wheel_maps_kernels_and_export(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "vitfast/kernels/__init__.py" in names and "vitfast/export/__init__.py" in names
    assert {"vitfast/kernels/mlp_dispatch.json", "vitfast/kernels/attention_dispatch.json"} <= set(names)  # package data read by vitfast.fused
    assert not any(n.startswith(("kernels/", "export/", "tests/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "vitfast = vitfast.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_wheel_ships_every_package_of_the_source_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    mapped = {"kernels": "vitfast/kernels", "export": "vitfast/export"}
    for init in REPO.glob("*/**/__init__.py"):
        folder = init.parent.relative_to(REPO).as_posix()
        top, _, rest = folder.partition("/")
        if top in mapped:
            folder = mapped[top] + ("/" + rest if rest else "")
        elif top != "vitfast":
            continue
        assert f"{folder}/__init__.py" in names, f"{folder} is missing from the wheel"


def test_wheel_installed_in_a_fresh_venv_runs_the_cli(wheel, tmp_path):
    """Install the wheel (not editable) into a new venv whose only other path is this venv's
    site-packages for the dependencies; then the CLI and every module must import from the wheel."""
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    fresh_site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True).strip())
    # A path line in a .pth is appended after the venv's own site-packages, and the .pth files in
    # it (this venv's editable finder) are not run, so `vitfast` can only come from the wheel.
    (fresh_site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def fresh_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)

    script = (
        "import pkgutil, importlib, vitfast, vitfast.kernels, vitfast.export;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(vitfast.__path__, 'vitfast.')];"
        "print(vitfast.__file__)"
    )
    out = fresh_run(str(python), "-c", script)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(fresh_site), out.stdout
    for args in (("info",), ("bench", "--help"), ("models", "--filter", "vit_tiny*")):
        out = fresh_run(str(fresh / "bin" / "vitfast"), *args)
        assert out.returncode == 0, f"vitfast {' '.join(args)}: {out.stderr}"


def test_json_into_a_closed_pipe_is_quiet():
    """`vitfast models --json | head -c 1`: the reader is gone before vitfast writes; no BrokenPipe traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run([sys.executable, "-m", "vitfast.cli", "models", "--json"], stdout=write_end, stderr=subprocess.PIPE,
                             text=True, timeout=120)  # fmt: skip
    finally:
        os.close(write_end)
    assert "BrokenPipe" not in out.stderr and "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr
    assert out.returncode == 1


def test_versions_are_those_of_the_imported_modules(monkeypatch):
    """Recorded versions name the build that runs: an imported module's own __version__ (PyPI's
    CUDA torch says 2.11.0+cu130, its wheel metadata 2.11.0), else the package metadata, else None."""
    import types
    from importlib.metadata import version

    from vitfast.info import library_version

    monkeypatch.setitem(sys.modules, "onnx", types.SimpleNamespace(__version__="1.23.1+local"))
    assert library_version("onnx") == "1.23.1+local"
    monkeypatch.delitem(sys.modules, "onnx")
    assert library_version("onnx") == version("onnx")
    assert library_version("no_such_module_here") is None
