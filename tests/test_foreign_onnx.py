"""Artifacts vitfast did not make (issue 12 part B): ONNX files from a plain `torch.onnx.export`
of a transformers ViT (NCHW/NHWC, dynamic/static batch, fp16 input, extra outputs), an Optimum
export folder, `check A --against B` with `--atol/--rtol` and `--mark-all`, and `bench --artifact`.
Reference: the transformers model itself, run in PyTorch fp32 on the same inputs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", reason="foreign-ONNX tests need onnx (pip install 'vitfast[onnx]')")
pytest.importorskip("onnxruntime", reason="foreign-ONNX tests need onnxruntime (pip install 'vitfast[onnx]')")
transformers = pytest.importorskip("transformers", reason="the foreign graphs are exported from transformers' ViT")

import vitfast  # noqa: E402
import vitfast.data  # noqa: E402
import vitfast.parity  # noqa: E402
from vitfast.errors import ArtifactError, InputError  # noqa: E402

VITFAST = Path(sys.executable).parent / "vitfast"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMG = 32


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(VITFAST), *map(str, args)], capture_output=True, text=True, timeout=600)


def hf_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.ViTConfig(image_size=IMG, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=128, num_labels=10)  # fmt: skip
    return transformers.ViTForImageClassification(cfg).eval()


class Graph(torch.nn.Module):
    """How other tools' exports look: optional NHWC input, optional fp16, logits with extra outputs."""

    def __init__(self, model, nhwc=False, half=False, extra=True):
        super().__init__()
        self.model, self.nhwc, self.extra = (model.half() if half else model), nhwc, extra

    def forward(self, pixel_values):
        x = pixel_values.permute(0, 3, 1, 2) if self.nhwc else pixel_values
        out = self.model(pixel_values=x, output_hidden_states=True)
        return (out.hidden_states[-1], out.logits) if self.extra else out.logits


def export(module, path: Path, *, shape, dtype=torch.float32, outputs=("last_hidden_state", "logits"), dynamic=None) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(module, (torch.randn(*shape).to(dtype),), str(path), input_names=["pixel_values"], output_names=list(outputs),
                          dynamic_axes=dynamic, dynamo=False, opset_version=17)  # fmt: skip
    return path


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """{kind: path} of foreign graphs of one random transformers ViT, plus the model itself."""
    root = tmp_path_factory.mktemp("foreign")
    model = hf_model()
    batch = {"pixel_values": {0: "batch"}}
    out = {"model": model}
    # Optimum's output order puts last_hidden_state first: the logits must be picked by name
    out["plain"] = export(Graph(model), root / "plain.onnx", shape=(2, 3, IMG, IMG), dynamic=batch)
    out["nhwc"] = export(Graph(model, nhwc=True, extra=False), root / "nhwc.onnx", shape=(2, IMG, IMG, 3), outputs=("output",))
    out["dynamic_hw"] = export(Graph(model), root / "dyn.onnx", shape=(2, 3, IMG, IMG),
                               dynamic={"pixel_values": {0: "batch", 2: "height", 3: "width"}})  # fmt: skip
    import copy

    out["fp16"] = export(Graph(copy.deepcopy(model), half=True, extra=False), root / "fp16.onnx", shape=(2, 3, IMG, IMG),
                         dtype=torch.float16, outputs=("logits",), dynamic=batch)  # fmt: skip
    out["fp16_unloadable"] = unloadable(out["fp16"])
    optimum = root / "optimum"
    optimum.mkdir()
    export(Graph(model), optimum / "model.onnx", shape=(2, 3, IMG, IMG), dynamic=batch)
    model.config.save_pretrained(optimum)
    transformers.ViTImageProcessor(size={"height": IMG, "width": IMG}, image_mean=list(MEAN), image_std=list(STD),
                                   resample=3).save_pretrained(optimum)  # fmt: skip
    out["optimum"] = optimum
    hf_dir = root / "hf"
    model.save_pretrained(hf_dir)
    out["hf_dir"] = hf_dir
    return out


