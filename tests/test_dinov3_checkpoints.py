"""DINOv3 weights in timm eva.py's and Meta's (facebookresearch/dinov3) layouts, written here from vitfast models:
each loads into the weights it came from, with the config it states and nothing else taken for granted. Parity
against timm's own models, and against timm's conversion of Meta's files, is in test_timm_parity.py."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import vitfast
from conftest import randomize, tiny_config

# 32 px images of 8 px patches, 64 wide, 4 heads: head_dim 16, so 4 rotary periods per axis
DINOV3 = dict(abs_pos_embed=False, rope="dinov3", rope_theta=100.0, reg_tokens=4, init_values=0.5, norm_eps=1e-5, global_pool="token", num_classes=0)
SWIGLU = dict(mlp_layer="swiglu", act_layer="silu", mlp_ratio=2.5)
META_GUESSES = {"img_size", "mean", "std", "crop_pct", "crop_mode", "interpolation", "norm_eps"}


def _source(config: vitfast.ViTConfig | None = None, **kw) -> vitfast.VisionTransformer:
    """A random vitfast DINOv3 (`config`, else a tiny one with `kw`) whose key bias is zero, as every DINOv3's is."""
    model = randomize(vitfast.create_model(config or tiny_config(**(DINOV3 | kw))))
    with torch.no_grad():
        for block in model.blocks:
            if block.attn.qkv.bias is not None:
                block.attn.qkv.bias[model.config.embed_dim : 2 * model.config.embed_dim] = 0
    return model


