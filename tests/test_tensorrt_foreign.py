"""TensorRT engines another tool built (trtexec, polygraphy): no vitfast sidecar, so the input, output and profile are
read from the engine and the preprocessing comes from --config / the flags; and engines vitfast builds from another
tool's ONNX graph (ModelOpt's Q/DQ, Optimum's). Runs against test_tensorrt's fake `tensorrt` module, whose plan for
another tool's engine is a JSON spec of what the engine reports; running an engine needs a GPU."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import vitfast
from vitfast.cli.main import main
from vitfast import pipeline
from vitfast.describe import describe, describe_sidecar
from vitfast.errors import ArtifactError, ConfigError, InputError, VitfastWarning
from vitfast.export import tensorrt as trt_export
from vitfast.export.artifacts import base_metadata, read_sidecar, write_sidecar

from test_tensorrt import dynamic_onnx, exported, gpu, onnx_file, rec  # noqa: F401  (fixtures: a small ViT's ONNX, the fake tensorrt, a pretend GPU)

NCHW = {"images": ["INPUT", "FLOAT", [-1, 3, 224, 224]], "logits": ["OUTPUT", "FLOAT", [-1, 1000]]}
PROFILE = [[1, 3, 224, 224], [8, 3, 224, 224], [64, 3, 224, 224]]
HALF_LAYERS = [{"Name": "gemm", "Inputs": [{"Format/Datatype": "Row major linear FP16 format"}],
                "Outputs": [{"Format/Datatype": "Row major linear FP16 format"}]},
               {"Name": "norm", "Inputs": [{"Format/Datatype": "Row major linear FP32"}], "Outputs": [{"Format/Datatype": "Float"}]}]  # fmt: skip
IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}


def plan(folder: Path, name: str = "trtexec.engine", io=NCHW, profile=PROFILE, profiles=1, layers=None, **extra) -> Path:
    """An engine file as the fake TensorRT reads it: what the engine says of its IO, profile and (with `layers`, as a
    --profilingVerbosity=detailed build lists them) its layers' formats."""
    path = folder / name
    path.write_text(json.dumps({"io": io, "profile": profile, "profiles": profiles, "layers": layers, **extra}))
    return path


def test_an_engine_without_a_sidecar_runs_with_the_preprocessing_it_is_given(rec, gpu, tmp_path):
    engine = vitfast.load_engine(plan(tmp_path, layers=HALF_LAYERS), overrides=IMAGENET | {"labels": [f"c{i}" for i in range(1000)]})
    assert engine.kind == "tensorrt" and engine.metadata["foreign"] and engine.metadata["read_from"] == "engine"
    assert (engine.input_name, engine.output_name, engine.layout) == ("images", "logits", "NCHW")
    assert engine.batch == (1, 8, 64)  # the profile's
    assert (engine.config.img_hw, engine.config.num_classes, engine.config.mean) == ((224, 224), 1000, IMAGENET["mean"])
    assert engine.config.labels[-1] == "c999" and engine.missing_preprocessing is None
    assert engine.precision == "fp16" and engine.metadata["warnings"] == []  # the coarsest format its layers list
    assert engine.metadata["tensorrt"]["profile"]["max"] == [64, 3, 224, 224]


def formats(*names: str) -> list[dict]:
    return [{"Name": f"layer{i}", "Inputs": [{"Format/Datatype": name}], "Outputs": []} for i, name in enumerate(names)]


@pytest.mark.parametrize(
    "layers, precision, called, warned",
    [
        (None, "fp16", "fp16 (assumed)", "does not record the precision"),  # layer names only (the default verbosity)
        (formats("Thirty-two wide channel vectorized row major Int8 format.", "Row major linear FP16 format"), "int8", "int8", None),
        (formats("Row major linear UInt8 format", "Row major linear FP16 format"), "fp16", "fp16", None),  # UInt8 is no int8
        (formats("Row major linear BFloat16 format"), "bf16", "bf16", None),
        (formats("Row major linear FP4 format", "Int8"), "int4", "int4", None),
        # fp32 formats may hide TF32 matmuls (on unless --noTF32), which fp32's tolerances would fail
        (formats("Row major linear FP32", "Float"), "fp16", "fp32 or tf32", "whether TF32 was allowed"),
    ],
)  # fmt: skip
def test_precision_comes_from_the_layer_formats_else_fp16_is_assumed_and_said(rec, gpu, tmp_path, layers, precision, called, warned):
    engine = vitfast.load_engine(plan(tmp_path, layers=layers), overrides=IMAGENET)
    assert (engine.precision, engine.io.precision) == (precision, called)
    said = engine.metadata["warnings"]
    assert (said == []) if warned is None else (len(said) == 1 and warned in said[0])