def unloadable(path: Path) -> str | None:
    """Why ONNX Runtime refuses a graph this test exported, or None. transformers 5.17's half-precision
    ViT exports a LayerNormalization with fp32 and fp16 inputs, which no runtime loads (5.23's does not)."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any refusal means the fixture, not vitfast, is at fault
        return f"transformers {transformers.__version__} exported an fp16 graph ONNX Runtime cannot load: {str(exc).splitlines()[0][-160:]}"
    return None


def fp16_graph(foreign) -> Path:
    if foreign["fp16_unloadable"]:
        pytest.skip(foreign["fp16_unloadable"])
    return foreign["fp16"]


def hf_logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.float()(pixel_values=x).logits


# ---------------------------------------------------------------------------- item 4: load_engine
@pytest.mark.parametrize("kind", ["plain", "nhwc", "dynamic_hw", "fp16", "optimum"])
def test_foreign_graph_matches_transformers_on_float_images(foreign, kind):
    overrides = {"img_size": IMG} if kind == "dynamic_hw" else None
    engine = vitfast.load_engine(fp16_graph(foreign) if kind == "fp16" else foreign[kind], overrides=overrides)
    n = 2 if kind == "nhwc" else 3  # the NHWC graph was exported with a fixed batch of 2
    x = torch.randn(n, 3, IMG, IMG)
    ref = hf_logits(foreign["model"], x)
    got = engine(x)
    limit = 2e-2 if kind == "fp16" else 1e-4
    assert got.shape == (n, 10)
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= limit
    assert engine.precision == ("fp16" if kind == "fp16" else "fp32")
    assert engine.io.output_name in ("logits", "output")


def test_graph_io_is_read_from_the_graph(foreign):
    nhwc = vitfast.load_engine(foreign["nhwc"])
    assert (nhwc.io.layout, nhwc.io.batch, nhwc.batch) == ("NHWC", 2, (2, 2, 2))
    plain = vitfast.load_engine(foreign["plain"])
    assert (plain.io.layout, plain.io.batch, plain.io.input_name) == ("NCHW", None, "pixel_values")
    assert "logits" in plain.io.note and "last_hidden_state" in plain.io.note  # says what was chosen among what
    with pytest.raises(InputError, match="batch size 3 is outside"):
        nhwc(torch.randn(3, 3, IMG, IMG))


def test_fp16_graph_io_is_read_from_the_graph(foreign):
    assert vitfast.load_engine(fp16_graph(foreign)).io.dtype == "float16"


def test_raw_images_need_preprocessing_and_use_the_given_one(foreign):
    engine = vitfast.load_engine(foreign["plain"])
    pixels = torch.randint(0, 256, (2, 40, 48, 3), dtype=torch.uint8)
    with pytest.raises(InputError, match="--mean"):
        engine(pixels)
    engine = vitfast.load_engine(foreign["plain"], overrides={"mean": MEAN, "std": STD, "interpolation": "bilinear"})
    config = vitfast.ViTConfig(img_size=IMG, patch_size=8, mean=MEAN, std=STD, interpolation="bilinear")
    ref = hf_logits(foreign["model"], vitfast.preprocess(pixels, config))
    assert torch.allclose(engine(pixels), ref, atol=1e-4)


def test_dynamic_image_size_without_img_size_is_a_clear_error(foreign):
    with pytest.raises(vitfast.VitfastError, match="--img-size"):
        vitfast.load_engine(foreign["dynamic_hw"])


def test_optimum_folder_is_one_artifact_with_its_processor(foreign):
    engine = vitfast.load_engine(foreign["optimum"])
    assert engine.path.name == "model.onnx" and engine.missing_preprocessing is None
    assert engine.config.mean == MEAN and engine.config.std == STD and engine.config.img_hw == (IMG, IMG)
    images = np.random.default_rng(0).integers(0, 256, (3, 40, 56, 3), dtype=np.uint8)  # non-square: squashed, as HF does
    processor = transformers.ViTImageProcessor.from_pretrained(foreign["optimum"])
    x = processor(images=list(images), return_tensors="pt")["pixel_values"]
    assert torch.allclose(engine(images), hf_logits(foreign["model"], x), atol=1e-4)
    assert engine.metadata["warnings"] == []  # nothing in its processor had to be guessed


def test_an_optimum_folders_guesses_are_warnings(foreign, tmp_path, capsys):
    """A processor setting vitfast cannot follow (LANCZOS resampling) is said for a foreign graph as for a checkpoint,
    and recorded in an engine's sidecar; --interpolation settles it."""
    import shutil

    folder = shutil.copytree(foreign["optimum"], tmp_path / "lanczos")
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps(processor | {"resample": 1}))  # PIL's LANCZOS
    said = vitfast.load_engine(folder).metadata["warnings"]
    assert len(said) == 1 and said[0].startswith("interpolation: preprocessor_config.json: ")
    assert vitfast.load_engine(folder, overrides={"interpolation": "bicubic"}).metadata["warnings"] == []
    from vitfast.export.engine_source import engine_source

    assert list(engine_source(folder / "model.onnx", None, None).meta["source"]["guessed"]) == ["interpolation"]


def test_graph_with_unclear_logits_is_refused(tmp_path):
    class TwoHeads(torch.nn.Module):
        def forward(self, pixel_values):
            flat = pixel_values.flatten(1)
            return flat[:, :5], flat[:, 5:9]

    path = export(TwoHeads(), tmp_path / "two.onnx", shape=(1, 3, 8, 8), outputs=("a", "b"))
    with pytest.raises(ArtifactError, match="cannot tell which output holds the logits"):
        vitfast.load_engine(path)


# ---------------------------------------------------------------------------- what optimum-cli writes
OPTIMUM_V1_INPUT = {0: "batch_size", 1: "num_channels", 2: "height", 3: "width"}  # optimum 1.x's ViTOnnxConfig: even C dynamic


