"""ONNX export parity, INT8 QDQ structure, the runtime, and the export CLI's error handling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", reason="export tests need onnx (pip install 'vitfast[export]')")
pytest.importorskip("onnxruntime", reason="export tests need onnxruntime (pip install 'vitfast[export]')")

import vitfast  # noqa: E402
import vitfast.data  # noqa: E402
from conftest import AIMV2, EVA02, randomize, tiny_config  # noqa: E402
from vitfast.export import quantize_int8, read_sidecar, to_onnx  # noqa: E402
from vitfast.export.artifacts import write_sidecar  # noqa: E402

VITFAST = Path(sys.executable).parent / "vitfast"


def run(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(VITFAST), *map(str, args)], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{name: (model, fp32 path, fp16 path)} for two model sizes with random non-trivial weights."""
    root = tmp_path_factory.mktemp("onnx")
    out = {}
    for name in ("vit_cifar_patch4_32", "vit_tiny_patch16_224"):
        torch.manual_seed(0)
        model = randomize(vitfast.create_model(name, **({"depth": 4} if "tiny" in name else {})), scale=0.1)
        fp32 = to_onnx(model, root / f"{name}.onnx", batch=(1, 8, 32))
        fp16 = to_onnx(model, root / f"{name}.fp16.onnx", precision="fp16")
        out[name] = (model, fp32, fp16)
    return out


# ---------------------------------------------------------------------------- ONNX
@pytest.mark.parametrize("name", ["vit_cifar_patch4_32", "vit_tiny_patch16_224"])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_onnx_fp32_and_fp16_parity_at_dynamic_batch_sizes(exported, name, batch):
    model, fp32, fp16 = exported[name]
    x = torch.randn(batch, 3, *model.config.img_hw)
    with torch.no_grad():
        ref = model(x)
    for path, limit in ((fp32, 1e-4), (fp16, 2e-2)):
        got = vitfast.load_engine(path)(x)
        assert got.shape == ref.shape
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= limit, path.name


