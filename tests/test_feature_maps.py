"""Feature maps for dense prediction (timm's `features_only`; `--features-only`): the patch tokens of chosen
blocks, [B, n, C, gh, gw] or [B, n, gh * gw, C], checked against a truncated model's own forward, then through
checkpoints (head and later blocks pruned), export (fp32, fp16, int8), ONNX Runtime and OpenVINO, `check`,
`eval`'s refusal, a Triton repository, `serve`'s outputs, FLOPs and `inspect`. timm's FeatureGetterNet is the
reference in test_timm_parity.py, transformers' backbones in test_hf_parity.py."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import vitfast
from conftest import DINOV3, randomize, tiny_config
from vitfast.errors import ConfigError
from vitfast.flops import count_macs, count_params

VITFAST = Path(sys.executable).parent / "vitfast"
# 5 x 3 patches (an odd, non-square grid), 2 registers and a class token, 4 blocks
BASE = dict(img_size=(40, 24), reg_tokens=2, depth=4)
VARIANTS = {
    "plain-registers": tiny_config(**BASE),
    "distilled": tiny_config(distilled=True, depth=3),
    "layer-scale-avg-no-class-token": tiny_config(init_values=0.1, class_token=False, global_pool="avg", fc_norm=False, depth=3),
    "dinov3-rope": tiny_config(**DINOV3 | dict(depth=3)),
    "hybrid": vitfast.get_config("vit_small_r26_s32_224", img_size=64, depth=3, embed_dim=64, num_heads=2, num_classes=5),
}


def truncated_tokens(model: vitfast.VisionTransformer, x: torch.Tensor, block: int) -> torch.Tensor:
    """The tokens after `block` by another route: a model of block + 1 blocks and no final norm, same weights."""
    short = vitfast.create_model(model.config.replace(depth=block + 1, final_norm=False, fc_norm=None, num_classes=0))
    short.load_state_dict({k: v for k, v in model.state_dict().items() if k in short.state_dict()})
    return short.eval().forward_features(x)


@pytest.mark.parametrize("name, fmt", [(name, fmt) for fmt in ("NCHW", "NLC", "every-token") for name, cfg in VARIANTS.items()
                                       if fmt != "every-token" or cfg.num_prefix_tokens])  # every-token: NLC with the prefix tokens
def test_feature_maps_are_the_blocks_patch_tokens(name, fmt):
    cfg = VARIANTS[name]
    full = randomize(vitfast.create_model(cfg)).eval()
    blocks = (0, cfg.depth - 1)
    every = fmt == "every-token"
    feats = vitfast.create_model(cfg.replace(features_only=True, out_indices=(0, -1), output_fmt="NLC" if every else fmt, feature_norm=True,
                                             feature_prefix_tokens=every)).eval()  # fmt: skip
    feats.load_state_dict({k: v for k, v in full.state_dict().items() if k in feats.state_dict()})
    x = torch.randn(2, cfg.in_chans, *cfg.img_hw)
    gh, gw = cfg.grid_size
    with torch.no_grad():
        got = feats(x)
        assert got.shape == (2, *feats.config.output_shape)
        tokens = gh * gw + (cfg.num_prefix_tokens if every else 0)
        assert got.shape == ((2, 2, cfg.embed_dim, gh, gw) if fmt == "NCHW" else (2, 2, tokens, cfg.embed_dim))
        for i, block in enumerate(blocks):
            want = full.norm(truncated_tokens(full, x, block))[:, 0 if every else cfg.num_prefix_tokens :]  # feature_norm: the final norm
            if fmt == "NCHW":  # row-major over the grid: token r * gw + c is pixel row r, column c
                want = want.reshape(2, gh, gw, -1).permute(0, 3, 1, 2)
            torch.testing.assert_close(got[:, i], want, atol=1e-5, rtol=0)


def test_forward_intermediates_follows_timms_signature():
    cfg = tiny_config(**BASE)
    model = randomize(vitfast.create_model(cfg)).eval()
    x = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=2)
        assert [tuple(m.shape) for m in maps] == [(2, 64, 5, 3)] * 2
        torch.testing.assert_close(final, model.forward_features(x), atol=0, rtol=0)
        torch.testing.assert_close(maps[1].flatten(2).transpose(1, 2), truncated_tokens(model, x, 3)[:, 3:], atol=1e-5, rtol=0)
        paired = model.forward_intermediates(x, indices=[1], return_prefix_tokens=True, output_fmt="NLC", intermediates_only=True)
        (tokens, prefix), = paired
        torch.testing.assert_close(torch.cat([prefix, tokens], 1), truncated_tokens(model, x, 1), atol=1e-5, rtol=0)
        early, _ = model.forward_intermediates(x, indices=[1], stop_early=True)
        torch.testing.assert_close(early, model.norm(truncated_tokens(model, x, 1)), atol=1e-5, rtol=0)
    for bad in (0, 5, [4], [-5]):
        with pytest.raises(ValueError, match="last|block indices"):
            model.forward_intermediates(x, indices=bad)
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NHWC")


def test_config_describes_and_validates_feature_maps():
    cfg = tiny_config(depth=6, features_only=True)
    assert cfg.feature_indices == (3, 4, 5) and cfg.output_shape == (3, 64, 4, 4) and cfg.channel_axis == 2 and not cfg.classifies
    nlc = cfg.replace(out_indices=[-6, 2], output_fmt="NLC")
    assert nlc.out_indices == (-6, 2) and nlc.feature_indices == (0, 2) and nlc.output_shape == (2, 16, 64) and nlc.channel_axis == -1
    assert vitfast.ViTConfig.from_json(nlc.to_json()) == nlc
    assert cfg.replace(features_only=False) == tiny_config(depth=6)  # the feature settings go with it
    assert nlc.replace(features_only=False).out_indices == 3
    every = nlc.replace(feature_prefix_tokens=True, reg_tokens=2)  # class token, 2 registers, 16 patches
    assert every.output_shape == (2, 19, 64) and every.replace(dynamic_img_size=True).output_shape == (2, None, 64)
    assert vitfast.ViTConfig.from_json(every.to_json()) == every
    refusals = {
        "configure the feature maps of features_only=True": dict(out_indices=(1,)),
        "last 7 blocks; the model has 6": dict(features_only=True, out_indices=7),
        r"in \[-6, 5\]": dict(features_only=True, out_indices=(6,)),
        r"are blocks \[4, 1\]: .* block order.*e.g. \(1, 4\)": dict(features_only=True, out_indices=(-2, 1)),
        r"are blocks \[1, 1\]": dict(features_only=True, out_indices=(1, -5)),
        "output_fmt must be one of": dict(features_only=True, output_fmt="NHWC"),
        r"after pooling \(fc_norm\)": dict(features_only=True, feature_norm=True, global_pool="avg"),
        r"nowhere \(final_norm=False\)": dict(features_only=True, feature_norm=True, final_norm=False),
        "number of last blocks or a tuple": dict(features_only=True, out_indices=(1.0,)),
        r"needs output_fmt='NLC' \(this model has 'NCHW'\)": dict(features_only=True, feature_prefix_tokens=True),
        r"a model with such tokens \(this one has 0\)": dict(features_only=True, output_fmt="NLC", feature_prefix_tokens=True,
                                                              class_token=False, global_pool="avg", fc_norm=False),  # fmt: skip
    }
    for message, fields in refusals.items():
        with pytest.raises(ConfigError, match=message):
            tiny_config(depth=6, **fields)


def test_only_what_the_feature_maps_need_is_built_loaded_and_counted(tmp_path):
    """A full classifier's checkpoint loads into a features model: the head, the final norm and the blocks after
    the last index are left out (as timm's FeatureGetterNet prunes them); a misfit key is still reported."""
    cfg = tiny_config(depth=5, global_pool="map", class_token=False)
    full = randomize(vitfast.create_model(cfg)).eval()
    path = vitfast.save_checkpoint(full, tmp_path / "full.safetensors")
    feats = vitfast.load_checkpoint(path, overrides={"features_only": True, "out_indices": (1, 2)})
    assert len(feats.blocks) == 3 and not any(k.startswith(("head", "attn_pool", "norm.", "blocks.3")) for k in feats.state_dict())
    assert sum(p.numel() for p in feats.parameters()) == count_params(feats.config)
    short = tiny_config(depth=3, global_pool="avg", fc_norm=False, class_token=False, num_classes=0, final_norm=False)
    assert count_params(feats.config) == count_params(short) and count_macs(feats.config) == count_macs(short)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = truncated_tokens(full, x, 2).reshape(2, 4, 4, 64).permute(0, 3, 1, 2)
        torch.testing.assert_close(feats(x)[:, 1], want, atol=1e-5, rtol=0)
        again = vitfast.load_checkpoint(vitfast.save_checkpoint(feats, tmp_path / "feats.safetensors"))  # its own pruned file
        assert again.config == feats.config and torch.equal(again(x), feats(x))
    sd = {**full.state_dict(), "blocks.1.attn.qkv.weight": torch.zeros(3, 3)}
    torch.save(sd, tmp_path / "bad.pth")
    with pytest.raises(vitfast.CheckpointError, match=r"shape mismatch: blocks\.1\.attn\.qkv\.weight"):
        vitfast.load_checkpoint(tmp_path / "bad.pth", config=feats.config)


def test_parity_compares_feature_vectors_per_position():
    """`compare` reads the channels of NCHW maps on their own axis: one position's features flipped gives cosine -1."""
    from vitfast.parity import compare

    ref = torch.randn(2, 3, 16, 5, 4)
    out = ref.clone()
    out[1, 2, :, 3, 1] *= -1
    assert compare(out, ref, channel_axis=2)["cosine"] == pytest.approx(-1.0)
    assert compare(ref, ref, channel_axis=2)["passed"]


def test_inspect_draws_a_features_model_through_its_kept_blocks():
    from vitfast.inspect import inspect_model

    cfg = tiny_config(depth=4, class_token=False, global_pool="map")
    feats = randomize(vitfast.create_model(cfg.replace(features_only=True, out_indices=(1,))))
    got = inspect_model(feats, torch.randn(2, 3, 32, 32))
    assert got.source == "mean of patch tokens (the model returns the feature maps of blocks [1]; drawn through block 1)"
    assert got.rollout.shape == (2, 4, 4)


# ---------------------------------------------------------------- export, runtimes, CLI
onnx_tests = pytest.mark.skipif(
    not all(__import__("importlib").util.find_spec(m) for m in ("onnx", "onnxruntime")), reason="needs onnx and onnxruntime: pip install 'vitfast[onnx]'"
)


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(VITFAST), *map(str, args)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(model, fp32 ONNX path) of an NCHW features model with registers and an odd grid."""
    from vitfast.export import to_onnx

    torch.manual_seed(0)
    cfg = tiny_config(**BASE, features_only=True, out_indices=(1, 3), feature_norm=True)
    model = randomize(vitfast.create_model(cfg), scale=0.1).eval()
    return model, to_onnx(model, tmp_path_factory.mktemp("maps") / "maps.onnx", batch=(1, 4, 8))


@onnx_tests
def test_export_runs_feature_maps_in_every_cpu_runtime(exported, tmp_path):
    from vitfast.export import quantize_int8, read_sidecar, to_onnx

    model, fp32 = exported
    meta = read_sidecar(fp32)
    assert meta["output"]["shape"] == ["batch", 2, 64, 5, 3] and meta["parity"]["passed"]
    assert meta["config"]["features_only"] and meta["config"]["out_indices"] == [1, 3]
    x = torch.randn(3, 3, 40, 24)
    with torch.no_grad():
        ref = model(x)
    runs = [(fp32, "onnxruntime", 1e-4), (to_onnx(model, tmp_path / "m.fp16.onnx", precision="fp16"), "onnxruntime", 2e-2)]
    if __import__("importlib").util.find_spec("openvino"):
        runs.append((fp32, "openvino", 1e-4))
    for path, backend, limit in runs:
        got = vitfast.load_engine(path, backend=backend)(x)
        assert got.shape == ref.shape == (3, 2, 64, 5, 3)
        assert ((got - ref).abs().max() / ref.abs().max()).item() <= limit, (path.name, backend)
    int8 = quantize_int8(fp32, tmp_path / "m.int8.onnx", torch.randn(16, 3, 40, 24), samples=16, progress=False)
    assert read_sidecar(int8)["parity"]["cosine"] > 0.98  # the worst position's feature vector
    assert vitfast.load_engine(int8, backend="onnxruntime")(x).shape == ref.shape


@onnx_tests
def test_cli_exports_checks_and_refuses_to_eval_feature_maps(tmp_path):
    from vitfast.export import read_sidecar

    model = randomize(vitfast.create_model(tiny_config(depth=4)), scale=0.1)
    ckpt = vitfast.save_checkpoint(model, tmp_path / "m.safetensors")
    out = tmp_path / "maps.onnx"
    result = run("export", "--checkpoint", ckpt, "--features-only", "--out-indices", "1", "-1", "--output-fmt", "nlc", "--format", "onnx",
                 "--out", out)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert read_sidecar(out)["output"]["shape"] == ["batch", 2, 16, 64]
    check = run("check", out, "--json")  # the reference rebuilt from the sidecar's source and overrides
    assert check.returncode == 0 and '"passed": true' in check.stdout, check.stderr
    other = run("check", out, "--checkpoint", ckpt, "--features-only", "--out-indices", "0", "2", "--output-fmt", "NLC")
    assert other.returncode == 2 and "blocks [0, 2] vs [1, 3]" in other.stderr and "--out-indices" in other.stderr
    (tmp_path / "data" / "a").mkdir(parents=True)
    result = run("eval", out, "--data", tmp_path / "data")
    assert result.returncode == 2 and "returns feature maps (features_only)" in result.stderr
    result = run("export", "--checkpoint", ckpt, "--out-indices", "1", "--format", "onnx", "--out", tmp_path / "x.onnx")
    assert result.returncode == 2 and "set features_only=True" in result.stderr and not (tmp_path / "x.onnx").exists()
    every = tmp_path / "every.onnx"  # every token, the class token first (a DPT-style head's input)
    result = run("export", "--checkpoint", ckpt, "--features-only", "--out-indices", "1", "-1", "--output-fmt", "nlc",
                 "--feature-prefix-tokens", "--format", "onnx", "--out", every)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert read_sidecar(every)["output"]["shape"] == ["batch", 2, 17, 64] and read_sidecar(every)["config"]["feature_prefix_tokens"]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = torch.stack([truncated_tokens(model, x, b) for b in (1, 3)], dim=1)  # no --feature-norm: the blocks' own tokens
    got = vitfast.load_engine(every)(x)
    assert got.shape == want.shape and ((got - want).abs().max() / want.abs().max()).item() <= 1e-4
    check = run("check", every, "--checkpoint", ckpt, "--features-only", "--out-indices", "1", "-1", "--output-fmt", "NLC",
                "--feature-prefix-tokens", "--json")  # fmt: skip
    assert check.returncode == 0 and '"passed": true' in check.stdout, check.stderr


@onnx_tests
def test_triton_repository_and_serve_declare_the_feature_maps(exported, tmp_path):
    pb = pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="needs tritonclient[grpc]: pip install 'vitfast[serve]'")
    pytest.importorskip("pytriton", reason="needs PyTriton: pip install 'vitfast[serve]'")
    from google.protobuf import text_format
    from vitfast.export import triton_repository
    from vitfast.serve import _bind

    repo = triton_repository(exported[1], tmp_path / "repo")
    config = text_format.Parse((repo / "vit" / "config.pbtxt").read_text(), pb.ModelConfig())
    assert [(t.name, list(t.dims), t.label_filename) for t in config.output] == [("logits", [2, 64, 5, 3], "")]
    engine = vitfast.load_engine(exported[1], backend="onnxruntime")
    bound = []
    _bind(types.SimpleNamespace(bind=lambda **kw: bound.append(kw)), engine, "vit", 8, 100, 5, engine.config.labels)
    assert {tuple((t.name, t.shape) for t in b["outputs"]) for b in bound} == {(("logits", (2, 64, 5, 3)),)}