class Output(torch.nn.Module):
    """One named output of a transformers model, as Optimum's patcher keeps only its task's outputs."""

    def __init__(self, model, *names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        return tuple(getattr(out, name) for name in self.names)


def optimum_folder(root: Path, model, names: tuple[str, ...], output_axes: dict) -> Path:
    """An `optimum-cli export onnx` folder: model.onnx (opset 14, Optimum 1.x's dynamic axes), config.json, preprocessor."""
    root.mkdir()
    export(Output(model, *names), root / "model.onnx", shape=(2, 3, IMG, IMG), outputs=names,
           dynamic={"pixel_values": OPTIMUM_V1_INPUT, **output_axes})  # fmt: skip
    model.config.save_pretrained(root)
    transformers.ViTImageProcessor(size={"height": IMG, "width": IMG}, image_mean=list(MEAN), image_std=list(STD),
                                   resample=3).save_pretrained(root)  # fmt: skip
    return root


@pytest.fixture(scope="module")
def optimum(foreign, tmp_path_factory):
    """Optimum 1.x exports of the foreign fixture's weights: image-classification (with class names) and
    feature-extraction (a ViTModel: last_hidden_state alone), and a CLIP-style graph with a pooled output beside it."""
    import copy

    root = tmp_path_factory.mktemp("optimum")
    classifier = copy.deepcopy(foreign["model"])
    classifier.config.id2label = {i: f"kind{i}" for i in range(10)}
    classifier.config.label2id = {f"kind{i}": i for i in range(10)}
    classifier.config.problem_type = "multi_label_classification"
    backbone = transformers.ViTModel.from_pretrained(foreign["hf_dir"]).eval()  # the same encoder, pooler freshly made
    return {
        "classifier": optimum_folder(root / "cls", classifier, ("logits",), {"logits": {0: "batch_size"}}),
        "features": optimum_folder(root / "fe", backbone, ("last_hidden_state",),
                                   {"last_hidden_state": {0: "batch_size", 1: "sequence_length"}}),  # fmt: skip
        "pooled": export(Output(backbone, "last_hidden_state", "pooler_output"), root / "pooled.onnx", shape=(2, 3, IMG, IMG),
                         outputs=("last_hidden_state", "pooler_output"), dynamic={"pixel_values": {0: "batch"}}),  # fmt: skip
        "backbone": backbone,
    }


def test_optimum_v1_classifier_with_a_dynamic_channel_axis_runs(foreign, optimum):
    engine = vitfast.load_engine(optimum["classifier"])
    assert (engine.io.layout, engine.io.in_chans, engine.io.patch) == ("NCHW", 3, 8)  # read off the patch Conv's weight
    assert engine.config.num_classes == 10 and engine.config.labels == tuple(f"kind{i}" for i in range(10))  # id2label
    assert engine.config.problem_type == "multi_label_classification"  # so predict and serve score it with sigmoids
    x = torch.randn(3, 3, IMG, IMG)
    ref = hf_logits(foreign["model"], x)
    assert ((engine(x) - ref).abs().max() / ref.abs().max()).item() <= 1e-4


def test_optimum_feature_extraction_runs_as_every_token(optimum):
    engine = vitfast.load_engine(optimum["features"])
    assert engine.io.output == "tokens" and "every token from output 'last_hidden_state'" in engine.io.describe()
    # the graph leaves tokens and width dynamic: measured by one run, described as 16 patches + a class token
    assert engine.config.output_shape == (17, 64) and engine.config.num_classes == 0 and not engine.config.classifies
    x = torch.randn(3, 3, IMG, IMG)
    with torch.no_grad():
        ref = optimum["backbone"](pixel_values=x).last_hidden_state
    assert torch.allclose(engine(x), ref, atol=1e-4)


def test_pooled_output_is_taken_as_features_not_classes(optimum, tmp_path):
    engine = vitfast.load_engine(optimum["pooled"], overrides={"mean": MEAN, "std": STD})
    assert (engine.io.output, engine.io.output_name) == ("features", "pooler_output")
    assert engine.config.output_shape == (64,) and engine.config.num_classes == 0 and not engine.config.classifies
    x = torch.randn(2, 3, IMG, IMG)
    with torch.no_grad():
        assert torch.allclose(engine(x), optimum["backbone"](pixel_values=x).pooler_output, atol=1e-5)
    data = tmp_path / "data"
    (data / "a").mkdir(parents=True)
    from PIL import Image

    Image.fromarray(np.zeros((IMG, IMG, 3), dtype=np.uint8)).save(data / "a" / "0.png")
    refused = run("eval", optimum["pooled"], "--data", data, "--mean", *map(str, MEAN), "--std", *map(str, STD))
    assert refused.returncode == 2 and "no classifier head" in refused.stderr and "Traceback" not in refused.stderr


def test_output_names_the_output_to_run(foreign, optimum, tmp_path):
    """A graph returning pooled features and every token runs the pooled ones unless --output names the tokens."""
    tokens = vitfast.load_engine(optimum["pooled"], output="last_hidden_state", overrides={"mean": MEAN, "std": STD})
    assert (tokens.io.output, tokens.io.output_name, tokens.config.output_shape) == ("tokens", "last_hidden_state", (17, 64))
    x = torch.randn(2, 3, IMG, IMG)
    with torch.no_grad():
        assert torch.allclose(tokens(x), optimum["backbone"](pixel_values=x).last_hidden_state, atol=1e-4)
    with pytest.raises(ArtifactError, match=r"has no output 'hidden' \(it has last_hidden_state .*pooler_output"):
        vitfast.load_engine(optimum["pooled"], output="hidden")
    ours, processor = tmp_path / "tokens.onnx", optimum["features"] / "preprocessor_config.json"  # one preprocessing for both
    done = run("export", "--checkpoint", foreign["hf_dir"], "--num-classes", "0", "--global-pool", "none", "--format", "onnx",
               "--out", ours, "--config", processor)  # fmt: skip
    assert done.returncode == 0, done.stderr
    same = run("check", optimum["pooled"], "--output", "last_hidden_state", "--against", ours, "--config", processor, "--json")
    assert same.returncode == 0 and json.loads(same.stdout)["max_abs_err"] < 1e-4, same.stderr
    assert "every token from output 'last_hidden_state' (chosen)" in same.stderr
    refused = run("check", foreign["hf_dir"], "--output", "last_hidden_state")
    assert refused.returncode == 2 and "picks one of an ONNX graph's or TensorRT engine's outputs" in refused.stderr and "Traceback" not in refused.stderr


def test_a_clip_image_embedding_is_said_to_be_one():
    from vitfast.foreign import pick_output

    outputs = [("image_embeds", [None, 512]), ("last_hidden_state", [None, 50, 768])]
    name, _, kind, note = pick_output(outputs, "clip.onnx")
    assert (name, kind) == ("image_embeds", "features") and note.startswith("the image embedding from output 'image_embeds'")
    assert pick_output([("pooler_output", [None, 768])], "m.onnx")[3].startswith("pooled features")
    assert pick_output(outputs, "clip.onnx", wanted="image_embeds")[3].startswith("the image embedding from output")


def test_classes_left_dynamic_are_measured(foreign, tmp_path):
    path = export(Output(foreign["model"], "logits"), tmp_path / "old.onnx", shape=(2, 3, IMG, IMG), outputs=("logits",),
                  dynamic={"pixel_values": OPTIMUM_V1_INPUT, "logits": {0: "batch", 1: "sequence"}})  # transformers.onnx's axes
    engine = vitfast.load_engine(path, overrides={"img_size": IMG})
    assert engine.io.output_dims == (None,) and engine.config.num_classes == 10  # not ViTConfig's default 1000


def test_check_optimum_features_against_vitfast_tokens_and_its_checkpoint(foreign, optimum, tmp_path):
    ours = tmp_path / "tokens.onnx"
    done = run("export", "--checkpoint", foreign["hf_dir"], "--num-classes", "0", "--global-pool", "none", "--format", "onnx",
               "--out", ours, "--config", optimum["features"] / "preprocessor_config.json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    same = run("check", optimum["features"], "--against", ours, "--json")
    assert same.returncode == 0, same.stderr
    result = json.loads(same.stdout)
    assert result["passed"] and result["max_abs_err"] < 1e-4
    reference = run("check", optimum["features"], "--checkpoint", foreign["hf_dir"], "--num-classes", "0", "--global-pool", "none",
                    "--json", "--config", optimum["features"] / "preprocessor_config.json")  # fmt: skip
    assert reference.returncode == 0 and json.loads(reference.stdout)["passed"], reference.stderr
    pooled = run("check", optimum["features"], "--checkpoint", foreign["hf_dir"], "--num-classes", "0", "--json")
    assert pooled.returncode == 2 and "output [B, 64] vs [B, 17, 64]" in pooled.stderr  # the reference must return tokens too


def _graph(tmp_path: Path, nodes, inits, out_dims, in_dims=("n", "c", "h", "w")) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_dims))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_dims))],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])  # fmt: skip
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_layout_and_channels_come_from_the_patch_conv_through_transpose_and_int8_weights(tmp_path):
    from onnx import helper

    from vitfast.foreign import read_graph_io

    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
             helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"]),
             helper.make_node("Conv", ["t", "w"], ["c"], kernel_shape=[4, 4], strides=[4, 4]),
             helper.make_node("Flatten", ["c"], ["y"])]  # fmt: skip
    inits = {"wq": np.ones((5, 3, 4, 4), np.int8), "ws": np.array(0.1, np.float32)}
    io = read_graph_io(_graph(tmp_path, nodes, inits, ("n", 80)))
    assert (io.layout, io.in_chans, io.patch, io.output) == ("NHWC", 3, 4, "logits")
    no_patch = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3]), helper.make_node("Flatten", ["c"], ["y"])]
    assert read_graph_io(_graph(tmp_path, no_patch, {"w": np.ones((5, 3, 3, 3), np.float32)}, ("n", 80))).patch is None
    with pytest.raises(ArtifactError, match="cannot tell the channel axis"):  # no Conv: nothing says which axis holds C
        read_graph_io(_graph(tmp_path, [helper.make_node("Flatten", ["x"], ["y"])], {}, ("n", 80)))