def test_a_fixed_batch_graph_runs_at_its_one_batch_size(tmp_path):
    """`dynamic_batch=False` fixes the graph at the profile's opt: the sidecar says so (it recorded the whole profile,
    which every load then refused, or none, which let other sizes reach ONNX Runtime's own error), and eval splits
    a folder into batches of that size. A sidecar written before, without the profile, reads the same."""
    torch.manual_seed(0)
    model = randomize(vitfast.create_model("vit_cifar_patch4_32", depth=1), scale=0.1)
    path = to_onnx(model, tmp_path / "b2.onnx", dynamic_batch=False, batch=(1, 2, 4))
    meta = read_sidecar(path)
    assert meta["input"]["batch"] == [2, 2, 2] and meta["input"]["shape"][0] == 2
    engine = vitfast.load_engine(path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert engine.batch == (2, 2, 2) and torch.allclose(engine(x), model(x), atol=1e-4)
    with pytest.raises(vitfast.errors.InputError, match="batch size 3 is outside this artifact's profile 2..2"):
        engine(torch.randn(3, 3, 32, 32))
    del meta["input"]["batch"]
    write_sidecar(path, meta)
    assert vitfast.load_engine(path).batch == (2, 2, 2)
    from PIL import Image

    (tmp_path / "images").mkdir()
    for i in range(5):
        Image.fromarray(np.full((32, 32, 3), 40 * i, np.uint8)).save(tmp_path / "images" / f"{i}.png")
    done = run("predict", path, tmp_path / "images", "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["predictions"]) == 5  # batches of 2, the last one padded or run alone


def test_onnx_graph_structure_and_sidecar(exported):
    model, fp32, fp16 = exported["vit_cifar_patch4_32"]
    graph = onnx.load(str(fp32)).graph
    ops = {n.op_type for n in graph.node}
    assert "LayerNormalization" in ops and "Softmax" in ops  # one node per norm at opset 18
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch axis
    meta = read_sidecar(fp32)
    assert meta["precision"] == "fp32" and meta["onnx"]["opset"] == 18 and meta["input"]["batch"] == [1, 8, 32]
    assert vitfast.ViTConfig.from_dict(meta["config"]) == model.config
    assert meta["parity"]["passed"] and meta["parity"]["max_rel_err"] < 1e-5
    assert meta["tools"]["torch"] and meta["preprocessing"]["mean"] == list(model.config.mean)
    fp16_graph = onnx.load(str(fp16)).graph
    assert fp16_graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # float32 I/O
    norm_inputs = {i for n in fp16_graph.node if n.op_type == "LayerNormalization" for i in n.input[1:]}
    dtypes = {t.name: t.data_type for t in fp16_graph.initializer}
    assert any(dtypes.get(i) == onnx.TensorProto.FLOAT16 for i in norm_inputs) or norm_inputs  # weights cast up in-graph
    cast_to = {a.i for n in fp16_graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"}
    assert onnx.TensorProto.FLOAT in cast_to  # LayerNorm statistics and softmax in fp32


def test_opset_17_is_refused_where_the_exporter_keeps_18_and_nothing_is_written(tmp_path, capsys):
    """torch exports at opset 18 and converts down; onnxscript's converter cannot write a dynamic-size model's
    antialiased Resize at 17, logs a traceback and keeps 18 without raising: the sidecar then said 17. Refused
    with the converter's reason, no traceback on stderr, nothing at the path; a model that converts keeps 17."""
    torch.manual_seed(0)
    dynamic = randomize(vitfast.create_model(tiny_config(depth=1, dynamic_img_size=True)))
    with pytest.raises(vitfast.errors.ArtifactError, match=r"cannot be expressed at opset 17 \(the exporter kept opset 18: .*antialias.*"
                                                           r"\); use --opset 18 or newer"):  # fmt: skip
        to_onnx(dynamic, tmp_path / "d17.onnx", opset=17)
    assert "Traceback" not in capsys.readouterr().err and os.listdir(tmp_path) == []
    plain = to_onnx(randomize(vitfast.create_model(tiny_config(depth=1))), tmp_path / "p17.onnx", opset=17)
    assert [o.version for o in onnx.load(str(plain)).opset_import if o.domain == ""] == [17] == [read_sidecar(plain)["onnx"]["opset"]]


def test_clip_tower_exports_and_quantizes_with_parity(tmp_path):
    """A CLIP-style model (LayerNorm before the blocks, no patch bias, QuickGELU) through ONNX fp32,
    fp16 and INT8: the graph has the extra LayerNorm and QuickGELU's Sigmoid, and parity holds."""
    cfg = vitfast.get_config("vit_base_patch16_clip_quickgelu_224", img_size=32, patch_size=8, embed_dim=64, num_heads=4,
                             depth=2, num_classes=10)  # fmt: skip
    torch.manual_seed(0)
    model = randomize(vitfast.create_model(cfg), scale=0.1)
    fp32 = to_onnx(model, tmp_path / "clip.onnx")
    fp16 = to_onnx(model, tmp_path / "clip.fp16.onnx", precision="fp16")
    ops = [n.op_type for n in onnx.load(str(fp32)).graph.node]
    assert ops.count("LayerNormalization") == 2 * cfg.depth + 2 and "Sigmoid" in ops  # norm_pre + blocks + final
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    for path, limit in ((fp32, 1e-4), (fp16, 2e-2)):
        got = vitfast.load_engine(path)(x)
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= limit, path.name
    int8 = quantize_int8(fp32, tmp_path / "clip.int8.onnx", torch.randn(32, 3, 32, 32), samples=32, progress=False)
    meta = read_sidecar(int8)
    assert meta["config"]["act_layer"] == "quick_gelu" and meta["config"]["pre_norm"] is True
    assert meta["parity"]["cosine"] > 0.98


def test_siglip_tower_exports_and_quantizes_with_parity(tmp_path):
    """A SigLIP tower (attention-pool head, no class token, tanh GELU) at a size that is not a multiple
    of the patch: the pool's attention is one more Softmax, parity holds in fp32 / fp16 / INT8."""
    cfg = vitfast.get_config("vit_so400m_patch14_siglip_384", img_size=36, patch_size=8, embed_dim=64, num_heads=4, depth=2)
    torch.manual_seed(0)
    model = randomize(vitfast.create_model(cfg), scale=0.1)
    fp32 = to_onnx(model, tmp_path / "siglip.onnx")
    fp16 = to_onnx(model, tmp_path / "siglip.fp16.onnx", precision="fp16")
    ops = [n.op_type for n in onnx.load(str(fp32)).graph.node]
    assert ops.count("Softmax") == cfg.depth + 1 and ops.count("LayerNormalization") == 2 * cfg.depth + 2  # + final, pool norms
    x = torch.randn(5, 3, 36, 36)
    with torch.no_grad():
        ref = model(x)
    assert ref.shape == (5, 64)
    for path, limit in ((fp32, 1e-4), (fp16, 2e-2)):
        got = vitfast.load_engine(path)(x)
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= limit, path.name
    int8 = quantize_int8(fp32, tmp_path / "siglip.int8.onnx", torch.randn(32, 3, 36, 36), samples=32, progress=False)
    assert read_sidecar(int8)["config"]["global_pool"] == "map" and read_sidecar(int8)["parity"]["cosine"] > 0.98


def exported_with_parity(model, path: Path) -> Path:
    """Export `model` to fp32 `path` and an fp16 twin; each run by ONNX Runtime within 1e-4 / 2e-2 of the
    model's largest logit. Returns the fp32 path."""
    fp32, fp16 = to_onnx(model, path), to_onnx(model, path.with_suffix(".fp16.onnx"), precision="fp16")
    x = torch.randn(3, 3, *model.config.img_hw)
    with torch.no_grad():
        ref = model(x)
    for exported, limit in ((fp32, 1e-4), (fp16, 2e-2)):
        got = vitfast.load_engine(exported)(x)
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= limit, exported.name
    return fp32


@pytest.mark.parametrize("mlp", ["mlp", "swiglu_packed"])
def test_dinov2_classifier_exports_with_parity(tmp_path, mlp):
    """global_pool="token_avg" (class token beside the patch mean, registers excluded), with the GELU MLP
    or the giant's SwiGLU, through ONNX fp32 and fp16."""
    act = "silu" if mlp == "swiglu_packed" else "gelu"
    cfg = tiny_config(global_pool="token_avg", reg_tokens=2, init_values=0.5, no_embed_class=True, mlp_layer=mlp, act_layer=act)
    model = randomize(vitfast.create_model(cfg), scale=0.1)
    exported_with_parity(model, tmp_path / "d.onnx")


@pytest.mark.parametrize("head", [dict(global_pool="token_avg"), dict(representation_size=24)], ids=["token_avg", "pre_logits"])
def test_headless_outputs_wider_or_narrower_than_embed_dim_export_and_load(tmp_path, head):
    """Without a classifier, forward returns 2 x embed_dim ("token_avg") or the pre-logits width: the sidecar
    records that width and the runtime's graph check accepts it (it used to assume embed_dim and refuse)."""
    model = randomize(vitfast.create_model(tiny_config(num_classes=0, **head)), scale=0.1)
    fp32 = exported_with_parity(model, tmp_path / "headless.onnx")
    width = 2 * 64 if "global_pool" in head else 24
    assert read_sidecar(fp32)["output"]["shape"] == ["batch", width]


def test_aimv2_exports_with_parity_and_fp32_rms_statistics(tmp_path):
    """AIMv2's block (RMSNorm, SwiGLU apart, no projection biases, normalised patch tokens) through ONNX fp32, fp16
    and int8; the fp16 graph squares the activations in fp32 (x^2 passes fp16's 65504 from |x| > 256), so inputs that
    large stay finite."""
    import onnx

    cfg = tiny_config(**AIMV2)
    model = randomize(vitfast.create_model(cfg), scale=0.1)
    fp32, fp16 = to_onnx(model, tmp_path / "a.onnx"), to_onnx(model, tmp_path / "a.fp16.onnx", precision="fp16")
    x = torch.randn(3, 3, *cfg.img_hw) * 100
    with torch.no_grad():
        ref = model(x)
    for path, limit in ((fp32, 1e-4), (fp16, 2e-2)):
        got = vitfast.load_engine(path)(x)
        assert torch.isfinite(got).all() and ((got - ref).abs().max() / ref.abs().max()).item() <= limit, path.name
    graph = onnx.load(fp16).graph
    producers = {out: node for node in graph.node for out in node.output}
    squares = [n for n in graph.node if n.op_type == "Pow"]
    casts = [producers[n.input[0]] for n in squares]
    assert squares and all(c.op_type == "Cast" and onnx.helper.get_attribute_value(c.attribute[0]) == onnx.TensorProto.FLOAT for c in casts)
    int8 = quantize_int8(fp32, tmp_path / "a.int8.onnx", torch.randn(32, 3, *cfg.img_hw), samples=32, progress=False)
    assert read_sidecar(int8)["parity"]["passed"]


@pytest.mark.parametrize("mlp", ["mlp", "swiglu"])
def test_dinov3_exports_with_parity_its_rotary_tables_folded(tmp_path, mlp):
    """DINOv3's block (rotary positions on the patch tokens' q and k, 4 registers, layer scale; the GELU MLP or the
    large sizes' SwiGLU) through ONNX fp32, fp16 and int8. The rotary tables depend on the image size only, which an
    export fixes: they are constants in the graph (no Sin/Cos left for the runtime to compute)."""
    import onnx

    act = "silu" if mlp == "swiglu" else "gelu"
    cfg = tiny_config(abs_pos_embed=False, rope="dinov3", reg_tokens=4, init_values=0.5, norm_eps=1e-5, mlp_layer=mlp, act_layer=act)
    model = randomize(vitfast.create_model(cfg), scale=0.1)
    fp32 = exported_with_parity(model, tmp_path / "d.onnx")
    assert not {"Sin", "Cos"} & {n.op_type for n in onnx.load(fp32).graph.node}
    int8 = quantize_int8(fp32, tmp_path / "d.int8.onnx", torch.randn(32, 3, *cfg.img_hw), samples=32, progress=False)
    assert read_sidecar(int8)["parity"]["passed"] and read_sidecar(int8)["config"]["rope"] == "dinov3"


@pytest.mark.parametrize("extra", [{}, dict(mlp_layer="swiglu_packed", mlp_ratio=6, scale_attn_norm=True, global_pool="token")],
                         ids=["eva02-mlp-norm", "eva02-clip-attn-norm"])  # fmt: skip
def test_eva02_exports_with_parity_its_interleaved_rotation_included(tmp_path, extra):
    """EVA-02's block (learned and axial rotary positions, pairs of channels rotated together, norms inside the
    branches) through ONNX fp32, fp16 and int8; the rotary tables are constants in the graph, as DINOv3's."""
    import onnx

    cfg = tiny_config(**EVA02 | extra)
    model = randomize(vitfast.create_model(cfg), scale=0.1)
    fp32 = exported_with_parity(model, tmp_path / "e.onnx")
    assert not {"Sin", "Cos"} & {n.op_type for n in onnx.load(fp32).graph.node}
    int8 = quantize_int8(fp32, tmp_path / "e.int8.onnx", torch.randn(32, 3, *cfg.img_hw), samples=32, progress=False)
    assert read_sidecar(int8)["parity"]["passed"] and read_sidecar(int8)["config"]["rope"] == "axial"


def test_export_of_an_optimized_model_uses_the_reference_path(tmp_path):
    pytest.importorskip("triton", reason="needs triton for optimize()")
    model = vitfast.optimize(vitfast.create_model("vit_cifar_patch4_32"))
    path = to_onnx(model, tmp_path / "m.onnx")
    assert read_sidecar(path)["parity"]["passed"]
    assert type(model.blocks[0]).__name__ == "FusedBlock"  # the caller's model is untouched


# ---------------------------------------------------------------------------- INT8
@pytest.fixture(scope="module")
def int8_model(exported, tmp_path_factory):
    model, fp32, _ = exported["vit_cifar_patch4_32"]
    out = tmp_path_factory.mktemp("int8") / "m.int8.onnx"
    calib = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return quantize_int8(fp32, out, calib, samples=64, progress=False), fp32


def _producers(graph):
    return {o: n for n in graph.node for o in n.output}


def test_qdq_structure_is_tensorrt_style(int8_model):
    path, _ = int8_model
    graph = onnx.load(str(path)).graph
    produced_by = _producers(graph)
    inits = {t.name: t for t in graph.initializer}
    compute = [n for n in graph.node if n.op_type in ("Conv", "MatMul", "Gemm")]
    assert compute and all(
        produced_by.get(i) is not None and produced_by[i].op_type == "DequantizeLinear" for n in compute for i in n.input[:2]
    ), "every Conv/MatMul/Gemm reads both operands through DequantizeLinear"
    for n in graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2:
            zp = onnx.numpy_helper.to_array(inits[n.input[2]])
            assert zp.dtype == np.int8 and not zp.any(), "symmetric int8: zero points are 0"
    weight_dq = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].dims and len(inits[n.input[0]].dims) > 1]
    per_channel = [n for n in weight_dq if onnx.numpy_helper.to_array(inits[n.input[1]]).size > 1]
    assert per_channel and len(per_channel) == len(weight_dq), "weights are quantized per channel"
    assert not any(n.op_type.startswith("QLinear") for n in graph.node)
    float_ops = [n for n in graph.node if n.op_type in ("LayerNormalization", "Softmax", "Tanh", "Pow")]
    assert float_ops  # LayerNorm, Softmax and (tanh) GELU stay float: fed by float ops, not by DequantizeLinear
    assert all(produced_by[n.input[0]].op_type != "DequantizeLinear" for n in float_ops if n.input[0] in produced_by)


def test_int8_sidecar_and_accuracy_vs_fp32(int8_model):
    path, fp32 = int8_model
    meta = read_sidecar(path)
    assert meta["precision"] == "int8" and meta["int8"]["symmetric_activations"]
    assert (meta["int8"]["samples"], meta["int8"]["held_out"]) == (52, 12)  # 64 given, none spare: a fifth held out
    assert meta["source"] == read_sidecar(fp32)["source"]
    x = torch.randn(8, 3, 32, 32)
    a, b = vitfast.load_engine(path)(x), vitfast.load_engine(fp32)(x)
    assert torch.nn.functional.cosine_similarity(a, b).min() > 0.95


def test_int8_parity_is_measured_on_held_out_images(exported, tmp_path):
    """The parity in the sidecar is int8 vs fp32 on images after the calibration samples, not on those."""
    _, fp32, _ = exported["vit_cifar_patch4_32"]
    images = torch.randn(20, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    out = quantize_int8(fp32, tmp_path / "q.onnx", images, samples=12, progress=False)
    meta = read_sidecar(out)
    assert (meta["int8"]["samples"], meta["int8"]["held_out"]) == (12, 8) and "8 held-out images" in meta["parity"]["inputs"]
    held = images[12:]
    ort = {"backend": "onnxruntime"}  # the sidecar's parity is ONNX Runtime's (OpenVINO's int8 rounds differently)
    expected = vitfast.parity.compare(vitfast.load_engine(out, **ort)(held), vitfast.load_engine(fp32, **ort)(held), "int8")
    assert meta["parity"]["max_abs_err"] == pytest.approx(expected["max_abs_err"], rel=1e-5)
    with pytest.raises(vitfast.InputError, match="at least 2 images"):
        quantize_int8(fp32, tmp_path / "one.onnx", images[:1], samples=12, progress=False)



def test_int8_falls_back_to_onnx_shape_inference_when_onnxruntimes_fails(exported, int8_model, tmp_path, monkeypatch):
    """ONNX Runtime 1.30's symbolic shape inference raises IndexError in _infer_Concat on torch's
    dynamic-shape Concat (reproduced there; 1.32 is fixed): int8 export then uses ONNX's shape
    inference, gives the same Q/DQ graph and logits, and says so in the sidecar."""
    from onnxruntime.tools import symbolic_shape_infer

    _, fp32, _ = exported["vit_cifar_patch4_32"]
    reference, _ = int8_model
    if read_sidecar(reference)["int8"]["shape_inference"] != "onnxruntime symbolic":
        pytest.skip("this ONNX Runtime's symbolic shape inference fails on the graph by itself: no symbolic result to compare with")

    def fail_like_1_30(self, node):
        raise IndexError("list index out of range")

    monkeypatch.setattr(symbolic_shape_infer.SymbolicShapeInference, "_infer_Concat", fail_like_1_30)
    calib = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))  # int8_model's images
    out = quantize_int8(fp32, tmp_path / "fallback.onnx", calib, samples=64, progress=False)
    meta = read_sidecar(out)
    assert meta["int8"]["shape_inference"] == "onnx (ONNX Runtime's symbolic shape inference failed with IndexError: list index out of range)"
    ops = [[n.op_type for n in onnx.load(str(p)).graph.node] for p in (reference, out)]
    assert ops[0] == ops[1] and ops[1].count("DequantizeLinear") > 20
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(vitfast.load_engine(out, backend="onnxruntime")(x), vitfast.load_engine(reference, backend="onnxruntime")(x))


