"""Checkpoint round trips, format conversion from known tensors, position-embedding resizing
and every way a checkpoint can be bad."""

from __future__ import annotations

import argparse
import os
import re

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

import vitfast
from conftest import randomize, tiny_config
from vitfast import CheckpointError


def _marked_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A state dict where every tensor holds values unique to its key (key index * 1000 + position)."""
    return {
        k: (i * 1000 + torch.arange(v.numel(), dtype=torch.float32)).reshape(v.shape) / 1e4
        for i, (k, v) in enumerate(model.state_dict().items())
    }


# ---------------------------------------------------------------------------- round trips
def test_vitfast_save_load_is_exact(tmp_path):
    cfg = tiny_config(distilled=True, init_values=0.5, name="tiny-test")
    model = randomize(vitfast.create_model(cfg))
    path = vitfast.save_checkpoint(model, tmp_path / "sub" / "m.safetensors")
    assert os.listdir(tmp_path / "sub") == ["m.safetensors"]  # no temporary file left behind
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "vitfast" and vitfast.ViTConfig.from_json(meta["config"]) == cfg
    loaded = vitfast.load_checkpoint(path)
    assert loaded.config == cfg and not loaded.training
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_save_refuses_a_non_vitfast_model(tmp_path):
    with pytest.raises(vitfast.ConfigError, match="needs a vitfast model"):
        vitfast.save_checkpoint(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")


@pytest.mark.parametrize("suffix", [".pth", ".bin", ".safetensors"])
def test_timm_state_dict_lands_in_the_right_places(tmp_path, suffix):
    cfg = tiny_config(reg_tokens=1, init_values=1e-6)
    sd = _marked_state_dict(vitfast.create_model(cfg))
    path = tmp_path / f"timm{suffix}"
    save_file(sd, path) if suffix == ".safetensors" else torch.save(sd, path)
    loaded = vitfast.load_checkpoint(path, config=cfg)
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, sd[key]), key


def test_timm_config_is_inferred_from_shapes(tmp_path):
    cfg = vitfast.get_config("deit_small_distilled_patch16_224", depth=2, img_size=64, num_classes=4)
    torch.save(vitfast.create_model(cfg).state_dict(), tmp_path / "m.pth")
    with pytest.warns(UserWarning, match="head_dim 64 assumed"):  # depth 2 matches no registry entry
        inferred = vitfast.load_checkpoint(tmp_path / "m.pth").config
    for field in ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "distilled", "num_classes", "mlp_ratio"):
        assert getattr(inferred, field) == getattr(cfg, field), field


@pytest.mark.parametrize("wrap", ["model", "state_dict", "module-prefix"])
def test_training_checkpoint_wrappers_are_unwrapped(tmp_path, wrap):
    cfg = tiny_config()
    sd = _marked_state_dict(vitfast.create_model(cfg))
    obj = {"module." + k: v for k, v in sd.items()} if wrap == "module-prefix" else {wrap: sd, "epoch": 3}
    torch.save(obj, tmp_path / "ckpt.pth")
    loaded = vitfast.load_checkpoint(tmp_path / "ckpt.pth", config=cfg)
    assert torch.equal(loaded.pos_embed, sd["pos_embed"])


@pytest.mark.parametrize("ema_key", ["state_dict_ema", "model_ema"])
def test_training_checkpoint_with_ema_weights_loads_the_ema_as_timm_does_and_says_so(tmp_path, ema_key):
    """timm's train.py saves the weights ('state_dict', DDP's 'module.' names) and their EMA ('state_dict_ema'; 'model_ema'
    elsewhere); timm's load_checkpoint(use_ema=True), behind timm.create_model(checkpoint_path=...), loads the EMA. So
    does vitfast, saying so (with a config given too: that is no guess about the weights), and use_ema=False loads the
    trained ones. A vitfast save of the result holds those weights alone and does not repeat the note."""
    cfg = tiny_config()
    trained, ema = (randomize(vitfast.create_model(cfg)).state_dict() for _ in range(2))
    args = argparse.Namespace(model="vit_tiny_patch16_224", lr=5e-4, aa="rand-m9-mstd0.5")  # train.py keeps its arguments too
    torch.save({"epoch": 3, "state_dict": {"module." + k: v for k, v in trained.items()}, ema_key: ema, "args": args}, tmp_path / "ckpt.pth.tar")
    for config in (None, cfg):
        with pytest.warns(vitfast.GuessedConfigWarning, match=f"'state_dict' and its EMA '{ema_key}'; the EMA loaded.*use_ema=False"):
            loaded = vitfast.load_checkpoint(tmp_path / "ckpt.pth.tar", config=config, overrides={"num_heads": cfg.num_heads})
        assert all(torch.equal(loaded.state_dict()[k], v) for k, v in ema.items()) and "weights" in loaded.config_guesses
    plain = vitfast.load_checkpoint(tmp_path / "ckpt.pth.tar", config=cfg, use_ema=False)
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in trained.items()) and not plain.config_guesses
    vitfast.save_checkpoint(loaded, tmp_path / "ema.safetensors")
    assert "weights" not in vitfast.load_checkpoint(tmp_path / "ema.safetensors").config_guesses


def test_hf_names_are_converted_and_qkv_fused_in_order(tmp_path):
    """Hand-written HF-format state dict (transformers 4.x names): q, k, v rows stack in that order."""
    cfg = tiny_config(depth=1)
    C = cfg.embed_dim
    t = lambda *shape: torch.randn(*shape)  # noqa: E731
    hf = {
        "vit.embeddings.cls_token": t(1, 1, C),
        "vit.embeddings.position_embeddings": t(1, cfg.seq_len, C),
        "vit.embeddings.patch_embeddings.projection.weight": t(C, 3, 8, 8),
        "vit.embeddings.patch_embeddings.projection.bias": t(C),
        "vit.layernorm.weight": t(C), "vit.layernorm.bias": t(C),
        "classifier.weight": t(7, C), "classifier.bias": t(7),
    }  # fmt: skip
    layer = "vit.encoder.layer.0."
    for name, shape in {
        "attention.attention.query": (C, C), "attention.attention.key": (C, C), "attention.attention.value": (C, C),
        "attention.output.dense": (C, C), "intermediate.dense": (4 * C, C), "output.dense": (C, 4 * C),
        "layernorm_before": (C,), "layernorm_after": (C,),
    }.items():  # fmt: skip
        hf[layer + name + ".weight"] = t(*shape)
        hf[layer + name + ".bias"] = t(shape[0])
    save_file(hf, tmp_path / "model.safetensors")
    m = vitfast.load_checkpoint(tmp_path / "model.safetensors", config=cfg.replace(norm_eps=1e-12))
    qkv = m.blocks[0].attn.qkv.weight
    assert torch.equal(qkv[:C], hf[layer + "attention.attention.query.weight"])
    assert torch.equal(qkv[C : 2 * C], hf[layer + "attention.attention.key.weight"])
    assert torch.equal(qkv[2 * C :], hf[layer + "attention.attention.value.weight"])
    assert torch.equal(m.blocks[0].attn.qkv.bias[C : 2 * C], hf[layer + "attention.attention.key.bias"])
    assert torch.equal(m.blocks[0].mlp.fc2.weight, hf[layer + "output.dense.weight"])
    assert torch.equal(m.blocks[0].norm2.bias, hf[layer + "layernorm_after.bias"])
    assert torch.equal(m.head.weight, hf["classifier.weight"])


# ---------------------------------------------------------------------------- position embeddings
@pytest.mark.parametrize(
    "overrides, prefix",
    [(dict(), 1), (dict(distilled=True), 2), (dict(no_embed_class=True, init_values=0.1), 0), (dict(reg_tokens=2), 3)],
)
def test_pos_embed_resized_bicubic_with_prefix_tokens_kept(tmp_path, overrides, prefix):
    cfg = tiny_config(**overrides)
    model = randomize(vitfast.create_model(cfg))
    vitfast.save_checkpoint(model, tmp_path / "m.safetensors")
    big = vitfast.load_checkpoint(tmp_path / "m.safetensors", img_size=56)
    assert big.config.img_size == 56 and big.config.grid_size == (7, 7)
    old = model.pos_embed.detach()
    grid = old[:, prefix:].reshape(1, 4, 4, -1).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(7, 7), mode="bicubic", align_corners=False, antialias=True)
    expected = torch.cat([old[:, :prefix], expected.permute(0, 2, 3, 1).reshape(1, 49, -1)], 1)
    torch.testing.assert_close(big.pos_embed.detach(), expected)
    with torch.no_grad():
        assert big(torch.randn(2, 3, 56, 56)).shape == (2, cfg.num_classes)


def test_pos_embed_resized_for_a_config_with_another_grid(tmp_path):
    cfg = tiny_config()
    torch.save(vitfast.create_model(cfg).state_dict(), tmp_path / "m.pth")
    model = vitfast.load_checkpoint(tmp_path / "m.pth", config=cfg.replace(img_size=(32, 64)))
    assert model.pos_embed.shape == (1, 1 + 4 * 8, 64)


# ---------------------------------------------------------------------------- bad checkpoints
def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        vitfast.load_checkpoint(tmp_path / "nope.pth")


def test_empty_file(tmp_path):
    (tmp_path / "empty.pth").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty or truncated"):
        vitfast.load_checkpoint(tmp_path / "empty.pth")


def test_garbage_bytes(tmp_path):
    (tmp_path / "junk.bin").write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        vitfast.load_checkpoint(tmp_path / "junk.bin")


def test_an_image_given_as_the_checkpoint_is_named_as_one(tmp_path):
    """`vitfast predict photo.png model.onnx`, the arguments swapped: said, not "truncated or corrupt: re-download"."""
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "photo.png")
    with pytest.raises(CheckpointError, match="photo.png is an image, not a model checkpoint"):
        vitfast.load_checkpoint(tmp_path / "photo.png")


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_truncated_file(tmp_path, fmt):
    model = vitfast.create_model(tiny_config())
    path = tmp_path / f"m.{fmt}"
    vitfast.save_checkpoint(model, path) if fmt == "safetensors" else torch.save(model.state_dict(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        vitfast.load_checkpoint(path)



def test_safetensors_whose_header_length_starts_like_a_pickle_keeps_its_config(tmp_path):
    """A safetensors file's first byte is its header length's low byte: 0x80, as in a legacy pickle,
    for one header size in 256. Sent to torch.load, its metadata (vitfast's config) was lost and the config guessed
    from the shapes (torch 2.13), or the file refused as pickled code (torch 2.11)."""
    cfg = tiny_config()
    path = tmp_path / "model.safetensors"
    for pad in range(512):  # the header length moves in steps of 8 with the metadata's length
        labels = ("x" * pad,) + tuple(f"class {i}" for i in range(1, cfg.num_classes))
        model = randomize(vitfast.create_model(cfg.replace(labels=labels)))
        vitfast.save_checkpoint(model, path)
        if path.read_bytes()[0] == 0x80:
            break
    else:
        pytest.fail("no header length with low byte 0x80 in 512 paddings")
    restored = vitfast.load_checkpoint(path)
    assert restored.config == model.config and restored.config.labels == labels and restored.config_guesses == {}
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in model.state_dict().items())


def test_legacy_pickle_checkpoint_still_loads(tmp_path):
    """torch.save's pre-1.6 format (first byte 0x80) still goes through torch.load(weights_only=True)."""
    model = vitfast.create_model(tiny_config())
    torch.save(model.state_dict(), tmp_path / "old.pth", _use_new_zipfile_serialization=False)
    assert (tmp_path / "old.pth").read_bytes()[:1] == b"\x80"
    restored = vitfast.load_checkpoint(tmp_path / "old.pth", config=model.config)
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in model.state_dict().items())