def test_token_output_without_a_patch_grid_is_refused(tmp_path):
    from onnx import helper

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),  # a conv stem, not patches
             helper.make_node("Reshape", ["c", "s"], ["r"]), helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1])]  # fmt: skip
    inits = {"w": np.ones((5, 3, 3, 3), np.float32), "s": np.array([0, 5, -1], np.int64)}
    path = _graph(tmp_path, nodes, inits, ("n", None, 5), in_dims=("n", 3, 8, 8))
    with pytest.raises(ArtifactError, match="cannot tell the patch grid of output 'y' \\(64 tokens at 8x8, no patch-embedding Conv"):
        vitfast.load_engine(path)


# ---------------------------------------------------------------------------- item 4: CLI
def test_cli_eval_and_check_of_a_foreign_onnx(foreign, tmp_path):
    data = tmp_path / "data"
    rng = np.random.default_rng(0)
    from PIL import Image

    for c in range(10):  # one folder per model class
        (data / f"class{c}").mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (IMG, IMG, 3), dtype=np.uint8)).save(data / f"class{c}" / f"{i}.png")
    missing = run("eval", foreign["plain"], "--data", data, "--json")
    assert missing.returncode == 2 and "--mean" in missing.stderr and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 3  # what was read, what was assumed, then the one-line error
    assert "timm's defaults assumed (crop_pct 0.9, crop_mode center, interpolation bicubic)" in missing.stderr
    done = run("eval", foreign["plain"], "--data", data, "--json", "--mean", *map(str, MEAN), "--std", *map(str, STD))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    config = vitfast.ViTConfig(img_size=IMG, patch_size=8, mean=MEAN, std=STD)
    files, labels, _ = vitfast.data.labeled_images(data)
    preds = hf_logits(foreign["model"], next(vitfast.data.batches(files, config, len(files)))).argmax(-1)
    assert result["n"] == 20 and result["top1"] == pytest.approx((preds == torch.tensor(labels)).double().mean().item())
    assert "logits from output 'logits'" in done.stderr
    alone = run("check", foreign["plain"], "--mean", "0.5", "0.5", "0.5", "--std", "0.5", "0.5", "0.5")
    assert alone.returncode == 2 and "--against" in alone.stderr
    served = run("serve", foreign["plain"])  # refused before any server starts: the uint8 model needs mean/std
    assert served.returncode == 2 and "--mean" in served.stderr