def _to_meta(model, *, key_bias: float = 3.0, mask: torch.Tensor | None = None, theta: float = 100.0) -> dict[str, torch.Tensor]:
    """Meta's layout of a vitfast DINOv3: registers as storage_tokens, SwiGLU as w1 / w2 / w3, the key's third of each qkv
    bias set to `key_bias` and a bias_mask (zeros there, unless `mask`) beside it; the rotary periods for `theta` in bf16
    (as the released files hold them), and the pieces Meta uses in training only (mask_token, local_cls_norm)."""
    dim = model.config.embed_dim
    sd: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        key = key.replace("reg_token", "storage_tokens")
        if model.config.mlp_layer == "swiglu":
            key = re.sub(r"mlp\.(fc1_g|fc1_x|fc2)\.", lambda m: f"mlp.{dict(fc1_g='w1', fc1_x='w2', fc2='w3')[m.group(1)]}.", key)
        if key.endswith("attn.qkv.bias"):
            value = value.clone()
            value[dim : 2 * dim] = key_bias
            sd[key + "_mask"] = mask if mask is not None else torch.cat([torch.ones(dim), torch.zeros(dim), torch.ones(dim)])
        sd[key] = value
    head_dim = model.config.head_dim
    sd["rope_embed.periods"] = (theta ** (torch.arange(head_dim // 4) * 4 / head_dim)).bfloat16()
    sd["mask_token"] = torch.randn(1, dim)
    sd["local_cls_norm.weight"], sd["local_cls_norm.bias"] = torch.randn(dim), torch.randn(dim)
    return sd


def _to_eva(model) -> dict[str, torch.Tensor]:
    """timm eva.py's layout of a vitfast DINOv3: gamma_1 / gamma_2, q_bias and v_bias apart (the zero key bias not saved)."""
    dim = model.config.embed_dim
    sd: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if key.endswith("attn.qkv.bias"):
            sd[key.replace("qkv.bias", "q_bias")], sd[key.replace("qkv.bias", "v_bias")] = value[:dim], value[2 * dim :]
        else:
            sd[re.sub(r"ls(\d)\.gamma$", r"gamma_\1", key)] = value
    return sd


def _assert_same_model(loaded, source) -> None:
    assert loaded.state_dict().keys() == source.state_dict().keys()
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    x = torch.randn(2, 3, *source.config.img_hw)
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))


# ---------------------------------------------------------------------------- Meta's layout
@pytest.mark.parametrize("kw", [dict(qkv_bias=True), dict(qkv_bias=True, **SWIGLU), dict(qkv_bias=False, **SWIGLU)],
                         ids=["vits16-like", "vits16plus-like", "vit7b16-like"])  # fmt: skip
def test_meta_checkpoint_loads_the_weights_it_came_from(tmp_path, kw):
    """Meta's .pth: the head count read off rope_embed.periods (head_dim / 4 of them), the class token as the output
    (Meta's forward), the key bias masked away; only the LayerNorm eps and the preprocessing are guessed."""
    source = _source(**kw)
    torch.save(_to_meta(source), tmp_path / "dinov3_vits16_pretrain_lvd1689m-08c60483.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match="Meta's README eval transform") as caught:
        loaded = vitfast.load_checkpoint(tmp_path / "dinov3_vits16_pretrain_lvd1689m-08c60483.pth", img_size=32)
    assert "layernormbf16" in str(caught[0].message)
    assert set(loaded.config_guesses) == META_GUESSES - {"img_size"}
    c = loaded.config
    assert (c.num_heads, c.rope, c.rope_theta, c.reg_tokens, c.global_pool, c.norm_eps) == (4, "dinov3", 100.0, 4, "token", 1e-5)
    assert (c.img_size, c.crop_mode, c.interpolation) == (32, "squash", "bilinear")
    assert loaded.config == source.config.replace(init_values=1e-5, fc_norm=False, crop_mode="squash", crop_pct=1.0, interpolation="bilinear",
                                                  mean=vitfast.config.IMAGENET_MEAN, std=vitfast.config.IMAGENET_STD)  # fmt: skip
    _assert_same_model(loaded, source)


def test_meta_bias_mask_is_applied_as_it_stands():
    """qkv.bias * bias_mask, whatever the mask: the released masks zero the key's third; a mask of ones keeps it."""
    from vitfast.dinov3 import meta_to_timm

    source = _source(qkv_bias=True)
    dim = source.config.embed_dim
    masked = meta_to_timm(_to_meta(source, key_bias=3.0))["blocks.0.attn.qkv.bias"]
    assert torch.equal(masked, source.state_dict()["blocks.0.attn.qkv.bias"]) and not masked[dim : 2 * dim].any()
    kept = meta_to_timm(_to_meta(source, key_bias=3.0, mask=torch.ones(3 * dim)))["blocks.0.attn.qkv.bias"]
    assert (kept[dim : 2 * dim] == 3.0).all()


def test_meta_rotary_periods_are_checked_not_used(tmp_path):
    """The saved periods (bf16) must be rope_theta's schedule; the model computes its own in fp32. Another base is
    refused unless the config given says it; a head count that contradicts the periods is refused."""
    source = _source(qkv_bias=True, rope_theta=10.0)
    torch.save(_to_meta(source, theta=10.0), tmp_path / "m.pth")
    with pytest.raises(vitfast.CheckpointError, match=r"rope_embed.periods \(1, 1\.78.*not rope_theta .* for rope_theta=100"):
        vitfast.load_checkpoint(tmp_path / "m.pth")
    _assert_same_model(vitfast.load_checkpoint(tmp_path / "m.pth", config=source.config), source)
    with pytest.raises(vitfast.CheckpointError, match="so head_dim 16 and 4 heads; the 2 heads asked for contradict it"):
        vitfast.load_checkpoint(tmp_path / "m.pth", overrides={"num_heads": 2})
    with pytest.raises(vitfast.CheckpointError, match="head_dim 16 .*the config given has rope='dinov3', head_dim 32"):
        vitfast.load_checkpoint(tmp_path / "m.pth", config=source.config.replace(num_heads=2))


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda sd: sd | {"cls_norm.weight": torch.ones(64), "cls_norm.bias": torch.zeros(64)}, "cls_norm: Meta's untie_cls_and_patch_norms"),
        (lambda sd: {k.replace("attn.qkv.", "attn.wq."): v for k, v in sd.items()}, "no fused blocks.N.attn.qkv"),
        (lambda sd: {k: v for k, v in sd.items() if k != "rope_embed.periods"}, "no rope_embed.periods"),
    ],
    ids=["untied-class-token-norm", "sapiens2-like-q-k-v-apart", "no-periods"],
)
def test_meta_checkpoints_vitfast_cannot_compute_are_refused_by_name(tmp_path, change, named):
    torch.save(change(_to_meta(_source(qkv_bias=True))), tmp_path / "m.pth")
    with pytest.raises(vitfast.CheckpointError, match=named):
        vitfast.load_checkpoint(tmp_path / "m.pth")


def test_meta_checkpoint_with_a_config_without_rotary_positions_is_refused(tmp_path):
    torch.save(_to_meta(_source(qkv_bias=True)), tmp_path / "m.pth")
    with pytest.raises(vitfast.CheckpointError, match="Meta's DINOv3, with rotary positions .*rope=None"):
        vitfast.load_checkpoint(tmp_path / "m.pth", config=tiny_config(reg_tokens=4, init_values=0.5, num_classes=0))


