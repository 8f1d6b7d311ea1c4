"""One precision vocabulary: every part of vitfast validates against `vitfast.precision`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitfast import precision
from vitfast.bench.backends import PRECISIONS as BENCH_PRECISIONS
from vitfast.cli.main import build_parser
from vitfast.config import ViTConfig
from vitfast.errors import ArtifactError
from vitfast.export.artifacts import base_metadata
from vitfast.parity import compare, tolerance
from vitfast.runtime.sidecar import read_sidecar, sidecar_path


def test_every_part_uses_a_subset_of_the_one_vocabulary():
    for part in (precision.TORCH, precision.ONNX, precision.EXPORT, precision.TENSORRT, precision.BENCH, precision.QUANTIZED):
        assert set(part) <= set(precision.PRECISIONS)
    assert set(precision.TOLERANCES) == set(precision.PRECISIONS)
    assert BENCH_PRECISIONS == precision.BENCH and "fp8" in precision.TENSORRT and "bf16" not in precision.ONNX


@pytest.mark.parametrize("name", [*precision.PRECISIONS, "fp4"])
def test_export_flag_offers_the_export_precisions(name, capsys):
    argv = ["export", "--model", "vit_tiny_patch16_224", "--format", "onnx", "--out", "m.onnx", "--precision", name]
    if name in precision.EXPORT:
        assert build_parser().parse_args(argv).precision == name
    else:
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("name", [*precision.PRECISIONS, "fp4"])
def test_sidecar_reader_takes_every_precision(tmp_path, name):
    artifact = tmp_path / "m.engine"
    meta = base_metadata("tensorrt", ViTConfig(img_size=32, patch_size=4, embed_dim=32, depth=1, num_heads=2), name,
                         batch=None, dynamic_batch=True)
    sidecar_path(artifact).write_text(json.dumps(meta))
    if name in precision.PRECISIONS:
        assert read_sidecar(artifact, verify=False)["precision"] == name
    else:
        with pytest.raises(ArtifactError, match="'precision' must be one of"):
            read_sidecar(artifact, verify=False)


@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.float16, "fp16"), (torch.bfloat16, "bf16")])
def test_from_dtype(dtype, name):
    assert precision.from_dtype(dtype) == name and precision.TORCH_DTYPES[name] == dtype


def test_unknown_precisions_are_refused_with_the_choices():
    with pytest.raises(ArtifactError, match="no vitfast precision runs in torch.float64"):
        precision.from_dtype(torch.float64)
    with pytest.raises(ArtifactError, match="to_onnx precision must be one of fp32, fp16, got 'int8'"):
        precision.require("int8", precision.ONNX, "to_onnx")
    assert tolerance("fp8", 2.0)["limit_abs_err"] == 0.5


def test_one_output_gets_one_cosine_over_the_batch_and_wide_rows_keep_theirs():
    gen = torch.Generator().manual_seed(11)
    # A regression head: one value an image, some of them near 0, off by int8-sized errors (0.5% of max|ref|) that
    # flip the sign of the small ones.
    ref = torch.randn(64, 1, generator=gen, dtype=torch.float64) * 3
    ref[:8] = torch.linspace(-0.01, 0.01, 8, dtype=torch.float64)[:, None]
    noise = (torch.rand(64, 1, generator=gen, dtype=torch.float64) * 2 - 1) * 0.005 * ref.abs().max()
    out = ref + noise
    assert ((out[:8] > 0) != (ref[:8] > 0)).any()  # some near-zero outputs did turn around
    result = compare(out, ref, "int8")
    a, b = out.numpy().ravel(), ref.numpy().ravel()
    assert result["cosine_over"] == "batch"
    assert result["cosine"] == pytest.approx(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)), abs=1e-12)
    assert result["passed"]
    # A 10-class head keeps the worst per-image cosine: one image's logits turned around fails however well the rest agree.
    ref = torch.randn(64, 10, generator=gen, dtype=torch.float64)
    out = ref.clone()
    out[5] = -ref[5] * 0.01
    result = compare(out, ref, "int8")
    rows = (out * ref).sum(1) / (out.norm(dim=1) * ref.norm(dim=1))
    assert result["cosine_over"] == "row" and result["cosine"] == pytest.approx(rows.min().item(), abs=1e-12)
    assert not result["passed"]


def test_check_text_says_when_the_cosine_was_taken_over_the_batch(capsys, monkeypatch):
    from argparse import Namespace

    from vitfast.cli.export import _print_check

    monkeypatch.setenv("COLUMNS", "80")
    gen = torch.Generator().manual_seed(12)
    for width, said in ((1, True), (10, False)):
        ref = torch.randn(16, width, generator=gen, dtype=torch.float64)
        assert _print_check(compare(ref * 1.001, ref, "fp32"), Namespace(json=False), "check") == 1
        text = capsys.readouterr().out
        assert ("over the batch" in text) == said and all(len(line) <= 80 for line in text.splitlines())