# ---------------------------------------------------------------------------- item 5: check --against
@pytest.fixture(scope="module")
def vitfast_exports(foreign, tmp_path_factory):
    """vitfast's own fp32 / fp16 / int8 exports of the same weights (read from the HF folder)."""
    from vitfast.export import quantize_int8, to_onnx

    root = tmp_path_factory.mktemp("ours")
    model = vitfast.load_checkpoint(foreign["hf_dir"])
    fp32 = to_onnx(model, root / "ours.onnx")
    fp16 = to_onnx(model, root / "ours.fp16.onnx", precision="fp16")
    int8 = quantize_int8(fp32, root / "ours.int8.onnx", vitfast.data.random_images(model.config, 16, seed=3), samples=16, progress=False)
    return {"fp32": fp32, "fp16": fp16, "int8": int8, "model": model}


def test_check_against_compares_any_two_artifacts(foreign, vitfast_exports):
    pre = ["--config", foreign["optimum"] / "preprocessor_config.json"]  # HF's processor file, for both sides
    same = run("check", vitfast_exports["fp32"], "--against", foreign["plain"], "--json", *pre)
    assert same.returncode == 0, same.stderr
    result = json.loads(same.stdout)
    for key in ("max_abs_err", "max_rel_err", "cosine", "top1_agreement", "passed"):
        assert key in result
    assert result["passed"] and result["max_rel_err"] < 1e-4 and result["against"] == str(foreign["plain"])
    ckpt = run("check", foreign["hf_dir"], "--against", foreign["nhwc"], "--json", "--samples", "2", *pre)
    assert ckpt.returncode == 0 and json.loads(ckpt.stdout)["n"] == 2, ckpt.stderr  # a checkpoint vs a fixed-batch NHWC graph


def test_check_against_a_different_model_fails(foreign, tmp_path):
    other = export(Graph(hf_model(seed=1)), tmp_path / "other.onnx", shape=(2, 3, IMG, IMG), dynamic={"pixel_values": {0: "batch"}})
    pre = ["--mean", "0.5", "0.5", "0.5", "--std", "0.5", "0.5", "0.5"]
    differ = run("check", foreign["plain"], "--against", other, "--json", *pre)
    assert differ.returncode == 1 and not json.loads(differ.stdout)["passed"]


def test_check_fp16_against_fp32_takes_the_looser_tolerance_unless_given(foreign):
    pre = ["--mean", "0.5", "0.5", "0.5", "--std", "0.5", "0.5", "0.5"]
    fp16 = run("check", fp16_graph(foreign), "--against", foreign["plain"], "--json", *pre)
    result = json.loads(fp16.stdout)
    assert fp16.returncode == 0 and result["precision"] == "fp16" and result["tolerance"]["rtol"] == 2e-2  # the looser side's limits
    tight = run("check", fp16_graph(foreign), "--against", foreign["plain"], "--json", "--rtol", "1e-7", "--atol", "1e-7", *pre)
    tol = json.loads(tight.stdout)["tolerance"]
    assert tight.returncode == 1 and tol["rtol"] == 1e-7 and tol["atol"] == 1e-7
    assert tol["limit_abs_err"] == pytest.approx(1e-7 + 1e-7 * result["max_abs_err"] / result["max_rel_err"])


def test_parity_tolerance_defaults_and_overrides():
    ref = torch.tensor([[1.0, -2.0, 4.0]])
    out = ref + torch.tensor([[0.0, 0.0, 0.01]])  # max_abs 0.01, max_rel 0.0025
    assert vitfast.parity.compare(out, ref, "fp16")["passed"]
    assert not vitfast.parity.compare(out, ref, "fp32")["passed"]
    assert vitfast.parity.compare(out, ref, "fp32", atol=0.01)["passed"]
    assert not vitfast.parity.compare(out, ref, "fp16", rtol=1e-3)["passed"]


