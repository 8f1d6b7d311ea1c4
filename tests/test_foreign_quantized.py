"""What Optimum and the Hub make after the export: `optimum-cli onnxruntime quantize` (dynamic int8: ConvInteger /
MatMulInteger, written as `model_quantized.onnx`), ONNX Runtime's static QOperator form (QLinearConv), ORTOptimizer's
fused `model_optimized.onnx`, and the Hub's transformers.js layout (config files at the top, graphs in `onnx/`).
Optimum is not installed (its 1.x pins transformers 4): each file is made here with the ONNX Runtime call and
arguments Optimum's source passes. Reference: the transformers model in PyTorch fp32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", reason="foreign-ONNX tests need onnx (pip install 'vitfast[onnx]')")
pytest.importorskip("onnxruntime", reason="foreign-ONNX tests need onnxruntime (pip install 'vitfast[onnx]')")
transformers = pytest.importorskip("transformers", reason="the foreign graphs are exported from transformers' ViT")

import vitfast  # noqa: E402
from vitfast.errors import ArtifactError  # noqa: E402

from test_foreign_onnx import IMG, MEAN, OPTIMUM_V1_INPUT, STD, Output, export, hf_model, run  # noqa: E402

LABELS = tuple(f"kind{i}" for i in range(10))


def save_optimum_files(model, folder: Path) -> None:
    model.config.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": IMG, "width": IMG}, image_mean=list(MEAN), image_std=list(STD),
                                   resample=3).save_pretrained(folder)  # fmt: skip


def quantize_like_optimum_cli(src: Path, dst: Path) -> Path:
    """`optimum-cli onnxruntime quantize --avx512_vnni`: ORTQuantizer.quantize with AutoQuantizationConfig.avx512_vnni(
    is_static=False): ONNX Runtime's ONNXQuantizer, IntegerOps, s8 weights, u8 activations, every IntegerOps operator."""
    from onnxruntime.quantization import QuantizationMode, QuantType
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    quantizer = ONNXQuantizer(onnx.load(str(src)), False, False, QuantizationMode.IntegerOps, False, QuantType.QInt8, QuantType.QUInt8,
                              None, [], [], list(IntegerOpsRegistry),
                              {"WeightSymmetric": True, "ActivationSymmetric": False, "EnableSubgraph": False, "ForceSymmetric": False})  # fmt: skip
    quantizer.quantize_model()
    quantizer.model.save_model_to_file(str(dst))
    return dst