def test_incomplete_symbolic_shape_inference_leaves_nothing_in_the_working_directory(exported, tmp_path, monkeypatch):
    """Where ONNX Runtime's symbolic inference cannot finish (the device's 1.30 on some graphs), it saves
    sym_shape_infer_temp.onnx and a .data file in the working directory, then raises: int8 export falls back,
    says so, and the user's directory stays as it was."""
    from onnxruntime.tools import symbolic_shape_infer

    def gives_up(self, *args, **kwargs):
        self.run_ = False
        return False  # "not all shapes inferred"

    monkeypatch.setattr(symbolic_shape_infer.SymbolicShapeInference, "_infer_impl", gives_up)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    _, fp32, _ = exported["vit_cifar_patch4_32"]
    out = quantize_int8(fp32, tmp_path / "q.onnx", torch.randn(8, 3, 32, 32), samples=8, progress=False)
    assert read_sidecar(out)["int8"]["shape_inference"].startswith("onnx (ONNX Runtime's symbolic shape inference failed")
    assert list(cwd.iterdir()) == []


def test_int8_does_not_hide_other_preprocessing_failures(exported, tmp_path, monkeypatch):
    """Only a failure inside the symbolic shape inference is retried; anything else surfaces and
    leaves no output."""
    from onnxruntime.quantization import shape_inference

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(shape_inference, "quant_pre_process", broken)
    _, fp32, _ = exported["vit_cifar_patch4_32"]
    with pytest.raises(RuntimeError, match="disk on fire"):
        quantize_int8(fp32, tmp_path / "q.onnx", torch.randn(8, 3, 32, 32), samples=8, progress=False)
    assert not (tmp_path / "q.onnx").exists()