# ---------------------------------------------------------------------------- item 5: --mark-all
def _break_layer(src: Path, dst: Path) -> str:
    """A copy of src with one MatMul weight in the second block scaled; -> that MatMul's output name."""
    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul" and any(i in inits for i in n.input)]
    node = matmuls[len(matmuls) // 2 + 1]  # past the first block
    weight = inits[next(i for i in node.input if i in inits)]
    array = onnx.numpy_helper.to_array(weight) * 1.5
    weight.CopyFrom(onnx.numpy_helper.from_array(array, weight.name))
    onnx.save(model, str(dst))
    return node.output[0]


def test_mark_all_names_the_first_layer_out_of_tolerance(vitfast_exports, tmp_path):
    broken_at = _break_layer(vitfast_exports["fp32"], tmp_path / "broken.onnx")
    out = run("check", tmp_path / "broken.onnx", "--against", vitfast_exports["fp32"], "--mark-all", "--json",
              "--mean", "0.5", "0.5", "0.5", "--std", "0.5", "0.5", "0.5")  # fmt: skip
    layers = json.loads(out.stdout)["layers"]
    assert layers["first_failing"]["tensor"] == broken_at, out.stderr
    assert layers["compared"] > 20
    healthy = run("check", vitfast_exports["fp16"], "--against", vitfast_exports["fp32"], "--mark-all", "--json")
    report = json.loads(healthy.stdout)
    assert report["passed"] and report["layers"]["compared"] > 20, healthy.stderr
    text = run("check", tmp_path / "broken.onnx", "--against", vitfast_exports["fp32"], "--mark-all",
               "--mean", "0.5", "0.5", "0.5", "--std", "0.5", "0.5", "0.5")  # fmt: skip
    assert f"first out of tolerance: {broken_at}" in text.stdout


def test_mark_all_maps_qdq_names_back(vitfast_exports):
    from vitfast.layerwise import compare_layers, match_tensors

    assert match_tensors(["a_DequantizeLinear_Output", "b_cast0", "c"], {"a", "b", "c"}) == [
        ("a_DequantizeLinear_Output", "a"), ("b_cast0", "b"), ("c", "c")]  # fmt: skip
    int8, fp32 = (vitfast.load_engine(vitfast_exports[p], backend="onnxruntime") for p in ("int8", "fp32"))  # marked outputs: ORT sessions
    x = vitfast.data.random_images(int8.config, 2, seed=5)
    report = compare_layers(int8, fp32, x, "int8")
    tensors = {layer["tensor"] for layer in report["worst"]} | ({report["first_failing"]["tensor"]} if report["first_failing"] else set())
    assert report["compared"] > 20
    assert any(t.endswith("_DequantizeLinear_Output") for t in tensors)  # the quantized activations are the worst ones
    if importlib.util.find_spec("openvino"):  # auto runs this int8 file in OpenVINO: the fix is named
        with pytest.raises(vitfast.InputError, match="backend='onnxruntime'"):
            compare_layers(vitfast.load_engine(vitfast_exports["int8"]), fp32, x, "int8")


def test_mark_all_passes_a_fixed_batch_graph_against_its_dynamic_twin(tmp_path):
    """The exporter numbers its val_N tensors in node order: a fixed batch's graph lacks some shape ops, so the same name
    holds another tensor there (a GELU's Div in one graph, its Erf in the other). Those are not compared."""
    from vitfast.export import to_onnx
    from vitfast.layerwise import MarkedGraph, compare_layers, match_tensors

    torch.manual_seed(0)
    model = vitfast.create_model("vit_tiny_patch16_224", img_size=32, depth=2)
    for p in model.parameters():
        p.data.normal_(0, 0.05)
    dynamic = vitfast.load_engine(to_onnx(model, tmp_path / "dynamic.onnx"))
    fixed = vitfast.load_engine(to_onnx(model, tmp_path / "fixed.onnx", dynamic_batch=False, batch=(1, 1, 1)))
    graph_a, graph_b = MarkedGraph(dynamic), MarkedGraph(fixed)
    renamed = [n for n in graph_a.order if n in graph_b.order and graph_a.order[n].split()[0] != graph_b.order[n].split()[0]]
    assert renamed  # the exporter did reuse names here, or this test proves nothing
    assert not set(renamed) & {a for a, _ in match_tensors(list(graph_a.order), set(graph_b.order), graph_a.order, graph_b.order)}
    report = compare_layers(dynamic, fixed, torch.randn(3, 3, 32, 32), "fp32")
    assert report["first_failing"] is None and report["compared"] > 20


def test_mark_all_takes_equal_infinities_as_equal_and_finds_the_layer_after_them(tmp_path):
    """A hybrid's stem pads with -inf before its max-pool: -inf - -inf is NaN, so the Pad was the first tensor out of
    tolerance even for a graph against itself, hiding the layer that really went wrong."""
    from conftest import randomize
    from vitfast.export import to_onnx
    from vitfast.layerwise import MarkedGraph, TensorError, compare_layers

    cfg = vitfast.get_config("vit_small_r26_s32_224", img_size=64, depth=1, embed_dim=64, num_heads=2, num_classes=5)
    torch.manual_seed(0)
    fp32 = to_onnx(randomize(vitfast.create_model(cfg)).eval(), tmp_path / "hybrid.onnx")
    engine = vitfast.load_engine(fp32, backend="onnxruntime")
    x = vitfast.data.random_images(cfg, 1, seed=5)
    padded = {n: v for n, v in MarkedGraph(engine)(engine.prepare(x)).items() if np.isneginf(v).any()}
    assert padded  # the stem's padding is marked, or this test proves nothing
    assert compare_layers(engine, engine, x, "fp32")["first_failing"] is None
    broken_at = _break_layer(fp32, tmp_path / "broken.onnx")
    report = compare_layers(vitfast.load_engine(tmp_path / "broken.onnx", backend="onnxruntime"), engine, x, "fp32")
    assert report["first_failing"]["tensor"] == broken_at
    # the numbers of the finite values alone; a non-finite value against a finite one (or NaN against NaN) fails
    pad = next(iter(padded.values())).astype(np.float64).ravel()
    err, finite = TensorError(), pad[np.isfinite(pad)]
    err.add(pad, pad + np.where(np.isfinite(pad), 1e-3, 0))
    assert err.max_abs_err == pytest.approx(1e-3) and err.scale == pytest.approx(np.abs(finite + 1e-3).max())
    assert err.cosine == pytest.approx(finite @ (finite + 1e-3) / np.linalg.norm(finite) / np.linalg.norm(finite + 1e-3), abs=1e-12)
    for a, b in (([np.inf, 1.0], [3.0, 1.0]), ([0.0, 1.0], [-np.inf, 1.0]), ([np.nan, 1.0], [np.nan, 1.0])):
        err = TensorError()
        err.add(np.array(a), np.array(b))
        assert err.max_abs_err == np.inf and not err.cosine >= 0.99


def _all_marked_at_once(path: Path, x: torch.Tensor) -> dict[str, np.ndarray]:
    """Every float tensor of the graph at path on the whole batch x in one run, optimisations off: the reference."""
    import onnxruntime as ort

    model = onnx.load(str(path))
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    names = [o for n in model.graph.node for o in n.output if types.get(o) in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]
    model.graph.output.extend(onnx.helper.make_tensor_value_info(n, types[n], None) for n in names)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, (a.astype(np.float64) for a in session.run(names, {session.get_inputs()[0].name: x.numpy()}))))


