"""INT8 calibration: what each --calib-method computes, checked against the calibration images themselves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", reason="export tests need onnx (pip install 'vitfast[export]')")
pytest.importorskip("onnxruntime", reason="export tests need onnxruntime (pip install 'vitfast[export]')")

import vitfast  # noqa: E402
from conftest import randomize  # noqa: E402
from vitfast.export import quantize_int8, to_onnx  # noqa: E402


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    torch.manual_seed(0)
    model = randomize(vitfast.create_model("vit_cifar_patch4_32")).eval()
    return to_onnx(model, tmp_path_factory.mktemp("calib") / "fp32.onnx")


def activation_scales(path) -> dict[str, float]:
    """{tensor: scale} of every activation QuantizeLinear (weights are initializers)."""
    graph = onnx.load(str(path)).graph
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    return {n.input[0]: float(inits[n.input[1]]) for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits}


def spread_images(seed: int) -> torch.Tensor:
    """80 images whose spread grows 15x from the first to the last: every batch of 16 has other extremes."""
    x = torch.randn(80, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return x * torch.linspace(0.2, 3, 80)[:, None, None, None]


def test_minmax_is_the_min_and_max_over_all_calibration_images(fp32, tmp_path):
    """The input's scale is the calibration images' absmax / 127 (symmetric int8), in any batch order: not a mean of
    per-batch extremes, which depended on the order and was narrower than the data."""
    x = spread_images(seed=1)
    calib = x[:64].numpy()  # the held-out 16 are never calibrated on
    forward = activation_scales(quantize_int8(fp32, tmp_path / "fwd.onnx", x, samples=64, progress=False))
    backward = activation_scales(quantize_int8(fp32, tmp_path / "bwd.onnx", torch.cat([x[:64].flip(0), x[64:]]), samples=64, progress=False))
    assert forward["images"] == pytest.approx(np.abs(calib).max() / 127, rel=1e-6)
    assert forward == pytest.approx(backward, rel=1e-6)