def test_exclude_keeps_matching_nodes_in_float(exported, tmp_path):
    _, fp32, _ = exported["vit_cifar_patch4_32"]
    names = [n.name for n in onnx.load(str(fp32)).graph.node if n.op_type == "Conv"]
    out = quantize_int8(fp32, tmp_path / "x.onnx", torch.randn(8, 3, 32, 32), samples=8, exclude=[names[0]], progress=False)
    graph = onnx.load(str(out)).graph
    conv = next(n for n in graph.node if n.op_type == "Conv")
    assert _producers(graph).get(conv.input[0]) is None or _producers(graph)[conv.input[0]].op_type != "DequantizeLinear"
    with pytest.raises(vitfast.ArtifactError, match="match no node"):
        quantize_int8(fp32, tmp_path / "y.onnx", torch.randn(8, 3, 32, 32), samples=8, exclude=["nope*"], progress=False)
    assert not (tmp_path / "y.onnx").exists()



@pytest.mark.parametrize("target", ["tensorrt", "cpu"])  # cpu: biases quantized too, their DequantizeLinear output keeps the name
def test_keep_float_finds_the_layer_whose_quantization_costs_most(tmp_path, target):
    """One fc2 input channel 30x larger than the rest (an outlier no per-tensor int8 scale holds): keep_float=1
    ranks that fc2 first, quantizes again with it in float (no Q/DQ on its inputs, its fp32 weight back) and the
    held-out parity improves. Ranked on calibration images, so the reported parity stays on unseen ones."""
    torch.manual_seed(0)
    model = vitfast.create_model("vit_cifar_patch4_32").eval()
    with torch.no_grad():
        model.blocks[2].mlp.fc1.weight[5] *= 30
        model.blocks[2].mlp.fc1.bias[5] += 20
    fp32 = to_onnx(model, tmp_path / "m.onnx")
    images = vitfast.data.random_images(model.config, 96, seed=3)
    plain = quantize_int8(fp32, tmp_path / "plain.onnx", images, samples=32, target=target, progress=False)
    kept = quantize_int8(fp32, tmp_path / "kept.onnx", images, samples=32, target=target, keep_float=1, progress=False)
    record = read_sidecar(kept)["int8"]["keep_float"]
    assert record["ranking"][0]["module"] == "blocks.2.mlp.fc2" and record["nodes"] == [record["ranking"][0]["node"]]
    assert record["ranking"][0]["error_left"] < 0.5 < record["ranking"][1]["error_left"]  # it alone made most of the error
    assert record["ranked_on"] == "16 calibration images" and read_sidecar(plain)["int8"]["keep_float"] is None
    graph = onnx.load(str(kept)).graph
    node = next(n for n in graph.node if n.name == record["nodes"][0])
    assert all(_producers(graph).get(i) is None or _producers(graph)[i].op_type != "DequantizeLinear" for i in node.input)
    weight = next(i for i in node.input if i in {t.name for t in graph.initializer})
    assert next(t for t in graph.initializer if t.name == weight).data_type == onnx.TensorProto.FLOAT  # its fp32 weight, not int8
    before, after = (read_sidecar(p)["parity"] for p in (plain, kept))
    assert after["max_abs_err"] < before["max_abs_err"] / 2 and after["cosine"] > before["cosine"]
    if target != "tensorrt":
        return
    with pytest.raises(vitfast.InputError, match="keep_float=99 but the graph has 26 quantized layers"):
        quantize_int8(fp32, tmp_path / "many.onnx", images, samples=32, keep_float=99, progress=False)
    assert not (tmp_path / "many.onnx").exists()
    with pytest.raises(vitfast.InputError, match="whole number >= 0"):
        quantize_int8(fp32, tmp_path / "neg.onnx", images, samples=32, keep_float=-1, progress=False)