class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # would create the marker file if ever unpickled


def test_pickle_that_runs_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    sd = vitfast.create_model(tiny_config()).state_dict()
    torch.save({"state_dict": sd, "payload": _Exploit(str(marker))}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError, match="never executes pickled code"):
        vitfast.load_checkpoint(tmp_path / "evil.pth")
    assert not marker.exists()


def test_other_architecture_is_named(tmp_path):
    resnet_like = {"conv1.weight": torch.zeros(64, 3, 7, 7), "bn1.weight": torch.zeros(64), "fc.weight": torch.zeros(10, 64)}
    torch.save(resnet_like, tmp_path / "resnet.pth")
    with pytest.raises(CheckpointError, match=r"not a Vision Transformer.*conv1\.weight"):
        vitfast.load_checkpoint(tmp_path / "resnet.pth")


def test_mismatch_lists_missing_unexpected_and_shapes(tmp_path):
    cfg = tiny_config()
    sd = vitfast.create_model(cfg).state_dict()
    del sd["blocks.1.norm2.bias"]
    sd["blocks.0.attn.extra.weight"] = torch.ones(16)
    torch.save(sd, tmp_path / "m.pth")
    with pytest.raises(CheckpointError) as err:
        vitfast.load_checkpoint(tmp_path / "m.pth", config=cfg.replace(num_classes=5))
    msg = str(err.value)
    assert "1 missing: blocks.1.norm2.bias" in msg
    assert "1 unexpected: blocks.0.attn.extra.weight" in msg
    assert "head.weight (checkpoint [7, 64] vs model [5, 64])" in msg
    assert "If the config given is not this checkpoint's, pass its own, or none" in msg


