"""Nothing lost, nothing crashes: every command under bad flags, corrupted files, unwritable or
foreign outputs and SIGKILL exits 0 or 2 (check: 1 for a parity failure), never shows a traceback
without --debug, leaves no file under an output name unless it succeeded, no temporary behind,
and touches nothing outside its output. Plus the API's input checks and the loaders' safety checks."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

pytest.importorskip("onnxruntime", reason="the artifacts here are ONNX exports: pip install 'vitfast[onnx]'")

import vitfast  # noqa: E402
from vitfast import cli  # noqa: E402
from vitfast.atomic import STAGING, atomic_write_text  # noqa: E402
from vitfast.errors import ArtifactError, CheckpointError, InputError  # noqa: E402
from vitfast.export.artifacts import read_sidecar, sidecar_path, write_sidecar  # noqa: E402

MODEL = "vit_cifar_patch4_32"
VITFAST = Path(sys.executable).parent / "vitfast"
# what libraries leave in TMPDIR on their own, not vitfast's temporaries: torch's compile cache, and
# the empty mat-debug-PID.log that importing ONNX Runtime 1.30 creates (1.32 does not)
LIBRARY_CACHES = ("torchinductor_", ".ses", "mat-debug-")


def library_leftover(path: Path) -> bool:
    """One of LIBRARY_CACHES, or the folder torch 2.9 creates when torch.distributed.nn.jit is imported
    (it holds only _remote_module_non_scriptable.py and outlives a SIGKILL; torch 2.10 creates none)."""
    if path.name.startswith(LIBRARY_CACHES):
        return True
    return path.is_dir() and [p.name for p in path.iterdir()] == ["_remote_module_non_scriptable.py"]


def run_cli(*args) -> tuple[int, str, str]:
    """`vitfast ARGS` in this process -> (exit code, stdout, stderr); argparse's exits included."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def tree(folder: Path) -> dict[str, tuple]:
    """path -> (is folder, size, mtime) for everything under `folder` (a folder's mtime moves when a
    staging folder comes and goes inside it: its entries are what count)."""
    return {str(p.relative_to(folder)): (True, 0, 0) if p.is_dir() else (False, p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*")}  # fmt: skip


def assert_contract(folder: Path, before: dict, result: tuple[int, str, str], out: Path | None, ok=(0, 2)) -> None:
    """The guarantees, for one command run in `folder` writing `out`."""
    code, _, err = result
    assert code in ok, err
    assert "Traceback" not in err, err
    if code == 2:
        assert err.strip().splitlines()[-1].startswith("vitfast"), err  # our line (or argparse's), last
    after = tree(folder)
    produced = {k for k in after if k not in before or after[k] != before[k]}
    outputs = {str(p.relative_to(folder)) for p in (out, sidecar_path(out)) if out and p.is_relative_to(folder)} if out else set()
    if code == 0 and out is not None:
        produced = {k for k in produced if not any(k == o or k.startswith(o + "/") for o in outputs)}
    elif out is not None:
        assert not out.exists() and not sidecar_path(out).exists(), err
    assert produced == set(), f"touched outside the output: {sorted(produced)}"
    assert not [k for k in before if k not in after], "removed files outside the output"
    assert not any(STAGING in k for k in after), "staging left behind"


@pytest.fixture(autouse=True)
def private_tmpdir(tmp_path, monkeypatch):
    """A TMPDIR of the test's own: whatever vitfast leaves there is visible."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    yield tmp
    left = [p.name for p in tmp.iterdir() if not library_leftover(p)]
    assert left == [], f"temporaries left in TMPDIR: {left}"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """An fp32 ONNX export (with sidecar), a checkpoint and a labelled image folder, built once."""
    root = tmp_path_factory.mktemp("assets")
    code, _, err = run_cli("export", "--model", MODEL, "--format", "onnx", "--batch", "1:4:8", "--out", root / "m.onnx")
    assert code == 0, err
    torch.manual_seed(0)
    vitfast.save_checkpoint(vitfast.create_model(MODEL), root / "m.safetensors")
    rng = np.random.default_rng(0)
    for cls in range(10):  # one folder per class of the model
        (root / "images" / f"c{cls}").mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (36, 40, 3), dtype=np.uint8)).save(root / "images" / f"c{cls}" / "0.png")
    return root


def copy_assets(assets: Path, dest: Path) -> Path:
    shutil.copytree(assets, dest, dirs_exist_ok=True)
    return dest


# ---------------------------------------------------------------------------- random flag values
NON_ASCII_DIGITS = st.text(alphabet="٠١٢٣٤٥٦٧٨٩²³۴൯", min_size=1, max_size=4)
JUNK = st.sampled_from(["", " ", "abc", "1.5", "1e3", "0x10", "--", "nan", "+", "-"])
NOT_POSITIVE = st.one_of(st.integers(max_value=0).map(str), NON_ASCII_DIGITS, JUNK)
BAD_PORT = st.one_of(st.integers(max_value=0).map(str), st.integers(min_value=65536, max_value=10**12).map(str), NON_ASCII_DIGITS, JUNK)
BAD_OPSET = st.one_of(st.integers(1, 16), st.integers(24, 10**6)).map(str)
BAD_BATCH = st.one_of(
    st.sampled_from(["0", "0:1:2", "8:4:2", "1:8", "1:8:99999999999", "1:2:65537", "-1:2:3", "1::3", "a:b:c", "1:2:3:4"]),
    st.lists(NON_ASCII_DIGITS, min_size=3, max_size=3).map(":".join),
)
BAD_FLOAT = st.sampled_from(["0", "-1", "nan", "inf", "-inf", "abc", ""])


def flag_cases(a: Path):
    export = ["export", "--model", MODEL, "--format", "onnx", "--out", a / "new.onnx"]
    onnx = a / "m.onnx"
    return [
        (export, "--calib-samples", NOT_POSITIVE), (export, "--img-size", NOT_POSITIVE), (export, "--opset", BAD_OPSET),
        (export, "--opset", NOT_POSITIVE), (export, "--batch", BAD_BATCH), (export, "--workspace", BAD_FLOAT),
        (export, "--opt-level", st.sampled_from(["-1", "6", "99", "x", "٣"])),
        (["check", onnx], "--samples", NOT_POSITIVE), (["eval", onnx, "--data", a / "images"], "--batch-size", NOT_POSITIVE),
        (["serve", onnx], "--port", BAD_PORT), (["serve", onnx], "--grpc-port", BAD_PORT), (["serve", onnx], "--metrics-port", BAD_PORT),
        (["serve", onnx], "--max-batch", NOT_POSITIVE), (["serve", onnx], "--top-k", NOT_POSITIVE),
        (["bench", "--model", MODEL, "--backends", "eager"], "--repeats", NOT_POSITIVE),
        (["bench", "--model", MODEL, "--backends", "eager"], "--batch", st.one_of(NOT_POSITIVE, BAD_BATCH)),
    ]  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_bad_numeric_flags_are_one_line_exit_2_and_write_nothing(assets, data):
    command, flag, values = data.draw(st.sampled_from(flag_cases(assets)), label="case")
    value = data.draw(values, label=flag)
    before = tree(assets)
    result = run_cli(*command, f"{flag}={value}")  # = keeps values like "-1" from reading as a flag
    assert_contract(assets, before, result, assets / "new.onnx", ok=(2,))


def test_opset_and_batch_errors_name_the_valid_range(assets):
    code, _, err = run_cli("export", "--model", MODEL, "--format", "onnx", "--opset", "99", "--out", assets / "x.onnx")
    assert code == 2 and "--opset must be 17..23" in err and err.count("\n") == 1
    code, _, err = run_cli("export", "--model", MODEL, "--format", "onnx", "--batch", "1:8:99999999999", "--out", assets / "x.onnx")
    assert code == 2 and "above 65536" in err


# ---------------------------------------------------------------------------- corrupted files
def _mutate_json(meta, path, value):
    node = meta
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


SIDECAR_FIELDS = [("precision",), ("config",), ("config", "num_classes"), ("config", "img_size"), ("config", "mean"), ("input",),
                  ("input", "batch"), ("input", "shape"), ("input", "image_sizes"), ("preprocessing",), ("preprocessing", "mean"),
                  ("source",), ("source", "model"), ("parity",), ("files",), ("kind",)]  # fmt: skip
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**9), st.floats(allow_nan=True), st.text(max_size=5),
                        st.lists(st.integers(-3, 40), max_size=4), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(target=st.sampled_from(["onnx", "sidecar", "checkpoint"]), data=st.data())
def test_corrupted_artifacts_never_crash_check_or_eval(assets, tmp_path_factory, target, data):
    work = copy_assets(assets, tmp_path_factory.mktemp("corrupt"))
    artifact = work / ("m.safetensors" if target == "checkpoint" else "m.onnx")
    if target == "sidecar":
        meta = read_sidecar(artifact)
        field = data.draw(st.sampled_from(SIDECAR_FIELDS), label="field")
        _mutate_json(meta, field, data.draw(JSON_VALUES, label="value"))
        if field[0] == "files":
            sidecar_path(artifact).write_text(json.dumps(meta))
        else:
            write_sidecar(artifact, meta)  # bound to the file: the field itself is what is wrong
    else:
        raw = bytearray(artifact.read_bytes())
        if data.draw(st.booleans(), label="truncate"):
            raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="length")]
        else:
            for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8), label="flips"):
                raw[pos] ^= 0xFF
        artifact.write_bytes(bytes(raw))
    before = tree(work)
    assert_contract(work, before, run_cli("check", artifact, "--samples", "2"), None, ok=(0, 1, 2))
    assert_contract(work, before, run_cli("eval", artifact, "--data", work / "images"), None)


def test_a_sidecar_that_disagrees_with_its_graph_is_refused(assets, tmp_path):
    good = read_sidecar(assets / "m.onnx")
    changes = {
        "class count": lambda m: m["config"].update(num_classes=m["config"]["num_classes"] + 1),
        "image size": lambda m: m["config"].update(img_size=64),
        "mean": lambda m: m["preprocessing"].update(mean=[0.1, 0.2, 0.3]),
    }
    for what, change in changes.items():
        work = copy_assets(assets, tmp_path / what.replace(" ", "_"))
        meta = json.loads(json.dumps(good))
        change(meta)
        write_sidecar(work / "m.onnx", meta)
        for backend in ("onnxruntime", "openvino") if importlib.util.find_spec("openvino") else ("onnxruntime",):
            with pytest.raises(ArtifactError, match="does not match its sidecar"):
                vitfast.load_engine(work / "m.onnx", backend=backend)
        code, _, err = run_cli("check", work / "m.onnx")
        assert code == 2 and "does not match its sidecar" in err and "Traceback" not in err


# ---------------------------------------------------------------------------- outputs
def test_existing_unwritable_and_file_as_parent_outputs(assets, tmp_path):
    work = copy_assets(assets, tmp_path / "w")
    (work / "afile").write_text("x")
    (work / "folder.onnx").mkdir()  # named as the format needs, so that the suffix check passes
    for out, message in [(work / "m.onnx", "already exists; pass --force"), (work / "afile" / "x.onnx", "is a file, not a folder"),
                         (work / "folder.onnx", "exists and is not a file")]:  # fmt: skip
        before = tree(work)
        result = run_cli("export", "--model", MODEL, "--format", "onnx", "--out", out)
        assert message in result[2] and "force=True" not in result[2]
        assert_contract(work, before, result, None if out.exists() else out, ok=(2,))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders: the permission case cannot be shown as root")
def test_read_only_output_folder(assets, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    code, _, err = run_cli("export", "--model", MODEL, "--format", "onnx", "--out", ro / "m.onnx")
    assert code == 2 and "not writable" in err and list(ro.iterdir()) == []


def test_triton_repo_force_never_deletes_a_folder_vitfast_did_not_make(assets, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("my notes")
    before = tree(tmp_path)
    for force in (["--force"], []):  # without --force too: never told to pass the --force that is then refused
        result = run_cli("export", "--model", MODEL, "--format", "triton-repo", *force, "--out", notes)
        assert result[0] == 2 and "not a model repository vitfast wrote" in result[2] and "pass --force" not in result[2]
        assert tree(tmp_path) == before
    for name in (".", "..", "..."):
        with pytest.raises(ArtifactError, match="not valid for Triton"):
            vitfast.export.triton_repository(assets / "m.onnx", tmp_path / "repo", name=name)


def test_nan_weights_are_refused_at_export_and_never_pass_parity(tmp_path):
    model = vitfast.create_model(MODEL)
    with torch.no_grad():
        model.blocks[0].mlp.fc1.weight[0, 0] = float("nan")
    vitfast.save_checkpoint(model, tmp_path / "nan.safetensors")
    before = tree(tmp_path)
    result = run_cli("export", "--checkpoint", tmp_path / "nan.safetensors", "--format", "onnx", "--out", tmp_path / "nan.onnx")
    assert "NaN or infinite weights" in result[2]
    assert_contract(tmp_path, before, result, tmp_path / "nan.onnx", ok=(2,))
    from vitfast.parity import compare

    logits = torch.randn(4, 10)
    assert compare(logits.clone().fill_(float("nan")), logits)["passed"] is False
    assert compare(logits, logits)["passed"] is True


def test_decompression_bombs_are_one_line(assets, tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 36 * 40 // 2 - 1)  # the fixture's images count as bombs now
    work = copy_assets(assets, tmp_path / "w")
    before = tree(work)
    result = run_cli("eval", work / "m.onnx", "--data", work / "images")
    assert "too large to decode safely" in result[2]
    assert_contract(work, before, result, None, ok=(2,))
    result = run_cli("export", "--model", MODEL, "--format", "onnx", "--precision", "int8", "--calib-dir", work / "images",
                     "--out", work / "q.onnx")  # fmt: skip
    assert "too large to decode safely" in result[2]
    assert_contract(work, before, result, work / "q.onnx", ok=(2,))


def test_sigkill_during_int8_export_leaves_no_output_and_no_tmp_and_blocks_a_second_export(assets, tmp_path, private_tmpdir):
    """A second export to the same path while the first runs fails at once; SIGKILL of the first
    leaves nothing under the output name and nothing in TMPDIR; the next vitfast write there cleans up."""
    work = copy_assets(assets, tmp_path / "w")
    out = work / "q.onnx"
    # Enough calibration images that ONNX Runtime's calibration lasts well beyond one poll interval,
    # and the exporter is frozen (SIGSTOP) the moment its temporaries show, so the second export
    # meets it mid-calibration however fast the machine is.
    rng = np.random.default_rng(1)
    for i in range(256):
        (work / "calib" / f"c{i % 10}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (36, 40, 3), dtype=np.uint8)).save(work / "calib" / f"c{i % 10}" / f"{i}.png")
    env = {**os.environ, "TMPDIR": str(private_tmpdir)}
    proc = subprocess.Popen([str(VITFAST), "export", "--model", MODEL, "--format", "onnx", "--precision", "int8",
                             "--calib-dir", work / "calib", "--out", out], env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not list((work / STAGING).glob("*.work/scratch/ort.quant.*")):  # ONNX Runtime's calibration temporaries
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "timeout"
            time.sleep(0.01)
        proc.send_signal(signal.SIGSTOP)
        code, _, err = run_cli("export", "--model", MODEL, "--format", "onnx", "--out", out)
        assert code == 2 and "another vitfast process is writing" in err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert not out.exists() and not sidecar_path(out).exists()
    assert not [p for p in private_tmpdir.iterdir() if not library_leftover(p)]
    assert list((work / STAGING).iterdir())  # the killed run's staging folder, until someone writes here
    atomic_write_text(work / "later.txt", "any later vitfast write in this folder")
    assert not (work / STAGING).exists()


# ---------------------------------------------------------------------------- Python API
def test_engine_input_checks_match_the_server_and_have_an_opt_out(assets):
    from vitfast.serve_guard import find_problem

    engine = vitfast.load_engine(assets / "m.safetensors")
    reference = vitfast.load_checkpoint(assets / "m.safetensors")
    for bad in (None, 3, "images", torch.tensor(1.0), [None], np.zeros((1, 0, 5, 3), np.uint8)):
        with pytest.raises(InputError):
            engine(bad)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = reference(x)
    torch.testing.assert_close(engine(x.clone().requires_grad_()), expected, atol=1e-5, rtol=1e-5)
    x[1, 0, 3, 3] = float("nan")
    with pytest.raises(InputError, match="non-finite"):
        engine(x)
    assert "non-finite" in find_problem("vit", "images", x.numpy(), [3, 32, 32])  # the server refuses the same batch
    engine.allow_nonfinite = True
    assert torch.isnan(engine(x)[1]).all() and torch.isfinite(engine(x)[0]).all()


def test_serve_allow_nonfinite_ships_a_guard_that_passes_nan_on():
    import types

    from vitfast.serve import _install_guard

    class FakeModel:
        model_name, model_version = "vit", 1

        def get_proxy_model_files(self):
            return {"file:1/model.py": b"proxy"}

    shipped = {}
    for allow in (False, True):
        model = FakeModel()
        _install_guard(types.SimpleNamespace(_model_manager=types.SimpleNamespace(models=[model])), {"vit"}, allow_nonfinite=allow)
        namespace: dict = {}
        exec(compile(model.get_proxy_model_files()["file:1/model.py"], "model.py", "exec"), namespace)  # the stub's view
        shipped[allow] = namespace["find_problem"]("vit", "images", np.full((1, 3, 2, 2), np.nan, np.float32), [3, 2, 2])
    assert "non-finite" in shipped[False] and shipped[True] is None


def test_quantize_int8_refuses_bad_calibration_tensors(assets, tmp_path):
    from vitfast.export import quantize_int8

    for bad, message in [(None, "calibration data"), (["abc"], "calibration data"), (torch.randn(4, 3, 16, 16), "shape"),
                         (torch.full((4, 3, 32, 32), float("nan")), "NaN"), (torch.randn(0, 3, 32, 32), "shape")]:  # fmt: skip
        with pytest.raises(InputError, match=message):
            quantize_int8(assets / "m.onnx", tmp_path / "q.onnx", bad, samples=4)
    with pytest.raises(InputError, match="samples"):
        quantize_int8(assets / "m.onnx", tmp_path / "q.onnx", torch.randn(4, 3, 32, 32), samples=0)
    assert list(tmp_path.iterdir()) == [tmp_path / "tmpdir"]


# ---------------------------------------------------------------------------- loaders
def test_hf_shard_index_cannot_reach_outside_the_model_folder(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (tmp_path / "secret.safetensors").write_bytes(b"")
    (folder / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../secret.safetensors"}}))
    with pytest.raises(CheckpointError, match="outside the model folder"):
        vitfast.load_checkpoint(folder)


def test_pth_with_compressed_records_is_refused_unread(tmp_path):
    plain = tmp_path / "plain.pth"
    torch.save({"w": torch.zeros(1 << 20)}, plain)  # 4 MiB of zeros: a deflated record shrinks it ~1000x
    bomb = tmp_path / "bomb.pth"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    assert bomb.stat().st_size < plain.stat().st_size // 50
    with pytest.raises(CheckpointError, match="refused unread"):
        vitfast.load_checkpoint(bomb)


def test_bench_cache_is_private_to_the_user(tmp_path, monkeypatch):
    from vitfast.bench.backends import BackendOptions, private_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert BackendOptions().work_dir == tmp_path / "cache" / "vitfast" / "bench"
    assert private_dir(tmp_path / "cache" / "vitfast" / "bench").stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InputError, match="writable by others"):
        private_dir(shared)


def test_serve_messages_name_real_flags_and_blame_the_host():
    import socket

    from vitfast.serve import ServeError, check_port_free

    with pytest.raises(ServeError, match="cannot bind to host 'no-such-host.invalid'.*--host"):
        check_port_free("no-such-host.invalid", 8000, "http")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ServeError, match=r"pass another --port$"):
            check_port_free("127.0.0.1", busy.getsockname()[1], "http")


def test_inspect_publishes_all_figures_or_none(assets, tmp_path, monkeypatch):
    import vitfast.inspect as vi

    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 40, 3), dtype=np.uint8))
    image.save(tmp_path / "cat.png")
    rendered = []

    def fail_on_third(fig):
        rendered.append(fig)
        if len(rendered) == 3:
            raise OSError(28, "No space left on device")  # the disk fills up halfway through
        return b"png"

    monkeypatch.setattr(vi, "_png", fail_on_third)
    out = tmp_path / "figs"
    out.mkdir()
    before = tree(tmp_path)
    result = run_cli("inspect", "--checkpoint", assets / "m.safetensors", "--image", tmp_path / "cat.png", "--out", out)
    assert len(rendered) == 3 and "the disk is full" in result[2]
    assert_contract(tmp_path, before, result, None, ok=(2,))
    assert list(out.iterdir()) == []  # not two PNGs out of four
