"""OpenVINO as a runtime: parity with the fp32 PyTorch reference, throughput streams, properties,
backend selection in `load_engine`, the CLI's --backend, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="export tests need onnxruntime (pip install 'vitfast[onnx]')")
pytest.importorskip("openvino", reason="the openvino backend needs OpenVINO (pip install 'vitfast[openvino]')")

import vitfast  # noqa: E402
from conftest import randomize  # noqa: E402
from vitfast.export import quantize_int8, to_onnx  # noqa: E402
from vitfast.export.artifacts import read_sidecar, write_sidecar  # noqa: E402
from vitfast.runtime.openvino_engine import OpenVinoEngine, compile_properties  # noqa: E402
from vitfast.runtime import OnnxEngine, load_engine  # noqa: E402

VITFAST = Path(sys.executable).parent / "vitfast"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, fp32 ONNX, fp16 ONNX): 50 tokens (7x7 patches + class token), width 192, random weights."""
    root = tmp_path_factory.mktemp("ov")
    torch.manual_seed(0)
    model = randomize(vitfast.create_model("vit_tiny_patch16_224", img_size=112, depth=3, num_classes=11), scale=0.1).eval()
    return model, to_onnx(model, root / "m.onnx", batch=(1, 4, 16)), to_onnx(model, root / "m.fp16.onnx", precision="fp16")


@pytest.mark.parametrize("batch", [1, 5])
def test_fp32_and_fp16_match_the_pytorch_reference(exported, batch):
    model, fp32, fp16 = exported
    x = torch.randn(batch, 3, 112, 112)
    with torch.no_grad():
        ref = model(x)
    for path, limit in ((fp32, 1e-4), (fp16, 2e-2)):
        engine = load_engine(path, backend="openvino")
        assert isinstance(engine, OpenVinoEngine) and engine.compiled_properties()["INFERENCE_PRECISION_HINT"] == "f32"
        got = engine(x)
        assert got.dtype == torch.float32 and got.shape == ref.shape
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= limit, path.name


def test_throughput_streams_split_the_batch_and_keep_the_order(exported):
    model, fp32, _ = exported
    latency = load_engine(fp32, backend="openvino", hint="latency", threads=1)
    streams = load_engine(fp32, backend="openvino", hint="throughput", streams=2, threads=2)  # OpenVINO caps streams at the cores
    assert latency.streams == 1 and streams.streams == 2 and streams.queue is not None
    x = torch.randn(5, 3, 112, 112)  # 3 + 2 across two requests running at once
    with torch.no_grad():
        ref = model(x)
    for got in (streams(x), streams(x[:1]), latency(x)):
        torch.testing.assert_close(got, ref[: len(got)], atol=1e-4, rtol=1e-4)


def test_uint8_images_go_through_the_artifacts_preprocessing(exported):
    model, fp32, _ = exported
    raw = np.random.default_rng(1).integers(0, 256, (3, 150, 130, 3), dtype=np.uint8)
    with torch.no_grad():
        ref = model(vitfast.preprocess(raw, model.config))
    torch.testing.assert_close(load_engine(fp32, backend="openvino")(raw), ref, atol=1e-4, rtol=1e-4)


def test_int8_runs_in_openvino_close_to_onnxruntime(exported, tmp_path):
    model, fp32, _ = exported
    calib = torch.randn(16, 3, 112, 112, generator=torch.Generator().manual_seed(0))
    int8 = quantize_int8(fp32, tmp_path / "m.int8.onnx", calib, samples=16, progress=False)
    x = torch.randn(4, 3, 112, 112)
    ov, ort, ref = load_engine(int8, backend="openvino")(x), load_engine(int8, backend="onnxruntime")(x), model(x).detach()
    assert torch.nn.functional.cosine_similarity(ov, ref).min() > 0.95
    assert torch.nn.functional.cosine_similarity(ov, ort).min() > 0.99  # the same QDQ graph, two int8 implementations