# ---------------------------------------------------------------------------- timm eva.py's layout
@pytest.mark.parametrize("kw", [dict(qkv_bias=True), dict(qkv_bias=False, **SWIGLU)], ids=["qkvb", "swiglu-no-qkv-bias"])
def test_bare_timm_eva_dinov3_loads_the_weights_it_came_from_and_names_its_guesses(tmp_path, kw):
    """eva.py's keys (gamma_1, q_bias / v_bias) with a class token, registers and no learned position embeddings are a
    DINOv3's: renamed, the key bias zeros, the config read off the shapes on timm's DINOv3 defaults, each one said."""
    source = _source(**kw)
    torch.save(_to_eva(source), tmp_path / "model.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"num_heads=1 .*head_dim 64 assumed.*global_pool='avg' \(.*LingBot"):
        guessed = vitfast.load_checkpoint(tmp_path / "model.pth")
    assert {"num_heads", "norm_eps", "rope_theta", "img_size", "global_pool", "mean"} <= set(guessed.config_guesses)
    assert (guessed.config.img_size, guessed.config.global_pool, guessed.config.fc_norm) == (256, "avg", False)
    with pytest.warns(vitfast.GuessedConfigWarning):
        loaded = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=32, overrides={"num_heads": 4, "global_pool": "token"})
    assert "num_heads" not in loaded.config_guesses and "global_pool" not in loaded.config_guesses
    _assert_same_model(loaded, source)
    _assert_same_model(vitfast.load_checkpoint(tmp_path / "model.pth", config=source.config), source)


@pytest.mark.parametrize(
    "change, refusal, with_config",
    [  # PE: learned positions too. Given a DINOv3 config the keys are renamed, then do not fit it
        (lambda sd: sd | {"pos_embed": torch.zeros(1, 16, 64)}, "gamma_1 .*of eva.py's, vitfast reads DINOv3, EVA-02", "does not fit the model"),
        (lambda sd: sd | {"rope.freqs": torch.zeros(2, 4, 8)}, "learned rotary frequencies", "learned rotary frequencies"),  # *_rope_mixed_*
    ],
    ids=["learned-positions", "saved-rope-freqs"],
)
def test_eva_weights_of_another_rotary_form_are_refused_even_when_the_config_says_dinov3(tmp_path, change, refusal, with_config):
    """eva.py's other rotary ViTs compute other positions: their keys never load as a DINOv3's (they would, with the
    same shapes, and answer something else), not even when the caller's config says rope 'dinov3'."""
    source = _source(qkv_bias=True)
    torch.save(change(_to_eva(source)), tmp_path / "model.pth")
    with pytest.raises(vitfast.CheckpointError, match=refusal):
        vitfast.load_checkpoint(tmp_path / "model.pth")
    with pytest.raises(vitfast.CheckpointError, match=with_config):
        vitfast.load_checkpoint(tmp_path / "model.pth", config=source.config)


@pytest.mark.parametrize(
    "drop, family",
    [("cls_token", "axial, base 10000, patch indices scaled to a 16x16 grid, y's"), ("reg_token", "axial, base 100, patch indices unscaled, x's")],
    ids=["no-class-token-is-sbb-rope", "no-registers-is-naver-rope-vit"],
)
def test_eva_weights_without_a_class_token_or_registers_read_as_the_axial_rope_vits_not_dinov3(tmp_path, drop, family):
    """A DINOv3's eva.py keys less its class token are timm's sbb RoPE ViT's, less its registers Naver's RoPE-ViT's: they
    load as those (their rotary form said), never as a DINOv3, whose rotary positions differ."""
    source = _source(qkv_bias=True)
    torch.save({k: v for k, v in _to_eva(source).items() if k != drop}, tmp_path / "model.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=rf"assumed: {family}"):
        loaded = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=32)
    assert (loaded.config.rope, loaded.config.class_token, loaded.config.reg_tokens > 0) == ("axial", drop != "cls_token", drop != "reg_token")


def test_dinov3_weights_in_vitfast_names_need_the_rope_said(tmp_path):
    """A DINOv3 state dict saved in vitfast's names (no pos_embed) cannot say its positions are rotary: a clear error,
    and {"rope": "dinov3"} (what --config FILE.json passes) reads it as one."""
    source = _source(qkv_bias=True)
    torch.save(source.state_dict(), tmp_path / "model.pth")
    with pytest.raises(vitfast.CheckpointError, match=r'no learned position embeddings .*\{"rope": "dinov3"\} \(a DINOv3\) .*in --config'):
        vitfast.load_checkpoint(tmp_path / "model.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match="rope_theta=100.0"):
        loaded = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=32, overrides={"rope": "dinov3", "num_heads": 4, "global_pool": "token"})
    _assert_same_model(loaded, source)


def test_timm_hub_folder_of_a_registered_dinov3_states_everything(tmp_path):
    """A save_for_hf folder (config.json with the architecture) of timm's eva.py DINOv3: the architecture says what
    the weights cannot, so nothing is guessed."""
    import json

    source = _source(vitfast.get_config("vit_small_patch16_dinov3_qkvb", depth=2))
    torch.save(_to_eva(source), tmp_path / "pytorch_model.bin")
    pretrained = {"input_size": [3, 256, 256], "interpolation": "bicubic", "crop_pct": 1.0, "crop_mode": "center",
                  "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "num_classes": 0}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_small_patch16_dinov3_qkvb", "num_classes": 0,
                                                      "model_args": {"depth": 2, "global_pool": "avg"}, "pretrained_cfg": pretrained}))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)
        loaded = vitfast.load_checkpoint(tmp_path)
    assert loaded.config == source.config
    _assert_same_model(loaded, source)
