"""Unpooled models (global_pool="", timm's name; `--global-pool none`): every token out, [B, T, features],
through export (fp32, fp16, int8), ONNX Runtime and OpenVINO, the sidecar's graph check, `check`, a Triton
repository and `vitfast serve`'s outputs; `eval` refuses them with the reason."""

from __future__ import annotations

import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="token-output tests export ONNX: pip install 'vitfast[export]'")

import vitfast  # noqa: E402
from conftest import randomize, tiny_config  # noqa: E402
from vitfast.errors import ArtifactError  # noqa: E402
from vitfast.export import quantize_int8, read_sidecar, to_onnx  # noqa: E402
from vitfast.export.artifacts import write_sidecar  # noqa: E402
from vitfast.flops import count_macs  # noqa: E402

VITFAST = Path(sys.executable).parent / "vitfast"
FEATURES = tiny_config(global_pool="", num_classes=0, reg_tokens=2, img_size=(40, 24))  # T = 1 + 2 + 5 * 3 = 18 tokens
PER_TOKEN_HEAD = tiny_config(global_pool="", labels=tuple("abcdefg"))


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(VITFAST), *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{name: (model, fp32 path)} for unpooled features and an unpooled per-token classifier."""
    root = tmp_path_factory.mktemp("tokens")
    out = {}
    for name, cfg in (("features", FEATURES), ("per_token_head", PER_TOKEN_HEAD)):
        torch.manual_seed(0)
        model = randomize(vitfast.create_model(cfg), scale=0.1).eval()
        out[name] = (model, to_onnx(model, root / f"{name}.onnx", batch=(1, 4, 8)))
    return out


@pytest.mark.parametrize("name", ["features", "per_token_head"])
def test_export_records_the_token_shape_and_runs_with_parity(exported, name, tmp_path):
    model, fp32 = exported[name]
    cfg = model.config
    meta = read_sidecar(fp32)
    assert meta["output"]["shape"] == ["batch", cfg.seq_len, cfg.num_classes or cfg.embed_dim]
    assert meta["parity"]["passed"]
    fp16 = to_onnx(model, tmp_path / "m.fp16.onnx", precision="fp16")
    x = torch.randn(3, 3, *cfg.img_hw)
    with torch.no_grad():
        ref = model(x)
    for path, limit in ((fp32, 1e-4), (fp16, 2e-2)):
        got = vitfast.load_engine(path, backend="onnxruntime")(x)
        assert got.shape == ref.shape == (3, *cfg.output_shape)
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= limit, path.name


def test_int8_and_openvino_run_unpooled_graphs(exported, tmp_path):
    pytest.importorskip("openvino", reason="needs openvino: pip install 'vitfast[openvino]'")
    model, fp32 = exported["features"]
    x = torch.randn(3, 3, *model.config.img_hw)
    with torch.no_grad():
        ref = model(x)
    got = vitfast.load_engine(fp32, backend="openvino")(x)
    assert got.shape == ref.shape and ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4
    int8 = quantize_int8(fp32, tmp_path / "f.int8.onnx", torch.randn(16, 3, *model.config.img_hw), samples=16, progress=False)
    meta = read_sidecar(int8)
    assert meta["output"]["shape"] == ["batch", 18, 64] and meta["parity"]["cosine"] > 0.98  # worst token's cosine
    assert vitfast.load_engine(int8, backend="onnxruntime")(x).shape == ref.shape


def test_a_sidecar_that_disagrees_with_the_graphs_rank_is_refused(exported, tmp_path):
    """A pooled sidecar beside an unpooled graph (and the other way round) names both shapes."""
    for name in ("features", "per_token_head"):
        graph = tmp_path / f"{name}.onnx"
        graph.write_bytes(exported[name][1].read_bytes())
        meta = read_sidecar(exported[name][1])
        pooled = vitfast.ViTConfig.from_dict(meta["config"]).replace(global_pool="token")
        write_sidecar(graph, meta | {"config": pooled.to_dict()})
        with pytest.raises(ArtifactError, match=r"does not match its sidecar.*the sidecar says \[B, (64|7)\]"):
            vitfast.load_engine(graph, backend="onnxruntime")
    # a pooled graph of 17 classes and an unpooled sidecar of 17 tokens x 17: the axes that exist agree, the count does not
    pooled = to_onnx(vitfast.create_model(tiny_config(num_classes=17)), tmp_path / "pooled.onnx")
    meta = read_sidecar(pooled)
    write_sidecar(pooled, meta | {"config": vitfast.ViTConfig.from_dict(meta["config"]).replace(global_pool="").to_dict()})
    with pytest.raises(ArtifactError, match=r"the graph outputs \[\('logits', \['batch', 17\]\)\], the sidecar says \[B, 17, 17\]"):
        vitfast.load_engine(pooled, backend="onnxruntime")


def test_cli_export_check_and_eval_of_features(tmp_path):
    """`--num-classes 0 --global-pool none` on a classifier checkpoint: the tokens out; check passes; eval refuses."""
    model = randomize(vitfast.create_model(tiny_config()), scale=0.1)
    ckpt = vitfast.save_checkpoint(model, tmp_path / "m.safetensors")
    out = tmp_path / "tokens.onnx"
    result = run("export", "--checkpoint", ckpt, "--num-classes", "0", "--global-pool", "none", "--format", "onnx", "--out", out)
    assert result.returncode == 0, result.stderr
    assert read_sidecar(out)["output"]["shape"] == ["batch", 17, 64]
    check = run("check", out, "--checkpoint", ckpt, "--num-classes", "0", "--global-pool", "none", "--json")
    assert check.returncode == 0 and '"passed": true' in check.stdout, check.stderr
    pooled = run("check", out, "--checkpoint", ckpt, "--json")  # the reference left pooled: a clear mismatch
    assert pooled.returncode == 2 and "output [B, 7] vs [B, 17, 64]" in pooled.stderr
    (tmp_path / "data" / "a").mkdir(parents=True)
    result = run("eval", out, "--data", tmp_path / "data")
    assert result.returncode == 2 and "returns every token (global_pool none)" in result.stderr


def test_triton_repository_declares_the_token_shape_and_no_labels(exported, tmp_path):
    pb = pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="needs tritonclient[grpc]: pip install 'vitfast[serve]'")
    from google.protobuf import text_format
    from vitfast.export import triton_repository

    repo = triton_repository(exported["per_token_head"][1], tmp_path / "repo")
    for model in ("vit", "vit_uint8"):
        config = text_format.Parse((repo / model / "config.pbtxt").read_text(), pb.ModelConfig())
        assert [(t.name, list(t.dims), t.label_filename) for t in config.output] == [("logits", [17, 7], "")]
    assert not (repo / "vit" / "labels.txt").exists()


def test_serve_answers_tokens_without_top_k(exported):
    pytest.importorskip("pytriton", reason="needs PyTriton: pip install 'vitfast[serve]'")
    from vitfast.serve import Predictor, _bind

    model, path = exported["per_token_head"]
    engine = vitfast.load_engine(path, backend="onnxruntime")
    bound = []
    triton = types.SimpleNamespace(bind=lambda **kw: bound.append(kw))
    _bind(triton, engine, "vit", 8, 100, 5, engine.config.labels)
    assert {tuple((t.name, t.shape) for t in b["outputs"]) for b in bound} == {(("logits", (17, 7)),)}
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    (response,) = Predictor(engine, 0, threading.Lock())([{"images": x}])
    assert list(response) == ["logits"]
    with torch.no_grad():
        np.testing.assert_allclose(response["logits"], model(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-4)


def test_flops_count_the_head_on_every_token():
    pooled, unpooled = count_macs(tiny_config()), count_macs(PER_TOKEN_HEAD)
    assert unpooled - pooled == (PER_TOKEN_HEAD.seq_len - 1) * 64 * 7


def test_a_foreign_unpooled_graph_runs_as_every_token_not_as_a_classifier(exported, tmp_path):
    """Without a vitfast sidecar, a graph whose one output is [batch, tokens, C] is every token (as
    `last_hidden_state` from Optimum would be), described by its patch Conv's grid plus its prefix tokens;
    never a classifier."""
    model, fp32 = exported["features"]
    graph = tmp_path / "bare.onnx"
    graph.write_bytes(fp32.read_bytes())
    engine = vitfast.load_engine(graph, backend="onnxruntime", overrides={"mean": model.config.mean, "std": model.config.std})
    assert engine.io.output == "tokens" and engine.io.patch == model.config.patch_size
    assert engine.config.output_shape == model.config.output_shape and not engine.config.classifies
    x = torch.randn(2, 3, *model.config.img_hw)
    with torch.no_grad():
        torch.testing.assert_close(engine(x), model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("class_token, pooled_like", [(True, "token"), (False, "avg")])
def test_inspect_draws_an_unpooled_model_from_its_class_token_else_the_patch_mean(class_token, pooled_like):
    from vitfast.inspect import inspect_model

    cfg = tiny_config(global_pool="", num_classes=0, class_token=class_token)
    model = randomize(vitfast.create_model(cfg))
    twin = vitfast.create_model(cfg.replace(global_pool=pooled_like, fc_norm=False))
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    got, want = inspect_model(model, x), inspect_model(twin, x)
    torch.testing.assert_close(got.rollout, want.rollout, atol=0, rtol=0)
    assert got.source == want.source + " (the model pools nothing: every token is an output)"