def test_dims_the_profile_pins_are_known(rec, gpu, tmp_path):
    """Optimum's ViT ONNX leaves batch, channels, height and width dynamic; an engine built from it for 224x224 pins all
    but the batch in its profile."""
    io = {"pixel_values": ["INPUT", "FLOAT", [-1, -1, -1, -1]], "logits": ["OUTPUT", "FLOAT", [-1, 1000]]}
    engine = vitfast.load_engine(plan(tmp_path, io=io), overrides=IMAGENET)
    assert (engine.layout, engine.config.in_chans, engine.config.img_hw, engine.batch) == ("NCHW", 3, (224, 224), (1, 8, 64))


def test_raw_images_need_the_mean_and_std_float_images_do_not(rec, gpu, tmp_path):
    engine = vitfast.load_engine(plan(tmp_path))
    assert "no mean/std for raw images" in engine.missing_preprocessing
    with pytest.raises(InputError, match="no vitfast sidecar and no mean/std"):
        engine.prepare(np.zeros((1, 224, 224, 3), np.uint8))
    assert engine.prepare(torch.randn(2, 3, 224, 224)).shape == (2, 3, 224, 224)
    with pytest.raises(InputError, match="outside this artifact's profile 1..64"):
        engine.prepare(torch.randn(65, 3, 224, 224))


def test_a_dynamic_size_engine_needs_an_image_size_in_its_profile_and_infers_its_output(rec, gpu, tmp_path):
    io = {"x": ["INPUT", "HALF", [-1, -1, -1, 3]], "scores": ["OUTPUT", "HALF", [-1, -1]]}  # NHWC, fp16 IO, classes dynamic
    path = plan(tmp_path, io=io, profile=[[1, 112, 112, 3], [4, 224, 224, 3], [8, 448, 448, 3]], resolved={"scores": [0, 37]})
    with pytest.raises(ConfigError, match="dynamic image size and no vitfast sidecar: pass --img-size"):
        vitfast.load_engine(path, overrides=IMAGENET)
    with pytest.raises(ConfigError, match="built for images of 112x112 to 448x448 .* not 512x512: pass an --img-size in that range"):
        vitfast.load_engine(path, overrides=IMAGENET | {"img_size": 512})
    engine = vitfast.load_engine(path, overrides=IMAGENET | {"img_size": 256})
    assert (engine.layout, engine.config.in_chans, engine.config.img_hw, engine.batch) == ("NHWC", 3, (256, 256), (1, 4, 8))
    assert engine.config.num_classes == 37  # from TensorRT's shape inference at 256x256, nothing run
    assert engine.input_dtype == torch.float16 and engine.output_dtypes == {"scores": torch.float16}


def test_of_several_outputs_the_logits_run_and_every_output_gets_a_buffer(rec, gpu, tmp_path):
    io = {"pixel_values": ["INPUT", "FLOAT", [-1, 3, 224, 224]], "pooler_output": ["OUTPUT", "FLOAT", [-1, 768]],
          "logits": ["OUTPUT", "FLOAT", [-1, 1000]], "top5": ["OUTPUT", "INT32", [-1, 5]]}  # fmt: skip
    path = plan(tmp_path, io=io)
    engine = vitfast.load_engine(path, overrides=IMAGENET)
    assert engine.output_name == "logits" and engine.config.num_classes == 1000
    assert engine.output_dtypes == {"pooler_output": torch.float32, "logits": torch.float32, "top5": torch.int32}
    features = vitfast.load_engine(path, overrides=IMAGENET, output="pooler_output")
    assert features.output_name == "pooler_output" and features.config.num_classes == 0 and features.config.embed_dim == 768
    with pytest.raises(ArtifactError, match="has no output 'probs'"):
        vitfast.load_engine(path, overrides=IMAGENET, output="probs")