def test_graphs_over_the_protobuf_cap_quantize_with_external_weights(tmp_path, monkeypatch):
    """A graph over 2 GiB (ViT-H and larger in fp32) cannot be one protobuf: its prepared graph, int8 file and the
    graphs keep_float measures keep their weights in external files. Shown on a small model with the size limit
    lowered to 0: the result equals the inline quantization's, ranking included."""
    import vitfast.export.quantize as quantize

    torch.manual_seed(0)
    model = vitfast.create_model("vit_cifar_patch4_32").eval()
    fp32 = to_onnx(model, tmp_path / "m.onnx")
    images = vitfast.data.random_images(model.config, 48, seed=3)
    inline = quantize_int8(fp32, tmp_path / "inline.onnx", images, samples=32, keep_float=1, progress=False)
    monkeypatch.setattr(quantize, "EXTERNAL_DATA_BYTES", 0)
    external = quantize_int8(fp32, tmp_path / "external.onnx", images, samples=32, keep_float=1, progress=False)
    assert [f["role"] for f in read_sidecar(external)["files"]] == ["artifact", "external-data"]
    assert not any(name.startswith(".vitfast") for name in os.listdir(tmp_path))  # the staging folder is gone
    assert quantize.stored_bytes(external) > external.stat().st_size * 2  # most weights are beside it (small tensors stay in it)
    assert quantize.stored_bytes(external) < inline.stat().st_size * 1.1  # quantized twice (keep_float): one set of weights
    ours, theirs = (read_sidecar(p)["int8"]["keep_float"] for p in (external, inline))
    assert ours["ranking"] == theirs["ranking"]
    x = vitfast.data.random_images(model.config, 4, seed=9)
    assert torch.equal(vitfast.load_engine(external)(x), vitfast.load_engine(inline)(x))