@pytest.mark.parametrize("drop", ["blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.weight"])
def test_a_truncated_mlp_is_named_not_a_key_error(tmp_path, drop):
    """The MLP's kind and width are read off block 0's Linears: without one of them, the key is named."""
    sd = vitfast.create_model(tiny_config()).state_dict()
    torch.save({k: v for k, v in sd.items() if k != drop}, tmp_path / "m.pth")
    with pytest.raises(CheckpointError, match=rf"lacks {re.escape(drop)}, so its MLP cannot be read: .*truncated"):
        vitfast.load_checkpoint(tmp_path / "m.pth")


@pytest.mark.parametrize("overrides", [None, {"num_heads": 4}])
def test_a_mismatch_of_a_config_read_from_the_checkpoint_says_what_would_help(tmp_path, overrides):
    """A config read from the checkpoint (overrides that do not reshape the model included) fits the keys it was
    read from; what is missing or extra is the file's, so no config is suggested."""
    sd = vitfast.create_model(tiny_config()).state_dict()
    del sd["blocks.1.norm2.bias"]
    torch.save(sd | {"decoder_pred.weight": torch.ones(4)}, tmp_path / "m.pth")
    with pytest.raises(CheckpointError) as err:
        vitfast.load_checkpoint(tmp_path / "m.pth", overrides=overrides)
    msg = str(err.value)
    assert "1 missing: blocks.1.norm2.bias; 1 unexpected: decoder_pred.weight." in msg
    assert "truncated or partial: re-download or re-save it" in msg and "save the state dict without them" in msg
    assert "config" not in msg.split("decoder_pred.weight.")[1]