@pytest.mark.parametrize(
    "io, match",
    [
        ({"a": ["INPUT", "FLOAT", [-1, 3, 8, 8]], "b": ["INPUT", "FLOAT", [-1, 3, 8, 8]], "y": ["OUTPUT", "FLOAT", [-1, 2]]},
         "has 2 inputs \\(a, b\\); vitfast runs image models with one image input"),
        ({"ids": ["INPUT", "INT32", [-1, 3, 8, 8]], "y": ["OUTPUT", "FLOAT", [-1, 2]]}, "input 'ids' is DataType.INT32, not float32/float16"),
        ({"x": ["INPUT", "FLOAT", [-1, 8]], "y": ["OUTPUT", "FLOAT", [-1, 2]]}, "expected images \\[batch, 3, H, W\\]"),
    ],
)  # fmt: skip
def test_engines_that_take_no_image_are_refused_by_name(rec, gpu, tmp_path, io, match):
    with pytest.raises(ArtifactError, match=match):
        vitfast.load_engine(plan(tmp_path, io=io, profile=[[1, 3, 8, 8]] * 3), overrides=IMAGENET)


def test_an_output_whose_shape_the_input_does_not_set_is_refused(rec, gpu, tmp_path):
    io = NCHW | {"boxes": ["OUTPUT", "FLOAT", [-1, -1, 4]]}  # e.g. after a non-maximum suppression
    with pytest.raises(ArtifactError, match="output 'boxes' has a data-dependent shape"):
        vitfast.load_engine(plan(tmp_path, io=io, resolved={"boxes": [0, -1, 4]}), overrides=IMAGENET)


def test_an_engine_tensorrt_cannot_load_says_why_engines_do_not_move(rec, gpu, tmp_path):
    path = tmp_path / "old.plan"
    path.write_bytes(b"other-tensorrt plan")
    with pytest.raises(ArtifactError, match="TensorRT 10.7.0 cannot load .*without a vitfast sidecar does not say which: rebuild it"):
        vitfast.load_engine(path)


def test_a_second_profile_is_said_to_be_unused(rec, gpu, tmp_path):
    engine = vitfast.load_engine(plan(tmp_path, profiles=2, layers=HALF_LAYERS), overrides=IMAGENET)
    assert engine.metadata["warnings"] == ["the engine has 2 optimization profiles; vitfast runs the first"]


def test_info_on_a_trtexec_engine_takes_the_onnx_sidecar_as_its_config(rec, gpu, tmp_path, capsys):
    """The workflow `vitfast export --format trt` prints without TensorRT: trtexec builds the engine, the ONNX's sidecar
    gives the preprocessing and class names."""
    config = vitfast.create_model("vit_tiny_patch16_224", num_classes=1000).config.replace(mean=(0.5,) * 3, std=(0.5,) * 3)
    onnx_file = tmp_path / "m.onnx"
    onnx_file.write_bytes(b"onnx")
    write_sidecar(onnx_file, base_metadata("onnx", config, "fp32", batch=None, dynamic_batch=True))
    engine_file = plan(tmp_path, "m.engine", layers=HALF_LAYERS)
    assert main(["info", str(engine_file), "--config", f"{onnx_file}.json", "--json"]) == 0
    out, err = capsys.readouterr()
    facts = json.loads(out)
    assert facts["made_by"].startswith("another tool (no vitfast sidecar): input and output read from the TensorRT engine")
    assert facts["preprocessing"]["mean"] == [0.5] * 3 and facts["precision"] == "fp16" and facts["output"]["classes"] == 1000
    assert "has no vitfast sidecar; read from the engine: input 'images' float32 [batch, 3, 224, 224] (NCHW)" in err
    with pytest.raises(ConfigError, match="takes 224x224 images \\(fixed in the graph\\) but the preprocessing says 256x256"):
        vitfast.load_engine(engine_file, overrides={"img_size": 256})


# ---------------------------------------------------------------------------- engines vitfast builds from another tool's ONNX


def bare(onnx_file: Path, folder: Path, name: str = "theirs.onnx") -> Path:
    """The ONNX as another tool leaves it: no vitfast sidecar."""
    copy = folder / name
    shutil.copyfile(onnx_file, copy)
    return copy


