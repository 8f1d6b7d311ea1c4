"""TensorRT engines another tool built (trtexec, polygraphy): no vitfast sidecar, so the input, output and profile are
read from the engine and the preprocessing comes from --config / the flags. Runs against test_tensorrt's fake
`tensorrt` module, whose plan for such an engine is a JSON spec of what the engine reports; running one needs a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import vitfast
from vitfast.cli.main import main
from vitfast.errors import ArtifactError, ConfigError, InputError
from vitfast.export.artifacts import base_metadata, write_sidecar

from test_tensorrt import gpu, rec  # noqa: F401  (fixtures: the fake tensorrt module, a pretend GPU)

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