def test_cli_int8_keep_float(tmp_path):
    from PIL import Image

    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(6):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(calib / f"{i}.png")
    out = run("export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--precision", "int8", "--calib-dir", calib,
              "--int8-keep-float", "2", "--out", tmp_path / "k.onnx")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert len(read_sidecar(tmp_path / "k.onnx")["int8"]["keep_float"]["nodes"]) == 2
    wrong = run("export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--int8-keep-float", "2", "--out", tmp_path / "f.onnx")
    assert wrong.returncode == 2 and "--precision int8" in wrong.stderr and not (tmp_path / "f.onnx").exists()

# ---------------------------------------------------------------------------- runtime
def test_engine_checks_shapes_and_takes_uint8(exported):
    model, fp32, _ = exported["vit_cifar_patch4_32"]
    engine = vitfast.load_engine(fp32)
    with pytest.raises(vitfast.InputError, match=r"expects normalised float images \[B, 3, 32, 32\]"):
        engine(torch.randn(2, 3, 48, 48))
    with pytest.raises(vitfast.InputError, match="outside this artifact's profile 1..32"):
        engine(torch.randn(33, 3, 32, 32))
    raw = np.random.default_rng(0).integers(0, 256, (2, 40, 40, 3), dtype=np.uint8)
    with torch.no_grad():
        torch.testing.assert_close(engine(raw), model(vitfast.preprocess(raw, model.config)), atol=1e-4, rtol=1e-4)


def test_exported_onnx_takes_preprocessing_and_meaning_and_refuses_what_it_fixed(exported):
    model, fp32, _ = exported["vit_cifar_patch4_32"]
    names = [f"c{i}" for i in range(10)]
    for backend in ("onnxruntime", "openvino"):
        if backend == "openvino":
            pytest.importorskip("openvino", reason="the OpenVINO engine needs openvino")
        engine = vitfast.load_engine(fp32, backend=backend, overrides={"mean": [0.0] * 3, "labels": names, "problem_type": "regression"})
        assert (engine.config.mean, engine.config.labels, engine.config.problem_type) == ((0.0,) * 3, tuple(names), "regression")
        raw = np.random.default_rng(1).integers(0, 256, (2, 40, 40, 3), dtype=np.uint8)
        with torch.no_grad():  # the raw images are normalised with the given mean
            torch.testing.assert_close(engine(raw), model(vitfast.preprocess(raw, engine.config)), atol=1e-4, rtol=1e-4)
        whole = vitfast.load_engine(fp32, backend=backend, overrides=model.config.to_dict() | {"name": "other"})  # all agree
        assert whole.config == model.config
        fixed = r"fixes what these override: num_heads 2 \(it has 4\), img_size 64 \(it has 32\); drop --num-heads / --img-size"
        with pytest.raises(vitfast.InputError, match=fixed):
            vitfast.load_engine(fp32, backend=backend, overrides={"num_heads": 2, "img_size": 64, "depth": model.config.depth})