def with_input_qdq(onnx_file: Path, folder: Path, fp8: bool = False, zero_point: tuple[str, int] = ("INT8", 0)) -> Path:
    """The graph with a quantize -> dequantize pair on its image, as a Q/DQ quantizer leaves it: int8 QuantizeLinear /
    DequantizeLinear (`zero_point`: its element type and value), or ModelOpt's torch-export fp8 ops (domain trt, no zero point)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(onnx_file))
    graph = model.graph
    name = graph.input[0].name
    for node in graph.node:
        node.input[:] = [f"{name}_dq" if i == name else i for i in node.input]
    graph.initializer.extend([helper.make_tensor("s", TensorProto.FLOAT, [], [0.02]), helper.make_tensor("z", getattr(TensorProto, zero_point[0]), [], [zero_point[1]])])
    q, dq, args, domain = ("TRT_FP8QuantizeLinear", "TRT_FP8DequantizeLinear", ["s"], "trt") if fp8 else ("QuantizeLinear", "DequantizeLinear", ["s", "z"], "")
    graph.node.insert(0, helper.make_node(dq, [f"{name}_q", *args], [f"{name}_dq"], name="input_dq", domain=domain))
    graph.node.insert(0, helper.make_node(q, [name, *args], [f"{name}_q"], name="input_q", domain=domain))
    if fp8:
        model.opset_import.append(helper.make_opsetid("trt", 1))
    path = folder / f"theirs.{'fp8' if fp8 else 'int8'}.onnx"
    onnx.save(model, str(path))
    return path


def test_an_engine_builds_from_another_tools_graph_with_the_preprocessing_given(rec, gpu, exported, tmp_path):
    onnx_file, model = exported
    theirs = bare(onnx_file, tmp_path)
    with pytest.raises(ConfigError, match="no vitfast sidecar and no mean/std: the engine's sidecar records how raw images"):
        trt_export.build_engine(theirs, tmp_path / "refused.engine", progress=False)
    labels = [f"c{i}" for i in range(10)]
    path = trt_export.build_engine(theirs, tmp_path / "m.engine", overrides=IMAGENET | {"labels": labels}, progress=False)
    meta = read_sidecar(path)
    assert meta["foreign"] and meta["source"]["made_by"] == "another tool" and meta["source"]["onnx"] == str(theirs.resolve())
    assert meta["graph"].startswith("input 'images' float32 [batch, 3, 32, 32] (NCHW)") and meta["output"]["name"] == "logits"
    assert (meta["config"]["num_classes"], meta["config"]["labels"][-1], tuple(meta["config"]["mean"])) == (10, "c9", IMAGENET["mean"])
    assert meta["input"]["dtype"] == meta["output"]["dtype"] == "float32"
    assert sum(bool(layer.output_types) for layer in rec.networks[-1].layers) == 2 * model.config.depth + 1  # LayerNorm kept fp32

    engine = vitfast.load_engine(path, overrides={"mean": (0.5,) * 3})  # the preprocessing may be restated at load
    assert engine.config.mean == (0.5,) * 3 and engine.config.std == IMAGENET["std"] and engine.precision == "fp16"
    assert engine.io.output_name == "logits" and engine.batch == (1, 8, 32)
    facts = describe(engine)
    assert facts["made_by"].endswith("from another tool's ONNX graph: input and output read from the graph, preprocessing given at the build")
    assert "model" not in facts  # no FLOPs or parameter count for an architecture the graph does not say


@pytest.mark.parametrize("fp8", [False, True])
def test_a_quantized_graph_builds_only_at_its_own_precision(rec, gpu, onnx_file, tmp_path, fp8):
    """int8 Q/DQ, or the fp8 pair ModelOpt's torch export writes (trt::TRT_FP8QuantizeLinear, no zero point)."""
    theirs, own = with_input_qdq(onnx_file, tmp_path, fp8=fp8), "fp8" if fp8 else "int8"
    for wrong in ("fp32", "fp16", "int8" if fp8 else "fp8"):
        with pytest.raises(ArtifactError, match=f"is {own}-quantized \\(its Q/DQ nodes\\): build it with --precision {own}"):
            trt_export.build_engine(theirs, tmp_path / "a.engine", precision=wrong, overrides=IMAGENET, progress=False)
        with pytest.raises(ArtifactError, match=f"build it with --precision {own}"):
            trt_export.trtexec_command(theirs, "a.engine", precision=wrong, batch=(1, 8, 32), overrides=IMAGENET)
    path = trt_export.build_engine(theirs, tmp_path / "c.engine", precision=own, overrides=IMAGENET, progress=False)
    assert read_sidecar(path)["precision"] == own and set(rec.configs[-1].flags) >= {f"BuilderFlag.{own.upper()}", "BuilderFlag.FP16"}
    assert f"--{own} --fp16" in trt_export.trtexec_command(theirs, "c.engine", precision=own, batch=(1, 8, 32), overrides=IMAGENET)


