"""q/k/v split of an exported ONNX graph (`vitfast.export.qkv_split`) and the `--int8-target openvino`
file built on it: same logits as the fused graph and the PyTorch reference, odd shapes, no qkv bias,
and a graph without the pattern left alone."""

from __future__ import annotations

import pytest
import torch

onnx = pytest.importorskip("onnx", reason="export tests need onnx (pip install 'vitfast[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="export tests need onnxruntime (pip install 'vitfast[onnx]')")

import vitfast  # noqa: E402
from conftest import randomize  # noqa: E402
from vitfast.export import quantize_int8, to_onnx  # noqa: E402
from vitfast.export.artifacts import read_sidecar  # noqa: E402
from vitfast.export.qkv_split import split_qkv, write_split_qkv  # noqa: E402


def _run(path, x: torch.Tensor) -> torch.Tensor:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {"images": x.numpy()})[0])


def _fused_qkv_weights(path, dim: int) -> int:
    """MatMul weights of shape [C, 3C] left in the graph."""
    model = onnx.load(str(path))
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    return sum(1 for n in model.graph.node if n.op_type == "MatMul" and inits.get(n.input[1]) == [dim, 3 * dim])


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_split_graph_computes_the_same_logits(tmp_path, qkv_bias):
    torch.manual_seed(0)
    model = randomize(vitfast.create_model("vit_tiny_patch16_224", img_size=40, patch_size=8, embed_dim=48, depth=2,
                                           num_heads=3, qkv_bias=qkv_bias, num_classes=7), scale=0.2).eval()  # fmt: skip
    fused = to_onnx(model, tmp_path / "m.onnx", batch=(1, 3, 8))
    split = tmp_path / "split.onnx"
    assert write_split_qkv(fused, split, num_heads=3) == 2
    onnx.checker.check_model(str(split))
    assert _fused_qkv_weights(fused, 48) == 2 and _fused_qkv_weights(split, 48) == 0
    x = torch.randn(3, 3, 40, 40)
    with torch.no_grad():
        ref = model(x)
    torch.testing.assert_close(_run(split, x), _run(fused, x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_run(split, x), ref, atol=1e-4, rtol=1e-4)


def test_a_graph_without_the_pattern_is_left_alone(tmp_path):
    model = vitfast.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=5).eval()
    graph = onnx.load(str(to_onnx(model, tmp_path / "m.onnx")))
    assert split_qkv(graph, num_heads=3) == 1
    before = graph.SerializeToString()
    assert split_qkv(graph, num_heads=3) == 0 and graph.SerializeToString() == before


def test_openvino_target_is_the_tensorrt_placement_on_the_split_graph(tmp_path):
    """Same symmetric int8 Q/DQ and per-channel weights as the default target, so the same logits up
    to int8 rounding; recorded in the sidecar; the fp32 file itself is not modified."""
    torch.manual_seed(0)
    model = randomize(vitfast.create_model("vit_tiny_patch16_224", img_size=48, depth=3, num_classes=9), scale=0.1).eval()
    fp32 = to_onnx(model, tmp_path / "m.onnx", batch=(1, 4, 8))
    calib = torch.randn(24, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    default = quantize_int8(fp32, tmp_path / "trt.onnx", calib, samples=16, progress=False)
    split = quantize_int8(fp32, tmp_path / "ov.onnx", calib, samples=16, target="openvino", progress=False)
    meta = read_sidecar(split)
    assert meta["int8"]["target"] == "openvino" and meta["int8"]["split_qkv_blocks"] == 3
    assert meta["int8"]["symmetric_activations"] and meta["parity"]["cosine"] > 0.99
    assert _fused_qkv_weights(fp32, 192) == 3 and _fused_qkv_weights(split, 192) == 0
    x = torch.randn(5, 3, 48, 48)
    with torch.no_grad():
        ref = model(x)
    got, other = _run(split, x), _run(default, x)
    assert torch.nn.functional.cosine_similarity(got, ref).min() > 0.98
    assert torch.nn.functional.cosine_similarity(got, other).min() > 0.995