def test_hf_directory_problems(tmp_path):
    (tmp_path / "noconfig").mkdir()
    with pytest.raises(CheckpointError, match="without config.json"):
        vitfast.load_checkpoint(tmp_path / "noconfig")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text('{"model_type": "vit"}')
    with pytest.raises(CheckpointError, match="no model.safetensors or pytorch_model.bin"):
        vitfast.load_checkpoint(tmp_path / "noweights")


def _renamed(sd, old, new):
    return {k.replace(old, new): v for k, v in sd.items()}


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda sd: _renamed(sd, "blocks.0.attn.", "blocks.0.attns.0.attn."), "ParallelThingsBlock"),
        (lambda sd: sd | {"blocks.0.in_proj.weight": torch.zeros(8, 64)}, "ParallelScalingBlock"),
        (lambda sd: sd | {"blocks.0.attn.lambda_q1": torch.zeros(16)}, "differential attention"),
        (lambda sd: sd | {"blocks.0.attn.q_norm.weight": torch.ones(16)}, "qk_norm"),
        (lambda sd: sd | {"blocks.0.attn.relative_position_bias_table": torch.zeros(9, 4)}, "relative position biases"),
        (lambda sd: _renamed(sd, "ls1.gamma", "gamma_1"), "gamma_1"),
        # a pre-norm tower with an attention pool and no final norm: like no Perception Encoder tower (core has a final norm,
        # spatial no pool), whose rotary positions no key would show
        (lambda sd: _renamed(sd, "norm.", "norm_pre.") | {"attn_pool.latent": torch.zeros(1, 1, 64)}, "an attention pool without a final norm"),
    ],
)
@pytest.mark.parametrize("given", [False, True])
def test_block_structures_vitfast_does_not_implement_are_named(tmp_path, edit, named, given):
    """A timm state dict of a model vitfast's blocks cannot hold (parallel blocks, qk-norm, BEiT/EVA
    layers, ...) stops with what it has, not a KeyError or a list of unexpected keys."""
    cfg = tiny_config(init_values=0.1)
    torch.save(edit(vitfast.create_model(cfg).state_dict()), tmp_path / "m.pth")
    with pytest.raises(CheckpointError, match=rf"blocks have .*{named}.*does not implement"):
        vitfast.load_checkpoint(tmp_path / "m.pth", config=cfg if given else None)