@pytest.mark.parametrize("quantized", [("UINT8", 128), ("UINT8", 0), ("INT8", 3), "onnxruntime quantize_dynamic"])
def test_a_graph_tensorrt_cannot_quantize_faithfully_is_refused_and_runs_in_onnx_runtime(rec, gpu, onnx_file, tmp_path, quantized):
    """ONNX Runtime's default QUInt8 activations (uint8, zero point 128; TensorRT would read a uint8 zero point of 0 as
    int8 and clip), a shifted int8 zero point, or its dynamic format (DynamicQuantizeLinear + MatMulInteger): TensorRT's
    parser refuses or misreads these deep in the build; vitfast says so first and names the fix. ONNX Runtime runs them."""
    if isinstance(quantized, tuple):
        theirs, problem = with_input_qdq(onnx_file, tmp_path, zero_point=quantized), ("quantizes to uint8" if quantized[0] == "UINT8"
                                                                                   else "quantized around non-zero zero points")
    else:
        from onnxruntime.quantization import quantize_dynamic

        theirs, problem = tmp_path / "dynamic.onnx", "holds ONNX Runtime's integer ops (ConvInteger, DynamicQuantizeLinear, MatMulInteger:"
        quantize_dynamic(str(onnx_file), str(theirs))
    refusal = f"{re.escape(problem)}.*; run it with ONNX Runtime, or quantize it again as symmetric int8 Q/DQ"
    with pytest.raises(ArtifactError, match=refusal):
        trt_export.build_engine(theirs, tmp_path / "a.engine", precision="int8", overrides=IMAGENET, progress=False)
    with pytest.raises(ArtifactError, match=refusal):
        trt_export.trtexec_command(theirs, "a.engine", precision="int8", batch=(1, 8, 32), overrides=IMAGENET)
    assert not (tmp_path / "a.engine").exists()
    engine = vitfast.load_engine(theirs, overrides=IMAGENET)
    assert engine.precision == "int8" and engine(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_a_graph_of_any_size_is_built_and_loaded_at_the_one_size_given(rec, gpu, dynamic_onnx, tmp_path):
    theirs = bare(dynamic_onnx[1], tmp_path)
    with pytest.raises(ConfigError, match="dynamic image size and no vitfast sidecar: pass --img-size"):
        trt_export.build_engine(theirs, tmp_path / "a.engine", overrides=IMAGENET, progress=False)
    path = trt_export.build_engine(theirs, tmp_path / "m.engine", overrides=IMAGENET | {"img_size": 48}, progress=False)
    assert rec.configs[-1].profiles[0].shapes["images"] == ((1, 3, 48, 48), (8, 3, 48, 48), (32, 3, 48, 48))
    meta = read_sidecar(path)
    assert meta["input"]["shape"] == ["batch", 3, 48, 48] and "image_sizes" not in meta["input"]
    engine = vitfast.load_engine(path)
    assert engine.config.img_hw == (48, 48) and engine.image_sizes is None
    with pytest.raises(InputError, match="fixes what these override: img_size 64"):
        vitfast.load_engine(path, overrides={"img_size": 64})
    assert vitfast.load_engine(path, overrides={"num_heads": 5}).config == engine.config  # not a field the graph says
    facts = describe_sidecar(str(path), meta, "TensorRT is not installed")
    assert "model" not in facts and facts["made_by"].startswith("vitfast")


def test_vitfast_onnx_takes_no_overrides_and_other_graphs_no_image_size_range(rec, gpu, onnx_file, tmp_path):
    with pytest.raises(InputError, match="is vitfast's export: its sidecar records the config and preprocessing; drop --mean"):
        trt_export.build_engine(onnx_file, tmp_path / "a.engine", overrides={"mean": (0.5,) * 3}, progress=False)
    with pytest.raises(InputError, match="--image-sizes sets the range of a vitfast --dynamic-img-size export"):
        trt_export.build_engine(bare(onnx_file, tmp_path), tmp_path / "b.engine", overrides=IMAGENET, image_sizes="16:32:64", progress=False)


def test_parity_against_the_graph_is_recorded_or_said_to_be_missing(rec, gpu, onnx_file, tmp_path, monkeypatch):
    """The engine is run by a stand-in (the fake TensorRT runs nothing): the graph itself, through ONNX Runtime."""
    theirs = bare(onnx_file, tmp_path)
    path = trt_export.build_engine(theirs, tmp_path / "m.engine", overrides=IMAGENET, progress=False)
    real = vitfast.load_engine
    monkeypatch.setattr(pipeline, "load_engine", lambda p, **kw: real(theirs, overrides=IMAGENET) if p == path else real(p, **kw))
    parity = pipeline.record_engine_parity_vs_onnx(path, theirs, IMAGENET)
    assert parity["passed"] and parity["max_abs_err"] == 0 and parity["against"] == "onnxruntime"
    assert read_sidecar(path)["parity"] == parity
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not onnx")
    with pytest.warns(VitfastWarning, match="parity not measured: ONNX Runtime cannot run .*broken.onnx"):
        assert pipeline.record_engine_parity_vs_onnx(path, broken, IMAGENET) is None


def test_export_onnx_flag_builds_from_a_graph_and_refuses_what_does_not_apply(rec, gpu, onnx_file, tmp_path, monkeypatch, capsys):
    theirs = bare(onnx_file, tmp_path)
    measured = []
    monkeypatch.setattr(pipeline, "record_engine_parity_vs_onnx", lambda *a: measured.append(a))
    out = tmp_path / "m.engine"
    flags = ["--mean", "0.5", "0.5", "0.5", "--std", "0.5", "0.5", "0.5"]
    assert main(["export", "--onnx", str(theirs), "--format", "trt", "--precision", "fp16", "--out", str(out), *flags, "--quiet"]) == 0
    assert read_sidecar(out)["foreign"] and measured[0][:2] == (out, theirs) and measured[0][2]["mean"] == (0.5,) * 3
    refusals = {
        ("--format", "onnx"): "--onnx builds a TensorRT engine from an existing graph: add --format trt",
        ("--format", "trt", "--out", str(tmp_path / "m.onnx")): "does not fit --format trt: name an ONNX export .onnx and a TensorRT engine .engine / .plan / .trt",
        ("--format", "trt", "--calib-dir", str(tmp_path)): "--calib-dir set vitfast's own ONNX export and int8 calibration",
        ("--format", "trt", "--num-heads", "3"): "--num-heads describe a checkpoint's architecture, which the graph",
    }
    for extra, said in refusals.items():
        assert main(["export", "--onnx", str(theirs), "--out", str(tmp_path / "x.engine"), *extra, *flags]) == 2
        assert said in capsys.readouterr().err
    assert main(["export", "--model", "vit_cifar_patch4_32", "--format", "trt", "--precision", "fp8", "--out", str(tmp_path / "y.engine")]) == 2
    assert "--precision fp8 builds a TensorRT engine from an fp8 Q/DQ graph" in capsys.readouterr().err


def test_export_onnx_without_tensorrt_gives_the_trtexec_line(onnx_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    theirs = bare(onnx_file, tmp_path)
    assert main(["export", "--onnx", str(theirs), "--format", "trt", "--precision", "fp16", "--out", str(tmp_path / "m.engine"),
                 "--mean", "0.5", "0.5", "0.5", "--std", "0.5", "0.5", "0.5"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "TensorRT is not installed" in err and f"trtexec --onnx={theirs}" in err and "--minShapes=images:1x3x32x32" in err
    assert "--layerPrecisions=" in err and not (tmp_path / "m.engine").exists()
