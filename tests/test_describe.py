"""`vitfast info ARTIFACT`: what an artifact is and how vitfast runs it, for vitfast's exports, another tool's graph,
a checkpoint, and a TensorRT engine this machine cannot load (described from its sidecar)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vitfast
from conftest import randomize, tiny_config

pytest.importorskip("onnxruntime", reason="the exports are run in ONNX Runtime: pip install 'vitfast[onnx]'")

VITFAST = Path(sys.executable).parent / "vitfast"
LABELS = [f"c{i}" for i in range(7)]


def info(*args) -> dict:
    done = subprocess.run([str(VITFAST), "info", *map(str, args), "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from vitfast.export import to_onnx

    root = tmp_path_factory.mktemp("describe")
    torch.manual_seed(0)
    cfg = tiny_config(labels=LABELS, problem_type="multi_label_classification", mean=(0.1, 0.2, 0.3))
    model = randomize(vitfast.create_model(cfg))
    return model, vitfast.save_checkpoint(model, root / "m.safetensors"), to_onnx(model, root / "m.onnx", batch=(1, 4, 8))


def test_a_vitfast_export_is_described_with_what_its_sidecar_recorded(exported):
    model, _, onnx_path = exported
    facts = info(onnx_path)
    assert (facts["made_by"].split()[0], facts["runs_on"], facts["precision"]) == ("vitfast", "onnxruntime", "fp32")
    assert facts["model"]["params"] == sum(p.numel() for p in model.parameters())
    assert facts["input"] == {"shape": ["batch", 3, 32, 32], "batch": [1, 4, 8], "dtype": "float32, normalised", "image_size": [32, 32]}
    assert facts["output"] | {"scores_rule": None} == {"shape": ["batch", 7], "is": "class logits", "classes": 7, "labels": 7,
                                                       "problem_type": "multi_label_classification", "scores": "sigmoid",
                                                       "scores_rule": None}  # fmt: skip
    assert facts["preprocessing"]["mean"] == [0.1, 0.2, 0.3] and facts["recorded"]["parity"]["passed"]


def test_a_checkpoint_and_another_tools_graph(exported, tmp_path):
    _, ckpt, onnx_path = exported
    facts = info(ckpt, "--features-only", "--out-indices", "1", "--output-fmt", "NLC", "--feature-prefix-tokens")
    assert facts["runs_on"] == "pytorch" and facts["output"]["shape"] == ["batch", 1, 17, 64]
    assert facts["output"]["is"] == "feature maps (NLC, every token (prefix tokens first)) of blocks [1]" and "classes" not in facts["output"]
    foreign = tmp_path / "g.onnx"
    shutil.copy(onnx_path, foreign)  # no sidecar: another tool's graph
    facts = info(foreign)
    assert facts["made_by"].startswith("another tool") and "model" not in facts and "recorded" not in facts
    assert "no vitfast sidecar and no mean/std" in facts["preprocessing_missing"] and "mean" not in facts["preprocessing"]
    assert facts["graph"].startswith("input 'images' float32 [batch, 3, 32, 32]")
    assert info(foreign, "--mean", 0.5, 0.5, 0.5, "--std", 0.2, 0.2, 0.2)["preprocessing"]["std"] == [0.2, 0.2, 0.2]


def test_a_tensorrt_engine_without_tensorrt_is_described_from_its_sidecar(exported, tmp_path):
    from vitfast.export.artifacts import base_metadata, write_sidecar

    if importlib.util.find_spec("tensorrt"):
        pytest.skip("TensorRT is installed: it would try to load the made-up engine bytes")
    model, _, _ = exported
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"a serialized engine")
    write_sidecar(engine, base_metadata("tensorrt", model.config, "fp16", batch=(1, 4, 16), dynamic_batch=True))
    facts = info(engine)
    assert facts["runs_on"] is None and "TensorRT" in facts["not_loaded"] and facts["precision"] == "fp16" and facts["input"]["batch"] == [1, 4, 16]
    assert facts["output"]["scores"] == "sigmoid"