def quantize_static_qoperator(src: Path, dst: Path) -> Path:
    """ONNX Runtime's static quantization in the QOperator format (AutoQuantizationConfig(is_static=True, format=QOperator)):
    QLinearConv / QLinearMatMul, calibrated on random images."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Images(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.batches = iter([{"pixel_values": rng.standard_normal((1, 3, IMG, IMG), dtype=np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(src), str(dst), Images(), quant_format=QuantFormat.QOperator, op_types_to_quantize=["Conv", "MatMul"])
    return dst


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """{name: path} of what Optimum and the Hub hold for one random transformers ViT classifier, plus the model."""
    root = tmp_path_factory.mktemp("after_export")
    model = hf_model()
    model.config.id2label = dict(enumerate(LABELS))
    model.config.label2id = {name: i for i, name in enumerate(LABELS)}
    fp32 = root / "fp32"
    fp32.mkdir()
    export(Output(model, "logits"), fp32 / "model.onnx", shape=(2, 3, IMG, IMG), outputs=("logits",),
           dynamic={"pixel_values": OPTIMUM_V1_INPUT, "logits": {0: "batch_size"}})  # fmt: skip
    save_optimum_files(model, fp32)
    out = {"model": model, "fp32": fp32, "hf_dir": root / "hf"}
    model.save_pretrained(out["hf_dir"])
    for name in ("int8", "qop", "optimized"):
        (root / name).mkdir()
        save_optimum_files(model, root / name)
    quantize_like_optimum_cli(fp32 / "model.onnx", root / "int8" / "model_quantized.onnx")
    (root / "int8" / "ort_config.json").write_text(json.dumps({"quantization": {"is_static": False}}))
    out["int8"] = root / "int8"
    out["qop"] = quantize_static_qoperator(fp32 / "model.onnx", root / "qop" / "model_quantized.onnx")
    from onnxruntime.transformers.optimizer import optimize_model  # what ORTOptimizer runs, model_type from config.json

    optimize_model(str(fp32 / "model.onnx"), model_type="vit", num_heads=4, hidden_size=64).save_model_to_file(
        str(root / "optimized" / "model_optimized.onnx"))
    out["optimized"] = root / "optimized"
    hub = root / "hub"  # transformers.js: config files at the top, every variant in onnx/
    (hub / "onnx").mkdir(parents=True)
    save_optimum_files(model, hub)
    shutil.copy(fp32 / "model.onnx", hub / "onnx" / "model.onnx")
    shutil.copy(root / "int8" / "model_quantized.onnx", hub / "onnx" / "model_quantized.onnx")
    out["hub"] = hub
    return out


def hf_logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(pixel_values=x).logits


def ops(path: Path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def test_optimum_cli_dynamic_int8_folder_runs_with_its_labels(made):
    graph = made["int8"] / "model_quantized.onnx"
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"} <= ops(graph) and "Conv" not in ops(graph)
    engine = vitfast.load_engine(made["int8"])  # a folder without model.onnx: its one graph
    assert engine.path == graph and engine.picked is None
    # the channel axis is dynamic: channels, layout and patch come from the ConvInteger's int8 weight
    assert (engine.io.layout, engine.io.in_chans, engine.io.patch, engine.precision) == ("NCHW", 3, 8, "int8")
    assert engine.config.labels == LABELS and engine.metadata["config_files"][0].endswith("config.json")
    x = torch.randn(4, 3, IMG, IMG)
    ref, got = hf_logits(made["model"], x), engine(x)
    assert torch.nn.functional.cosine_similarity(got, ref).min() > 0.99
    assert 1e-5 < (got - ref).abs().max() / ref.abs().max() < 0.1  # int8 arithmetic ran, and stayed close


def test_static_qoperator_graph_is_read_through_its_qlinearconv(made):
    assert "QLinearConv" in ops(made["qop"]) and "Conv" not in ops(made["qop"])
    engine = vitfast.load_engine(made["qop"])
    assert (engine.io.in_chans, engine.io.patch, engine.precision) == (3, 8, "int8")
    # model_quantized.onnx beside Optimum's files takes their preprocessing: raw images run
    assert engine.config.mean == pytest.approx(MEAN) and engine.missing_preprocessing is None
    images = np.random.default_rng(1).integers(0, 256, size=(2, IMG, IMG, 3), dtype=np.uint8)
    ref = hf_logits(made["model"], vitfast.preprocess(images, engine.config))
    assert torch.nn.functional.cosine_similarity(engine(images), ref).min() > 0.98


def test_ort_optimizer_fused_graph_equals_transformers(made):
    graph = made["optimized"] / "model_optimized.onnx"
    fused = {n.op_type for n in onnx.load(str(graph)).graph.node if n.domain == "com.microsoft"}
    assert fused, "ONNX Runtime's optimizer fused nothing: the test would not cover a fused graph"
    engine = vitfast.load_engine(made["optimized"])
    assert engine.path == graph and engine.config.labels == LABELS and engine.precision == "fp32"
    x = torch.randn(3, 3, IMG, IMG)
    ref = hf_logits(made["model"], x)
    assert ((engine(x) - ref).abs().max() / ref.abs().max()).item() <= 1e-4


def test_hub_layout_runs_model_onnx_and_says_what_else_is_there(made):
    engine = vitfast.load_engine(made["hub"])
    assert engine.path == made["hub"] / "onnx" / "model.onnx" and engine.precision == "fp32"
    assert "running onnx/model.onnx, not model_quantized.onnx" in engine.picked
    assert engine.config.labels == LABELS  # from the config.json above onnx/
    quantized = vitfast.load_engine(made["hub"] / "onnx" / "model_quantized.onnx")
    assert quantized.precision == "int8" and quantized.config.labels == LABELS and quantized.missing_preprocessing is None


def test_cli_check_and_eval_of_a_quantized_hub_graph(made, tmp_path):
    graph = made["hub"] / "onnx" / "model_quantized.onnx"
    done = run("check", graph, "--checkpoint", made["hf_dir"], "--config", made["fp32"] / "preprocessor_config.json", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["precision"] == "int8" and result["passed"] and result["cosine"] > 0.99
    assert f"from {made['hub'] / 'config.json'}" in done.stderr and "Traceback" not in done.stderr
    from PIL import Image

    for i, cls in enumerate(LABELS[:2]):
        (tmp_path / cls).mkdir()
        Image.fromarray(np.full((IMG, IMG, 3), 40 * i, dtype=np.uint8)).save(tmp_path / cls / "0.png")
    folder = run("eval", made["hub"], "--data", tmp_path, "--json")
    assert folder.returncode == 0, folder.stderr
    assert json.loads(folder.stdout)["n"] == 2 and "holds 2 ONNX graphs; running onnx/model.onnx" in folder.stderr


def test_folder_rules(made, tmp_path):
    several = tmp_path / "several"
    several.mkdir()
    for name in ("model_quantized.onnx", "model_optimized.onnx"):
        shutil.copy(made["fp32"] / "model.onnx", several / name)
    with pytest.raises(ArtifactError, match="holds 2 ONNX graphs and none is model.onnx .*pass the one to run"):
        vitfast.load_engine(several)
    # a checkpoint folder that also carries an onnx/ export stays a checkpoint
    both = tmp_path / "both"
    shutil.copytree(made["hf_dir"], both)
    shutil.copytree(made["hub"] / "onnx", both / "onnx")
    shutil.copy(made["fp32"] / "preprocessor_config.json", both)
    assert vitfast.load_engine(both).kind == "pytorch"
    # only Optimum's and transformers.js's names take the folder's files: another graph beside them says nothing
    shutil.copy(made["fp32"] / "model.onnx", made["fp32"] / "mine.onnx")
    try:
        assert vitfast.load_engine(made["fp32"] / "mine.onnx", overrides={"img_size": IMG}).missing_preprocessing
    finally:
        (made["fp32"] / "mine.onnx").unlink()


def make_low_bit_variants(src: Path, folder: Path) -> dict[str, Path]:
    """The Hub's 4-bit files as transformers.js's scripts/quantize.py makes them (q4: MatMulNBits, block 32, symmetric;
    q4f16: that, then float16 with float32 inputs and outputs; bnb4: MatMulBnb4, NF4, block 64), ONNX Runtime's int4
    weight Q/DQ (DequantizeLinear-21, blockwise) and its fp8 Q/DQ (weights and activations float8e4m3)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.matmul_bnb4_quantizer import MatMulBnb4Quantizer
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    from onnxruntime.transformers.float16 import convert_float_to_float16

    def nbits(**config):
        quantizer = MatMulNBitsQuantizer(onnx.load(str(src)), algo_config=DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, **config))
        quantizer.process()
        return quantizer.model.model

    bnb4 = MatMulBnb4Quantizer(onnx.load(str(src)), quant_type=MatMulBnb4Quantizer.NF4, block_size=64)
    bnb4.process()
    graphs = {"q4": nbits(), "q4f16": convert_float_to_float16(nbits(), keep_io_types=True), "bnb4": bnb4.model.model,
              "int4_qdq": nbits(quant_format=QuantFormat.QDQ, op_types_to_quantize=("MatMul",))}  # fmt: skip
    paths = {name: folder / f"model_{name}.onnx" for name in (*graphs, "fp8")}
    for name, graph in graphs.items():
        onnx.save(graph, str(paths[name]))

    class Images:
        def __init__(self):
            self.batches = iter([{"pixel_values": np.random.default_rng(i).standard_normal((2, 3, IMG, IMG), dtype=np.float32)} for i in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(src), str(paths["fp8"]), Images(), quant_format=QuantFormat.QDQ, weight_type=QuantType.QFLOAT8E4M3FN,
                    activation_type=QuantType.QFLOAT8E4M3FN, op_types_to_quantize=["MatMul"], calibrate_method=CalibrationMethod.Distribution)  # fmt: skip
    return paths


@pytest.fixture(scope="module")
def low_bit(made):
    return make_low_bit_variants(made["hub"] / "onnx" / "model.onnx", made["hub"] / "onnx")


def test_four_bit_hub_graphs_are_int4_and_checked_at_its_limits(made, low_bit):
    """Each 4-bit form reads as int4 (before: fp32, so `check` failed them at fp32 limits), runs close to transformers
    while really quantized, and `check` passes it at int4's limits; ONNX Runtime's fp8 Q/DQ reads as fp8, not int8."""
    x = torch.randn(4, 3, IMG, IMG)
    ref = hf_logits(made["model"], x)
    expected_ops = {"q4": "MatMulNBits", "q4f16": "MatMulNBits", "bnb4": "MatMulBnb4", "int4_qdq": "DequantizeLinear"}
    for name, op in expected_ops.items():
        assert op in ops(low_bit[name]), name
        engine = vitfast.load_engine(low_bit[name])
        assert engine.precision == "int4" and engine.config.labels == LABELS, name
        got = engine(x)
        assert torch.nn.functional.cosine_similarity(got, ref).min() > 0.95, name
        assert 1e-5 < (got - ref).abs().max() / ref.abs().max() < 0.3, name  # 4-bit weights ran, and stayed close
    assert vitfast.load_engine(low_bit["fp8"]).precision == "fp8"

    done = run("check", low_bit["q4"], "--checkpoint", made["hf_dir"], "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["precision"] == "int4" and result["passed"] and result["tolerance"]["cosine"] == 0.95, result