# ---------------------------------------------------------------------------- CLI
def test_cli_export_check_eval_round_trip(tmp_path):
    assert run("export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--out", tmp_path / "m.onnx").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.json"]
    check = run("check", tmp_path / "m.onnx", "--json")
    assert check.returncode == 0 and json.loads(check.stdout)["passed"]
    assert set(json.loads(check.stdout)) >= {"max_abs_err", "max_rel_err", "cosine", "top1_agreement", "passed"}
    again = run("export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--out", tmp_path / "m.onnx")
    assert again.returncode == 2 and "--force" in again.stderr
    data = tmp_path / "data"
    from PIL import Image

    for c in ("cat", "dog"):
        (data / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((32, 32, 3), 40 * i, np.uint8)).save(data / c / f"{i}.png")
    ev = run("eval", tmp_path / "m.onnx", "--data", data, "--json")  # 2 folders for a 10-class model: refused
    assert ev.returncode == 2 and "the model has 10 classes but" in ev.stderr and ev.stderr.count("\n") == 1
    for c in range(2, 10):
        (data / f"class{c}").mkdir()
        Image.fromarray(np.full((32, 32, 3), 20 * c, np.uint8)).save(data / f"class{c}" / "0.png")
    ev = run("eval", tmp_path / "m.onnx", "--data", data, "--json")
    result = json.loads(ev.stdout)
    assert ev.returncode == 0 and result["n"] == 14 and 0 <= result["top1"] <= result["top5"] <= 1


def test_trt_export_refuses_the_cpu_int8_target_before_any_work(tmp_path):
    """TensorRT cannot build the CPU target's asymmetric uint8 Q/DQ: said before calibrating and exporting, not after."""
    (tmp_path / "calib").mkdir()
    out = run("export", "--model", "vit_cifar_patch4_32", "--format", "trt", "--precision", "int8", "--calib-dir", tmp_path / "calib",
              "--int8-target", "cpu", "--out", tmp_path / "m.engine")  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "drop --int8-target for a TensorRT engine" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib"]


def test_trt_export_without_tensorrt_keeps_the_onnx_and_says_how_to_install(tmp_path):
    try:
        import tensorrt  # noqa: F401

        pytest.skip("TensorRT is installed here")
    except ImportError:
        pass
    out = run("export", "--model", "vit_cifar_patch4_32", "--format", "trt", "--precision", "fp16", "--out", tmp_path / "m.engine")
    assert out.returncode == 2 and "TensorRT is not installed" in out.stderr and "pip install 'tensorrt>=10,<11'" in out.stderr
    *phases, error = out.stderr.strip().splitlines()  # progress lines of the ONNX export, then the one error line
    assert all(line.startswith("export: ") for line in phases) and str(tmp_path / "m.onnx") in error
    assert (tmp_path / "m.onnx").exists() and not (tmp_path / "m.engine").exists()
    trtexec = f"trtexec --onnx={tmp_path / 'm.onnx'} --saveEngine={tmp_path / 'm.engine'} --fp16 --minShapes=images:1x3x32x32"
    assert trtexec in out.stderr and "--maxShapes=images:32x3x32x32" in out.stderr


def test_trt_export_checks_for_tensorrt_before_the_onnx_export(monkeypatch, tmp_path, capsys):
    from vitfast import pipeline
    from vitfast.cli import export as cli_export
    from vitfast.cli import main
    from vitfast.errors import BackendUnavailable

    calls = []
    real_export_onnx = pipeline.export_onnx

    def missing():
        calls.append("require_tensorrt")
        raise BackendUnavailable("TensorRT is not installed: pip install tensorrt")

    def export_onnx(*args, **kwargs):
        calls.append("export_onnx")
        return real_export_onnx(*args, **kwargs)

    monkeypatch.setattr(cli_export, "require_tensorrt", missing)
    monkeypatch.setattr(pipeline, "export_onnx", export_onnx)
    args = ["export", "--model", "vit_cifar_patch4_32", "--format", "trt", "--precision", "fp32", "--batch", "2:3:7",
            "--workspace", "1", "--out", tmp_path / "m.plan"]  # fmt: skip
    assert main([*map(str, args)]) == 2
    assert calls == ["require_tensorrt", "export_onnx"]
    *phases, err = capsys.readouterr().err.strip().splitlines()  # progress lines of the ONNX export, then the one error line
    assert all(line.startswith("export: ") for line in phases) and err.startswith("vitfast: error: TensorRT is not installed")
    assert (f"trtexec --onnx={tmp_path / 'm.onnx'} --saveEngine={tmp_path / 'm.plan'} --noTF32 --minShapes=images:2x3x32x32 "
            "--optShapes=images:3x3x32x32 --maxShapes=images:7x3x32x32 --memPoolSize=workspace:1024M") in err  # fmt: skip
    assert (tmp_path / "m.onnx").exists() and not (tmp_path / "m.plan").exists()


def test_trt_export_of_a_dynamic_size_model_says_its_image_sizes_and_puts_them_in_the_trtexec_line(monkeypatch, tmp_path, capsys):
    from vitfast.cli import export as cli_export
    from vitfast.cli import main
    from vitfast.errors import BackendUnavailable

    def missing():
        raise BackendUnavailable("TensorRT is not installed: pip install tensorrt")

    monkeypatch.setattr(cli_export, "require_tensorrt", missing)
    base = ["export", "--model", "vit_cifar_patch4_32", "--dynamic-img-size", "--format", "trt", "--batch", "1:2:4", "--force"]
    assert main([*base, "--out", str(tmp_path / "m.engine")]) == 2
    err = capsys.readouterr().err
    assert "TensorRT image sizes: 16x16 to 64x64, optimised for 32x32 (the default: half to twice the model's size)" in err
    assert "--minShapes=images:1x3x16x16 --optShapes=images:2x3x32x32 --maxShapes=images:4x3x64x64" in err
    assert main([*base, "--image-sizes", "8x16:32:48x96", "--out", str(tmp_path / "m2.engine")]) == 2  # m.onnx is the first run's
    err = capsys.readouterr().err
    assert "TensorRT image sizes" not in err and "--minShapes=images:1x3x8x16 --optShapes=images:2x3x32x32 --maxShapes=images:4x3x48x96" in err