def test_properties_the_openvino_way():
    import openvino.properties as props
    import openvino.properties.hint as hints

    out = compile_properties(threads=2, hint="throughput", properties={props.streams.num: 4, hints.inference_precision: "bf16"})
    assert out == {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_NUM_THREADS": 2, "NUM_STREAMS": 4}
    assert compile_properties() == {"INFERENCE_PRECISION_HINT": "f32"}  # fp32 stays fp32 (not bf16 on AVX512-BF16 CPUs)
    with pytest.raises(vitfast.InputError, match="latency, throughput"):
        compile_properties(hint="fast")
    with pytest.raises(vitfast.InputError, match="threads must be >= 1"):
        compile_properties(threads=0)


def test_bad_property_and_bad_model_are_artifact_errors(exported, tmp_path):
    _, fp32, _ = exported
    with pytest.raises(vitfast.ArtifactError, match="OpenVINO cannot load .* for CPU: .*number of streams"):
        load_engine(fp32, backend="openvino", properties={"NUM_STREAMS": "many"})
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    write_sidecar(broken, read_sidecar(fp32))  # a sidecar that matches: the file itself is what is wrong
    with pytest.raises(vitfast.ArtifactError, match="broken.onnx is not a readable ONNX model"):
        load_engine(broken, backend="openvino")


def test_preprocessing_overrides_apply_as_in_onnx_runtime(exported):
    _, fp32, _ = exported
    overrides = {"mean": (0.2, 0.3, 0.4), "std": (0.6, 0.5, 0.4), "crop_pct": 1.0}
    ov_engine = load_engine(fp32, backend="openvino", overrides=overrides)
    ort_engine = load_engine(fp32, backend="onnxruntime", overrides=overrides)
    assert ov_engine.config == ort_engine.config and ov_engine.config.mean == (0.2, 0.3, 0.4)
    images = np.random.default_rng(0).integers(0, 256, (2, 130, 150, 3), dtype=np.uint8)
    torch.testing.assert_close(ov_engine(images), ort_engine(images), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(ov_engine(images), load_engine(fp32, backend="openvino")(images), atol=1e-3)


def test_backend_choice(exported):
    _, fp32, _ = exported
    assert isinstance(load_engine(fp32, backend="onnxruntime"), OnnxEngine)
    engine = load_engine(fp32)
    assert isinstance(engine, OnnxEngine) and "fp32 ONNX files" in engine.backend_choice  # auto: OpenVINO is no faster in fp32
    engine = load_engine(fp32, backend="openvino")
    assert isinstance(engine, OpenVinoEngine) and engine.backend_choice == "openvino requested"
    assert isinstance(load_engine(fp32, hint="latency"), OpenVinoEngine)  # OpenVINO's own keywords ask for it
    with pytest.raises(vitfast.InputError, match="use backend onnxruntime or openvino"):
        load_engine(fp32, backend="tensorrt")
    with pytest.raises(vitfast.InputError, match="unknown backend 'tvm'"):
        load_engine(fp32, backend="tvm")


def test_auto_runs_symmetric_int8_in_openvino_and_says_why(exported, tmp_path, monkeypatch):
    """The rule in `onnx_backend`: symmetric int8 QDQ -> OpenVINO when installed; the uint8 cpu form,
    execution providers, or no OpenVINO -> ONNX Runtime. The engine says which and why."""
    _, fp32, _ = exported
    calib = torch.randn(8, 3, 112, 112, generator=torch.Generator().manual_seed(0))
    files = {t: quantize_int8(fp32, tmp_path / f"{t}.onnx", calib, samples=6, target=t, progress=False) for t in ("openvino", "tensorrt", "cpu")}
    for target in ("openvino", "tensorrt"):
        engine = load_engine(files[target])
        assert isinstance(engine, OpenVinoEngine) and engine.backend_choice.startswith("auto: OpenVINO"), target
    engine = load_engine(files["cpu"])
    assert isinstance(engine, OnnxEngine) and "--int8-target cpu" in engine.backend_choice
    folder = tmp_path / "served"  # the same file given by its folder: its sidecar still decides (it was read as foreign)
    folder.mkdir()
    for name in (files["openvino"].name, files["openvino"].name + ".json"):
        (folder / name.replace("openvino", "model")).write_bytes((tmp_path / name).read_bytes())
    engine = load_engine(folder)
    assert isinstance(engine, OpenVinoEngine) and engine.backend_choice.startswith("auto: OpenVINO")
    assert isinstance(load_engine(folder, backend="openvino"), OpenVinoEngine)
    engine = load_engine(files["openvino"], providers=["CPUExecutionProvider"])
    assert isinstance(engine, OnnxEngine) and "providers" in engine.backend_choice
    import importlib.util

    import vitfast.runtime

    with monkeypatch.context() as patch:  # a CUDA provider: int8 QDQ is not OpenVINO's to run there
        patch.setattr(vitfast.runtime, "_ort_has_cuda", lambda: True)
        assert vitfast.runtime.onnx_backend(read_sidecar(files["openvino"]), {})[0] == "onnxruntime"
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else find_spec(name, *a))
    engine = load_engine(files["openvino"])
    assert isinstance(engine, OnnxEngine) and "not installed" in engine.backend_choice


def test_cli_auto_reports_openvino_and_mark_all_stays_on_onnx_runtime(exported, tmp_path):
    """check/eval on an int8 file under auto say on stderr that OpenVINO runs it; --mark-all, which
    needs ONNX Runtime's marked outputs, asks for ONNX Runtime itself."""
    _, fp32, _ = exported
    calib = torch.randn(8, 3, 112, 112, generator=torch.Generator().manual_seed(0))
    int8 = quantize_int8(fp32, tmp_path / "m.int8.onnx", calib, samples=6, target="openvino", progress=False)
    run = lambda *args: subprocess.run([str(VITFAST), *map(str, args)], capture_output=True, text=True, timeout=600)  # noqa: E731
    check = run("check", int8, "--against", fp32, "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["backend"] == "openvino" and "auto: OpenVINO runs symmetric int8" in check.stderr
    marked = run("check", int8, "--against", fp32, "--mark-all", "--json")
    assert marked.returncode in (0, 1) and "Traceback" not in marked.stderr, marked.stderr
    result = json.loads(marked.stdout)
    assert result["backend"] == result["against_backend"] == "onnxruntime" and result["layers"]["compared"] > 0
    assert "OpenVINO" not in marked.stderr


def test_openvino_missing_is_one_clear_error(exported, monkeypatch):
    _, fp32, _ = exported
    monkeypatch.setitem(sys.modules, "openvino", None)  # makes `import openvino` raise ImportError
    with pytest.raises(vitfast.BackendUnavailable, match=r"pip install 'vitfast\[openvino\]'"):
        load_engine(fp32, backend="openvino")


def test_cli_check_and_eval_through_openvino(tmp_path):
    def vitfast_cli(*args):
        return subprocess.run([str(VITFAST), *map(str, args)], capture_output=True, text=True, timeout=600)

    onnx_path = tmp_path / "m.onnx"
    assert vitfast_cli("export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--out", onnx_path).returncode == 0
    check = vitfast_cli("check", onnx_path, "--backend", "openvino", "--json")
    assert check.returncode == 0, check.stderr
    result = json.loads(check.stdout)
    assert result["backend"] == "openvino" and result["passed"]
    bad = vitfast_cli("eval", onnx_path, "--data", tmp_path, "--backend", "tensorrt")
    assert bad.returncode == 2 and "use backend onnxruntime or openvino" in bad.stderr and "Traceback" not in bad.stderr


def test_bench_measures_openvino_on_its_own_int8_form(tmp_path, capsys):
    from vitfast.cli import main

    argv = ["bench", "--model", "vit_tiny_patch16_224", "--img-size", "32", "--backends", "openvino", "--precision", "fp32,int8",
            "--batch", "2", "--repeats", "3", "--warmup", "1", "--threads", "2", "--ov-hint", "throughput",
            "--work-dir", str(tmp_path), "--calib-samples", "4", "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = {r["precision"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert all(r["status"] == "ok" and r["median_ms"] > 0 for r in rows.values()), rows
    assert rows["fp32"]["details"]["properties"]["PERFORMANCE_HINT"] == "THROUGHPUT"
    assert rows["int8"]["details"]["int8"]["target"] == "openvino"


def test_cli_runtime_flags_reach_the_engine_or_are_refused(exported, tmp_path):
    """--threads / --ov-hint / --ov-streams on check, eval and serve: OpenVINO gets them as compile
    properties (and under auto they pick it), ONNX Runtime gets --threads; a flag the runtime has no
    use for is a one-line error, not silently dropped."""
    from vitfast.cli.export import load_artifact
    from vitfast.cli.main import build_parser

    _, fp32, _ = exported
    parser = build_parser()
    args = parser.parse_args(["check", str(fp32), "--ov-hint", "throughput", "--ov-streams", "2", "--threads", "2"])
    engine = load_artifact(args.artifact, args, backend=args.backend)
    props = engine.compiled_properties()
    assert engine.kind == "openvino" and "hint, streams" in engine.backend_choice
    assert (props["PERFORMANCE_HINT"], props["NUM_STREAMS"], props["INFERENCE_NUM_THREADS"]) == ("THROUGHPUT", "2", "2")
    args = parser.parse_args(["eval", str(fp32), "--data", str(tmp_path), "--backend", "onnxruntime", "--threads", "1"])
    engine = load_artifact(args.artifact, args, backend=args.backend)
    assert engine.kind == "onnxruntime" and engine.session.get_session_options().intra_op_num_threads == 1

    from vitfast.cli.export import runtime_options

    for path, flags, message in (("m.safetensors", ["--ov-hint", "latency"], "OpenVINO, which runs ONNX files"),
                                 ("m.plan", ["--threads", "2"], "is a TensorRT engine")):  # fmt: skip
        with pytest.raises(vitfast.InputError, match=message):
            runtime_options(path, parser.parse_args(["check", path, *flags]), "auto")
    run = lambda *a: subprocess.run([str(VITFAST), *map(str, a)], capture_output=True, text=True, timeout=600)  # noqa: E731
    wrong = run("check", fp32, "--backend", "onnxruntime", "--ov-hint", "latency")
    assert wrong.returncode == 2 and "use --backend openvino (or auto)" in wrong.stderr and "Traceback" not in wrong.stderr
    bad_streams = run("serve", fp32, "--ov-streams", "0")
    assert bad_streams.returncode == 2 and "--ov-streams" in bad_streams.stderr


def test_a_signal_after_two_engines_were_freed_is_handled_not_a_crash(exported):
    """Each engine made its own openvino.Core: with two Cores' compiled models freed (a bench's fp16 and fp32 rows), the
    next signal Python handled crashed the process with SIGSEGV in OpenVINO's threads. One Core per process now."""
    script = (
        "import gc, os, signal, sys, torch\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"  # a background job (a CI runner's) starts with it ignored
        "from vitfast.runtime import load_engine\n"
        "engines = [load_engine(sys.argv[1], backend='openvino') for _ in range(2)]\n"
        "for e in engines:\n    e(torch.randn(2, 3, 112, 112))\n"
        "del engines, e\ngc.collect()\n"
        "try:\n    os.kill(os.getpid(), signal.SIGINT)\nexcept KeyboardInterrupt:\n    print('handled')\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(exported[1])], capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (0, "handled\n"), done.stderr[-2000:]