def test_mark_all_runs_a_few_images_at_a_time_with_the_numbers_of_the_whole_batch(vitfast_exports, tmp_path):
    import tracemalloc

    from vitfast.export import to_onnx
    from vitfast.layerwise import MarkedGraph, compare_layers

    fp16, fp32 = (vitfast.load_engine(vitfast_exports[p], backend="onnxruntime") for p in ("fp16", "fp32"))
    x = vitfast.data.random_images(fp32.config, 3, seed=21)
    report = compare_layers(fp16, fp32, x, "fp16")
    ours, theirs = _all_marked_at_once(fp16.path, x), _all_marked_at_once(fp32.path, x)
    for layer in [*report["worst"], *([report["first_failing"]] if report["first_failing"] else [])]:
        a, b = ours[layer["tensor"]].ravel(), theirs[layer["matched"]].ravel()
        assert layer["max_abs_err"] == pytest.approx(np.abs(a - b).max(), rel=1e-12)
        assert layer["max_rel_err"] == pytest.approx(np.abs(a - b).max() / np.abs(b).max(), rel=1e-12)
        assert layer["cosine"] == pytest.approx(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)), abs=1e-12)
    # numpy's memory (what tracemalloc sees) stays under a few images' tensors: 8 images at once held all their tensors
    # of both graphs, as float64 too.
    one_image = sum(a.nbytes for g in (MarkedGraph(fp16), MarkedGraph(fp32)) for a in g(x[:1]).values())
    many = vitfast.data.random_images(fp32.config, 8, seed=22)
    tracemalloc.start()
    try:
        compare_layers(fp16, fp32, many, "fp16")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * one_image
    # Graphs fixed at batch 2: runs of 2, the last of 3 images filled up with the first one.
    fixed = {p: to_onnx(vitfast_exports["model"], tmp_path / f"fixed.{p}.onnx", precision=p, dynamic_batch=False, batch=(2, 2, 2))
             for p in ("fp16", "fp32")}  # fmt: skip
    out = run("check", fixed["fp16"], "--against", fixed["fp32"], "--mark-all", "--samples", "3", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)["layers"]
    assert report["first_failing"] is None and report["compared"] > 20


def test_mark_all_reads_a_graph_over_2_gib_with_its_weights_beside_it(tmp_path):
    from vitfast.layerwise import MarkedGraph

    # A [23200, 23200] float weight is 2.15 GB, past protobuf's 2 GiB cap, in a sparse external file: zeros but for
    # one value at each end, so reading the weights from the file is what gives the right sum.
    n = 23200
    with open(tmp_path / "w.bin", "wb") as f:
        f.write(np.float32(1.5).tobytes())
        f.seek(n * n * 4 - 4)
        f.write(np.float32(2.25).tobytes())
    weight = onnx.TensorProto(name="W", data_type=onnx.TensorProto.FLOAT, dims=[n, n], data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", "w.bin"), ("offset", "0"), ("length", str(n * n * 4))):
        weight.external_data.add(key=key, value=value)
    nodes = [onnx.helper.make_node("ReduceSum", ["W"], ["total"], keepdims=0), onnx.helper.make_node("Add", ["x", "total"], ["y"]),
             onnx.helper.make_node("Relu", ["y"], ["out"])]  # fmt: skip
    graph = onnx.helper.make_graph(nodes, "big", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                                   [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [1, 4])], [weight])  # fmt: skip
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]), str(tmp_path / "big.onnx"))

    class Engine:  # what MarkedGraph reads of an engine
        path = tmp_path / "big.onnx"

        def feed(self, x):
            return {"x": x.numpy()}

    x = torch.tensor([[-10.0, -1.0, 0.0, 2.0]])
    values = MarkedGraph(Engine())(x)
    assert list(values) == ["total", "y", "out"]
    np.testing.assert_array_equal(values["out"], np.maximum(x.numpy() + 3.75, 0))


def test_mark_all_needs_two_onnx_graphs(foreign, vitfast_exports):
    out = run("check", foreign["hf_dir"], "--against", vitfast_exports["fp32"], "--mark-all", "--mean", "0.5", "0.5", "0.5",
              "--std", "0.5", "0.5", "0.5")  # fmt: skip
    assert out.returncode == 2 and "two ONNX graphs" in out.stderr