@pytest.mark.parametrize("fields", [dict(), dict(global_pool="avg")], ids=["norm", "fc-norm"])
def test_pre_norm_towers_with_a_final_norm_are_not_taken_for_perception_encoder(tmp_path, fields):
    """The Perception Encoder refusal keys on a pre-norm tower with no final norm at all: a CLIP-like tower whose
    final norm follows the pooling (fc_norm) loads, to its own outputs."""
    model = randomize(vitfast.create_model(tiny_config(pre_norm=True, norm_eps=1e-5, **fields)))
    torch.save(model.state_dict(), tmp_path / "m.pth")
    with pytest.warns(vitfast.GuessedConfigWarning):
        loaded = vitfast.load_checkpoint(tmp_path / "m.pth", overrides={"num_heads": 4})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)


# ---------------------------------------------------------------------------- heads changed by overrides
@pytest.mark.parametrize(
    "cfg, overrides, expected",
    [
        (tiny_config(), {"num_classes": 0}, lambda m, t: t[:, 0]),
        (tiny_config(distilled=True), {"num_classes": 0}, lambda m, t: (t[:, 0] + t[:, 1]) / 2),
        (tiny_config(reg_tokens=2), {"global_pool": ""}, lambda m, t: m.head(t)),  # the trained head on every token
        (tiny_config(), {"num_classes": 0, "global_pool": "avg"}, lambda m, t: t[:, 1:].mean(1)),  # norm stays before the pool
        (tiny_config(class_token=False, global_pool="avg"), {"num_classes": 0, "global_pool": ""}, lambda m, t: m.fc_norm(t)),
        (tiny_config(class_token=False, global_pool="map"), {"num_classes": 0, "global_pool": ""}, lambda m, t: t),
        (tiny_config(global_pool="token_avg"), {"num_classes": 0, "global_pool": "token"}, lambda m, t: t[:, 0]),
    ],
    ids=["drop-head", "drop-both-distilled-heads", "per-token-head", "avg-keeps-final-norm", "fc-norm-kept-per-token",
         "map-pool-dropped", "token-avg-to-token"],
)  # fmt: skip
def test_overrides_reset_the_head_as_timms_reset_classifier(tmp_path, cfg, overrides, expected):
    """num_classes=0 drops the classifier(s), a pool other than "map" drops the attention pool, and the final
    norm stays where the checkpoint has it (before pooling, or per token as fc_norm); the output is then the
    original model's tokens read that way, exactly."""
    model = randomize(vitfast.create_model(cfg)).eval()
    path = vitfast.save_checkpoint(model, tmp_path / "m.safetensors")
    loaded = vitfast.load_checkpoint(path, overrides=overrides)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = model.norm(model.blocks(model.norm_pre(model._pos_embed(model.patch_embed(x)))))
        want = expected(model, tokens)
        assert torch.equal(loaded(x), want)
    assert loaded.config.output_shape == want.shape[1:]


@pytest.mark.parametrize(
    "cfg, overrides, message",
    [
        (tiny_config(), {"num_classes": 3}, "7-class classifier; num_classes=3 would need a new, untrained one"),
        (tiny_config(), {"global_pool": "token_avg"}, r"reads 64 features \(global_pool='token'\); global_pool='token_avg' gives 128"),
        (tiny_config(global_pool="token_avg"), {"global_pool": ""}, "Pass num_classes=0 as well"),
    ],
)  # fmt: skip
def test_a_head_without_trained_weights_is_refused(tmp_path, cfg, overrides, message):
    path = vitfast.save_checkpoint(randomize(vitfast.create_model(cfg)), tmp_path / "m.safetensors")
    with pytest.raises(vitfast.ConfigError, match=message):
        vitfast.load_checkpoint(path, overrides=overrides)