def test_trt_export_without_tensorrt_tells_a_terminal_before_the_onnx_export(monkeypatch, tmp_path, capsys):
    from vitfast import pipeline
    from vitfast.cli import export as cli_export
    from vitfast.cli import main
    from vitfast.errors import BackendUnavailable

    class SaidBeforeExport(BaseException):  # not an Exception, which main reports as an internal error
        pass

    def missing():
        raise BackendUnavailable("TensorRT is not installed: pip install tensorrt")

    def export_onnx(*args, **kwargs):  # stands in for the minute-long export: what had been said by then
        raise SaidBeforeExport(capsys.readouterr().err)

    monkeypatch.setattr(cli_export, "require_tensorrt", missing)
    monkeypatch.setattr(pipeline, "export_onnx", export_onnx)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with pytest.raises(SaidBeforeExport) as said:
        main(["export", "--model", "vit_cifar_patch4_32", "--format", "trt", "--out", str(tmp_path / "m.engine")])
    assert said.value.args[0] == "TensorRT is not installed: pip install tensorrt; writing only the ONNX, then the trtexec command that builds it\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["export", "--model", "vit_base_patch16_244", "--format", "onnx", "--out", "x.onnx"], "did you mean vit_base_patch16_224"),
        (["export", "--checkpoint", "missing.safetensors", "--format", "onnx", "--out", "x.onnx"], "checkpoint not found"),
        (["export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--batch", "1-8", "--out", "x.onnx"], "MIN:OPT:MAX"),
        (["export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--batch", "8:4:2", "--out", "x.onnx"], "MIN <= OPT <= MAX"),
        (["export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--precision", "int8", "--out", "x.onnx"], "needs --calib-dir"),
        (["export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--precision", "int8", "--calib-dir", "empty", "--out", "x.onnx"], "no images"),
        (["export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--precision", "int8", "--calib-dir", "bad", "--out", "x.onnx"], "not an image Pillow can read"),
        (["check", "corrupt.onnx"], "corrupt.onnx is not a readable ONNX model"),
        (["check", "nosidecar.onnx"], "nosidecar.onnx is not a readable ONNX model"),  # without a sidecar the graph is read
        (["eval", "m.engine", "--data", "."], "TensorRT is not installed"),
        (["export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--image-sizes", "16:32:64", "--out", "x.onnx"],
         "--image-sizes sets the image sizes a TensorRT engine takes: it goes with --format trt"),
        (["export", "--model", "vit_cifar_patch4_32", "--format", "trt", "--image-sizes", "16:32:64", "--out", "x.engine"],
         "this model takes one (32x32); export with --dynamic-img-size"),  # refused before the ONNX export, not after
        # flags that would do nothing here: refused, never ignored (an fp32 export where int8 was meant)
        (["export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--calib-dir", "bad", "--calib-method", "entropy", "--int8-target",
          "cpu", "--exclude", "blocks.0.*", "--out", "x.onnx"], "--calib-dir, --calib-method, --int8-target, --exclude configure int8 "
                                                             "calibration; this export is fp32: add --precision int8 or drop them"),
        (["export", "--model", "vit_cifar_patch4_32", "--format", "trt", "--precision", "fp16", "--calib-samples", "8", "--out", "x.engine"],
         "--calib-samples configures int8 calibration; this export is fp16: add --precision int8 or drop it"),
        (["export", "--model", "vit_cifar_patch4_32", "--format", "onnx", "--workspace", "64", "--opt-level", "5", "--timing-cache", "tc",
          "--no-fp32-layernorm", "--out", "x.onnx"], "--workspace, --opt-level, --timing-cache, --no-fp32-layernorm set how TensorRT "
                                                     "builds an engine: they go with --format trt; drop them"),
        (["export", "--model", "vit_cifar_patch4_32", "--format", "triton-repo", "--opt-level", "3", "--out", "repo"],
         "--opt-level sets how TensorRT builds an engine: it goes with --format trt"),
        (["export", "--onnx", "nosidecar.onnx", "--format", "trt", "--calib-method", "entropy", "--out", "x.engine"],
         "--calib-method set vitfast's own ONNX export and int8 calibration; --onnx takes the graph as it is"),
        (["export", "--model", "vit_cifar_patch4_32", "--dynamic-img-size", "--format", "trt", "--image-sizes", "16:30:64", "--out", "x.engine"],
         "--image-sizes 16:30:64 are not whole 4-pixel patches; e.g. 16x16:28x28:64x64"),
    ],
)  # fmt: skip
def test_cli_bad_inputs_one_line_exit_2_nothing_written(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    for name in ("broken.png", "broken2.png"):  # two: one alone is refused first (int8 holds one image out)
        (tmp_path / "bad" / name).write_bytes(b"not a png at all")
    (tmp_path / "corrupt.onnx").write_bytes(b"\x08\x01garbage")
    write_sidecar(tmp_path / "corrupt.onnx", {"config": vitfast.get_config("vit_cifar_patch4_32").to_dict(), "precision": "fp32"})
    (tmp_path / "nosidecar.onnx").write_bytes(b"x")
    (tmp_path / "m.engine").write_bytes(b"x")
    before = set(tmp_path.rglob("*"))
    out = run(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr
    assert set(tmp_path.rglob("*")) == before  # no partial output