# ---------------------------------------------------------------------------- item 6: bench --artifact
def test_bench_measures_user_artifacts(foreign, tmp_path):
    out = run("bench", "--artifact", foreign["plain"], "--artifact", foreign["nhwc"], "--artifact", foreign["optimum"],
              "--batch", "1,2", "--repeats", "2", "--warmup", "0", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {(r["model"], r["batch"]): r for r in json.loads(out.stdout)["rows"]}
    assert rows[("plain.onnx", 2)]["status"] == "ok" and rows[("plain.onnx", 2)]["median_ms"] > 0
    assert rows[("plain.onnx", 2)]["gflops_per_image"] is None  # architecture unknown: no FLOPs invented
    assert rows[("nhwc.onnx", 1)]["status"] == "skipped" and "profile" in rows[("nhwc.onnx", 1)]["reason"]
    assert rows[("nhwc.onnx", 2)]["status"] == "ok"
    assert rows[("optimum", 1)]["status"] == "ok" and rows[("optimum", 1)]["backend"] == "onnxruntime"
    missing = run("bench", "--artifact", tmp_path / "nope.onnx")
    assert missing.returncode == 2 and "nope.onnx" in missing.stderr


def test_bench_int8_rows_calibrate_on_a_real_folder(tmp_path):
    from PIL import Image

    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(4):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(calib / f"{i}.png")
    args = ["bench", "--model", "vit_cifar_patch4_32", "--backends", "onnxruntime", "--precision", "int8", "--batch", "1",
            "--repeats", "2", "--warmup", "0", "--calib-samples", "4", "--work-dir", tmp_path / "work", "--json"]  # fmt: skip
    real = run(*args, "--calib-dir", calib)
    assert real.returncode == 0, real.stderr
    (row,) = json.loads(real.stdout)["rows"]
    assert row["status"] == "ok", row["reason"]
    assert row["details"]["int8"]["calibration"] == str(calib)
    assert f"--calib-dir {calib}" in json.loads(real.stdout)["environment"]["command"]


def test_an_optimum_folders_processor_sets_the_size_not_config_json(tmp_path):
    """DINOv2's config.json says image_size 518 (its position grid), its processor feeds 224x224 crops: the graph gets
    what the processor makes, as transformers' pipeline feeds it."""
    from vitfast.foreign import optimum_folder_fields

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "dinov2", "image_size": 518}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "BitImageProcessor", "do_resize": True, "size": {"shortest_edge": 256}, "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224}, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}))  # fmt: skip
    fields, guessed = optimum_folder_fields(tmp_path)
    assert fields["img_size"] == 224 and fields["crop_mode"] == "center" and fields["crop_pct"] == pytest.approx(224 / 256)
    assert guessed == {}


# ---------------------------------------------------------------------------- what the engine returns and takes
class BakedBatch(torch.nn.Module):
    """A traced export's usual bug: the batch axis is declared dynamic, but a Reshape fixes batch 1 inside."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits.reshape(1, -1)[:, :10]


def test_an_output_with_another_batch_than_the_input_is_an_error(foreign, tmp_path):
    """The graph returns 1 row for 4 images: refused in one line (it was passed on, and predict dropped rows), and at
    batch 1 it runs."""
    path = export(BakedBatch(foreign["model"]), tmp_path / "baked.onnx", shape=(1, 3, IMG, IMG), outputs=("logits",),
                  dynamic={"pixel_values": {0: "batch"}})  # fmt: skip
    engine = vitfast.load_engine(path, overrides={"mean": MEAN, "std": STD})
    with pytest.raises(ArtifactError, match="returned 1 rows for a batch of 4 images.*--batch-size 1"):
        engine(torch.randn(4, 3, IMG, IMG))
    x = torch.randn(1, 3, IMG, IMG)
    assert torch.allclose(engine(x), hf_logits(foreign["model"], x), atol=1e-4)


def test_float_arrays_that_are_views_or_big_endian_run(foreign):
    """OpenCV's BGR -> RGB view ([:, ::-1]), a flipped view and a big-endian array run as their copies do."""
    engine = vitfast.load_engine(foreign["plain"])
    x = np.random.default_rng(0).standard_normal((2, 3, IMG, IMG), dtype=np.float32)
    for view in (x[:, ::-1], x[..., ::-1, :], x.astype(">f4")):
        assert torch.allclose(engine(view), engine(np.ascontiguousarray(view, dtype=np.float32)), atol=1e-6)
        assert torch.allclose(engine(view), hf_logits(foreign["model"], torch.from_numpy(view.astype(np.float32))), atol=1e-4)


def test_device_is_followed_or_refused_for_onnx(foreign):
    plain = foreign["plain"]
    assert vitfast.load_engine(plain, device="cpu").providers == ["CPUExecutionProvider"]
    with pytest.raises(InputError, match="not both"):
        vitfast.load_engine(plain, device="cpu", providers=["CPUExecutionProvider"])
    with pytest.raises(InputError, match="not one ONNX Runtime runs on"):
        vitfast.load_engine(plain, device="mps")
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(InputError, match="no CUDA provider"):
            vitfast.load_engine(plain, device="cuda:0")


def test_num_classes_other_than_the_graphs_is_refused(foreign):
    with pytest.raises(vitfast.errors.ConfigError, match="outputs 10 classes.*not the 3 given"):
        vitfast.load_engine(foreign["plain"], overrides={"num_classes": 3})
    assert vitfast.load_engine(foreign["plain"], overrides={"num_classes": 10}).config.num_classes == 10
