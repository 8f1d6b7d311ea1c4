"""Parity against timm itself. timm needs torchvision, which `make test` does not install, so these
tests skip unless timm imports (`make test-timm` builds a venv where it does, see torchvision_cpu.py)."""

from __future__ import annotations

import copy
import warnings
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

import vitfast
from conftest import randomize
from torchvision_cpu import allow_import_without_extension
from vitfast.convert import timm_hub_config, timm_layout
from vitfast.foreign import config_file_fields

allow_import_without_extension()
timm = pytest.importorskip("timm", reason="timm is not importable here (it needs torchvision); run `make test-timm`")

ATOL = 1e-5

# (timm name, overrides that keep the model small but keep its structure)
VARIANTS = {
    "plain": ("vit_small_patch16_224", dict(img_size=64, depth=2, num_classes=5)),
    "deit-distilled": ("deit_tiny_distilled_patch16_224", dict(img_size=48, depth=2, num_classes=5)),
    "deit3-layerscale": ("deit3_small_patch16_224", dict(img_size=64, depth=2, num_classes=5)),
    "reg4-gap": ("vit_base_patch16_reg4_gap_256", dict(img_size=64, depth=2, num_classes=5)),
    "hybrid-r26": ("vit_small_r26_s32_224", dict(img_size=64, depth=2, num_classes=5)),
    "hybrid-r50": ("vit_base_r50_s16_224", dict(img_size=64, depth=1, num_classes=5)),
    "hybrid-r-ti-stem-only": ("vit_tiny_r_s16_p8_224", dict(img_size=64, depth=1, num_classes=5)),
    "clip": ("vit_base_patch16_clip_224", dict(img_size=64, depth=2, num_classes=5)),
    "clip-quickgelu": ("vit_base_patch32_clip_quickgelu_224", dict(img_size=64, depth=2, num_classes=7)),
    "dinov2-reg4": ("vit_small_patch14_reg4_dinov2", dict(img_size=56, depth=2, num_classes=5)),
    "dinov2-giant-swiglu": ("vit_giant_patch14_reg4_dinov2", dict(img_size=42, depth=2, num_classes=5, embed_dim=96, num_heads=4)),
    "siglip-map": ("vit_base_patch32_siglip_256", dict(img_size=64, depth=2, num_classes=5)),
    "siglip-gap": ("vit_base_patch16_siglip_gap_224", dict(img_size=64, depth=2, num_classes=0)),
    "siglip-so400m-384": ("vit_so400m_patch14_siglip_384", dict(img_size=44, depth=1, num_classes=0)),  # 3x3 patches of 14
    "sbb-reg1-gap": ("vit_little_patch16_reg1_gap_256", dict(img_size=64, depth=2, num_classes=5)),
    "sbb-gap-no-qkv-bias": ("vit_medium_patch16_gap_256", dict(img_size=64, depth=2, num_classes=5)),
    "so150m2-reg-in-pos-embed": ("vit_so150m2_patch16_reg1_gap_256", dict(img_size=64, depth=1, num_classes=5)),
    "so150m-reg4-map": ("vit_so150m_patch16_reg4_map_256", dict(img_size=64, depth=1, num_classes=5)),
    "eva-avg-with-class-token": ("eva_large_patch14_196", dict(img_size=56, depth=1, num_classes=5, embed_dim=128, num_heads=2)),
    "radio-no-final-norm": ("vit_base_patch16_radio_v3", dict(img_size=64, depth=2, num_classes=5)),
    "intern300m-no-final-norm": ("vit_intern300m_patch14_448", dict(img_size=56, depth=1, num_classes=5)),
    "aimv2-rmsnorm-swiglu": ("aimv2_large_patch14_224", dict(img_size=56, depth=2, num_classes=0, embed_dim=128, num_heads=2)),
    "aimv2-classifier": ("aimv2_huge_patch14_336", dict(img_size=42, depth=1, num_classes=5, embed_dim=96, num_heads=3)),
    "eva02-tiny-packed-swiglu": ("eva02_tiny_patch14_336", dict(img_size=56, depth=2, num_classes=5)),
    "eva02-base-mlp-norm": ("eva02_base_patch14_448", dict(img_size=70, depth=2, num_classes=5)),
    "eva02-clip-attn-norm": ("eva02_base_patch16_clip_224", dict(img_size=64, depth=2, num_classes=7)),
    "beit3-inner-norms": ("beit3_base_patch16_224", dict(img_size=64, depth=2, num_classes=5)),
    "sbb-rope-reg1": ("vit_medium_patch16_rope_reg1_gap_256", dict(img_size=64, depth=2, num_classes=5)),
    "sbb-rope-reg4-no-qkv-bias": ("vit_mediumd_patch16_rope_reg1_gap_256", dict(img_size=80, depth=2, num_classes=5)),
    "rope-vit-xy": ("vit_small_patch16_rope_224", dict(img_size=64, depth=2, num_classes=5)),
    "rope-vit-ape": ("vit_base_patch16_rope_ape_224", dict(img_size=48, depth=2, num_classes=5)),
    "pe-core-pool-reads-class-token": ("vit_pe_core_tiny_patch16_384", dict(img_size=64, depth=2, num_classes=5)),
    "pe-core-gigantic-narrow-pool-mlp": ("vit_pe_core_gigantic_patch14_448", dict(img_size=56, depth=1, num_classes=5, embed_dim=128,
                                                                                  num_heads=2, mlp_ratio=6.0)),
    "pe-spatial-no-final-norm": ("vit_pe_spatial_tiny_patch16_512", dict(img_size=64, depth=2, num_classes=5)),
    "pe-spatial-gigantic-layer-scale": ("vit_pe_spatial_gigantic_patch14_448", dict(img_size=56, depth=2, num_classes=0, embed_dim=128,
                                                                                    num_heads=2, mlp_ratio=6.0)),
}


def _timm_model(name, **kw):
    model = timm.create_model(name, pretrained=False, **kw).eval()
    return randomize(model, scale=0.05)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_timm_state_dict_matches(tmp_path, variant):
    name, kw = VARIANTS[variant]
    ref = _timm_model(name, **kw)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    ours = vitfast.load_checkpoint(tmp_path / "model.pth", config=vitfast.get_config(name, **kw))
    x = torch.randn(2, 3, kw["img_size"], kw["img_size"])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)
    key_bias = sum(p.numel() for n, p in ref.named_parameters() if n.endswith(("attn.q_bias", "attn.q_proj.bias")))  # eva.py has none
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters()) + key_bias


UNPOOLED = ["plain", "reg4-gap", "hybrid-r26", "clip", "dinov2-reg4", "siglip-map", "so150m-reg4-map", "radio-no-final-norm",
            "aimv2-classifier", "eva02-base-mlp-norm", "rope-vit-xy", "pe-core-pool-reads-class-token"]  # fmt: skip


@pytest.mark.parametrize("variant", UNPOOLED)
def test_unpooled_features_match_timms_reset_classifier(tmp_path, variant):
    """A classifier loaded with num_classes=0, global_pool="" equals timm's `reset_classifier(0, "")`: every
    token, the final norm where the model has it (fc_norm applied per token), attention pools dropped."""
    name, kw = VARIANTS[variant]
    ref = _timm_model(name, **kw)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    ours = vitfast.load_checkpoint(tmp_path / "model.pth", config=vitfast.get_config(name, **kw), overrides={"num_classes": 0, "global_pool": ""})
    ref.reset_classifier(0, "")
    x = torch.randn(2, 3, kw["img_size"], kw["img_size"])
    with torch.no_grad():
        expected = ref(x)
        torch.testing.assert_close(ours(x), expected, atol=ATOL, rtol=0)
    assert expected.shape[1:] == ours.config.output_shape


FEATURES = ["plain", "deit-distilled", "reg4-gap", "hybrid-r26", "clip", "dinov2-reg4", "siglip-map", "eva02-base-mlp-norm",
            "rope-vit-xy", "pe-core-pool-reads-class-token", "radio-no-final-norm", "aimv2-classifier"]  # fmt: skip


@pytest.mark.parametrize("variant", FEATURES)
@pytest.mark.parametrize("fmt", ["NCHW", "NLC"])
def test_feature_maps_match_timms_feature_getter(tmp_path, variant, fmt):
    """features_only equals timm's FeatureGetterNet (what `create_model(..., features_only=True)` builds for ViTs), with
    the final norm (norm=True) where the model has one before pooling, and the same parameters after pruning."""
    from timm.models._features import FeatureGetterNet

    name, kw = VARIANTS[variant]
    kw = kw | dict(depth=4)
    ref = _timm_model(name, **kw)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    cfg = vitfast.get_config(name, **kw)
    norm = cfg.final_norm and not cfg.use_fc_norm
    x = torch.randn(2, 3, kw["img_size"], kw["img_size"])
    for indices in ((1, -2), 3):
        feats = FeatureGetterNet(copy.deepcopy(ref), out_indices=indices, output_fmt=fmt, norm=norm).eval()
        ours = vitfast.load_checkpoint(tmp_path / "model.pth", config=cfg,
                                       overrides=dict(features_only=True, out_indices=indices, output_fmt=fmt, feature_norm=norm))  # fmt: skip
        with torch.no_grad():
            torch.testing.assert_close(ours(x), torch.stack(feats(x), dim=1), atol=ATOL, rtol=0)
        key_bias = sum(p.numel() for n, p in feats.named_parameters() if n.endswith(("attn.q_bias", "attn.q_proj.bias")))
        assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in feats.parameters()) + key_bias
    if fmt == "NLC" and cfg.num_prefix_tokens:  # every token: timm's prefix tokens (paired with each map) first
        every = vitfast.load_checkpoint(tmp_path / "model.pth", config=cfg, overrides=dict(
            features_only=True, out_indices=(1, -2), output_fmt="NLC", feature_norm=norm, feature_prefix_tokens=True))  # fmt: skip
        with torch.no_grad():
            pairs = ref.forward_intermediates(x, indices=[1, 2], norm=norm, output_fmt="NLC", return_prefix_tokens=True, intermediates_only=True)
            torch.testing.assert_close(every(x), torch.stack([torch.cat([prefix, tokens], 1) for tokens, prefix in pairs], 1), atol=ATOL, rtol=0)


DYNAMIC = ["plain", "deit-distilled", "deit3-layerscale", "reg4-gap", "hybrid-r26", "clip", "dinov2-reg4", "siglip-map",
           "aimv2-rmsnorm-swiglu", "eva02-base-mlp-norm", "sbb-rope-reg1", "rope-vit-xy", "rope-vit-ape", "pe-core-pool-reads-class-token"]  # fmt: skip


@pytest.mark.parametrize("variant", DYNAMIC)
def test_dynamic_img_size_matches_timm_at_every_grid(tmp_path, variant):
    """dynamic_img_size equals timm's (`create_model(..., dynamic_img_size=True)`) at its own size, smaller, larger and
    non-square inputs: position embeddings resized from img_size's grid (antialiased bicubic), rotary tables for the
    input's grid (EVA-02's scaled to its reference grid)."""
    name, kw = VARIANTS[variant]
    ref = _timm_model(name, dynamic_img_size=True, **kw)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    ours = vitfast.load_checkpoint(tmp_path / "model.pth", config=vitfast.get_config(name, **kw), overrides={"dynamic_img_size": True})
    p, size = ours.config.patch_size, kw["img_size"]
    for h, w in [(size, size), (2 * p, 3 * p), (size + 2 * p, size - p), (size + p, size + 3 * p)]:
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0, msg=f"{h}x{w}")


@pytest.mark.parametrize("variant", ["deit-distilled", "dinov2-reg4", "eva02-base-mlp-norm"])
def test_forward_intermediates_matches_timms(tmp_path, variant):
    """The whole signature: final tokens beside the maps, prefix tokens paired, stop_early, NLC."""
    name, kw = VARIANTS[variant]
    ref = _timm_model(name, **kw | dict(depth=3))
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    ours = vitfast.load_checkpoint(tmp_path / "model.pth", config=vitfast.get_config(name, **kw | dict(depth=3)))
    x = torch.randn(2, 3, kw["img_size"], kw["img_size"])
    calls = [dict(indices=[0, 2]), dict(indices=2, norm=True, output_fmt="NLC", return_prefix_tokens=True),
             dict(indices=[1], stop_early=True), dict(indices=None, intermediates_only=True)]  # fmt: skip
    with torch.no_grad():
        for kwargs in calls:
            torch.testing.assert_close(ours.forward_intermediates(x, **kwargs), ref.forward_intermediates(x, **kwargs), atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", ["plain", "clip", "rope-vit-xy"])
def test_unpooled_classifier_runs_its_head_on_every_token_as_timm_does(tmp_path, variant):
    name, kw = VARIANTS[variant]
    ref = _timm_model(name, **kw, global_pool="")
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    ours = vitfast.load_checkpoint(tmp_path / "model.pth", config=vitfast.get_config(name, **kw, global_pool=""))
    x = torch.randn(2, 3, kw["img_size"], kw["img_size"])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "variant",
    ["plain", "deit-distilled", "hybrid-r26", "clip", "dinov2-reg4", "siglip-gap", "sbb-gap-no-qkv-bias", "so150m2-reg-in-pos-embed",
     "eva-avg-with-class-token", "radio-no-final-norm", "intern300m-no-final-norm", "aimv2-rmsnorm-swiglu", "eva02-tiny-packed-swiglu",
     "eva02-base-mlp-norm", "eva02-clip-attn-norm", "beit3-inner-norms"],
)  # fmt: skip
def test_timm_config_inferred_from_shapes(tmp_path, variant):
    name, kw = VARIANTS[variant]
    ref = _timm_model(name, **kw)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "model.safetensors")
    ours = vitfast.load_checkpoint(tmp_path / "model.safetensors")
    x = torch.randn(2, 3, kw["img_size"], kw["img_size"])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


def test_rmsnorm_gelu_vit_reads_off_its_weights(tmp_path):
    """timm's test_vit4 (RMSNorm, GELU MLP with biases, register token, fc_norm): not a registered name,
    read off the weights' shapes (norms without a bias are RMSNorms) and equal to timm's."""
    ref = _timm_model("test_vit4", img_size=64, depth=2, num_classes=5, embed_dim=128, num_heads=2)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"norm_eps=1e-06 \(RMSNorm eps is not stored"):
        ours = vitfast.load_checkpoint(tmp_path / "model.pth")
    c = ours.config
    assert (c.norm_layer, c.mlp_layer, c.proj_bias, c.use_fc_norm, c.reg_tokens) == ("rmsnorm", "mlp", True, True, 1)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


def test_aimv2_hub_folder_loads_with_its_preprocessing(tmp_path):
    """A save_for_hf folder of timm's AIMv2: the registered architecture, OpenAI CLIP's normalisation
    and crop 1.0 from pretrained_cfg, outputs equal to timm's."""
    from timm.data import resolve_data_config
    from timm.models import save_for_hf

    ref = _timm_model("aimv2_large_patch14_224", depth=1)
    save_for_hf(ref, tmp_path)
    ours = vitfast.load_checkpoint(tmp_path)
    assert not ours.config_guesses
    c = ours.config
    assert (c.norm_layer, c.embed_norm, c.proj_bias, c.qkv_bias, c.mlp_layer, c.num_heads) == ("rmsnorm", True, False, False, "swiglu", 8)
    data = resolve_data_config(model=ref)
    assert (c.mean, c.std, c.crop_pct, c.interpolation) == (data["mean"], data["std"], data["crop_pct"], data["interpolation"])
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name, act", [("vit_base_patch32_siglip_256", "gelu_tanh"), ("vit_base_patch16_siglip_224", "gelu")])
def test_siglip_state_dict_takes_heads_and_gelu_form_from_the_registered_siglip_of_its_shapes(tmp_path, name, act):
    """A SigLIP state dict (attention pool, no class token) has the shapes of several registered
    towers: the head count and the GELU form (timm gives base/32 the tanh form, base/16 erf) come
    from the one of the same patch size, and both are reported as guesses."""
    ref = _timm_model(name, img_size=64)  # full depth: the registry is matched by width and depth
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=rf"num_heads=12 .*{name[:-4]}.*act_layer='{act}'"):
        ours = vitfast.load_checkpoint(tmp_path / "model.pth")
    c = ours.config
    assert (c.global_pool, c.class_token, c.act_layer, c.num_classes) == ("map", False, act, 0)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


def test_quickgelu_weights_need_and_take_the_act_layer_override(tmp_path):
    """A CLIP state dict cannot say whether it was trained with QuickGELU: the load says so, and
    overrides={"act_layer": "quick_gelu"} then matches timm's *_clip_quickgelu_* model."""
    name, kw = VARIANTS["clip-quickgelu"]
    ref = _timm_model(name, **kw)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match="act_layer='gelu'.*quick_gelu"):
        guessed = vitfast.load_checkpoint(tmp_path / "model.pth")
    assert guessed.config.pre_norm and guessed.config.norm_eps == 1e-5 and "act_layer" in guessed.config_guesses
    ours = vitfast.load_checkpoint(tmp_path / "model.pth", overrides={"act_layer": "quick_gelu"})
    x = torch.randn(2, 3, kw["img_size"], kw["img_size"])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)
        assert (guessed(x) - ref(x)).abs().max() > 100 * ATOL  # the guess is a different model


@pytest.mark.parametrize("variant", ["plain", "deit-distilled", "deit3-layerscale", "reg4-gap", "siglip-map"])
def test_pos_embed_resize_matches_timm(tmp_path, variant):
    """Loading at a new img_size resamples like timm's checkpoint filter (antialiased bicubic)."""
    from timm.models.vision_transformer import checkpoint_filter_fn

    name, kw = VARIANTS[variant]
    ref = _timm_model(name, **kw)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    big = dict(kw, img_size=kw["img_size"] + 32)
    ref_big = timm.create_model(name, pretrained=False, **big).eval()
    ref_big.load_state_dict(checkpoint_filter_fn(ref.state_dict(), ref_big))
    ours = vitfast.load_checkpoint(tmp_path / "model.pth", config=vitfast.get_config(name, **kw), img_size=big["img_size"])
    x = torch.randn(2, 3, big["img_size"], big["img_size"])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref_big(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "variant, img_size, data_config, safe",
    [
        ("plain", 64, None, True),
        ("plain", (48, 64), {"crop_pct": 0.95, "interpolation": "bilinear"}, True),
        ("deit-distilled", 48, {"crop_mode": "border", "interpolation": "bilinear", "crop_pct": 0.875}, False),
        ("reg4-gap", 64, None, True),
        ("hybrid-r50", 64, {"crop_mode": "squash", "crop_pct": 1.0}, True),
        ("clip-quickgelu", 64, None, True),
        ("dinov2-reg4", 56, None, True),
        ("siglip-map", 64, None, True),
        ("radio-no-final-norm", 64, None, True),
        ("eva02-base-mlp-norm", 98, None, True),
        ("eva02-clip-attn-norm", 64, None, True),
        ("beit3-inner-norms", 64, None, True),
        ("sbb-rope-reg1", (48, 80), None, True),
        ("rope-vit-xy", (80, 48), None, True),
        ("rope-vit-ape", 64, None, False),
        ("pe-core-pool-reads-class-token", (48, 80), None, True),
        ("pe-spatial-no-final-norm", (80, 48), None, True),
        ("pe-spatial-gigantic-layer-scale", 42, None, False),
    ],
)
def test_save_for_hf_folder_loads_as_timm_loads_it(tmp_path, variant, img_size, data_config, safe):
    """A folder written by timm's own save_for_hf: the model and its preprocessing equal timm's
    create_model("local-dir:...") and the transform timm resolves for it, nothing guessed."""
    from timm.data import create_transform, resolve_data_config
    from timm.models import save_for_hf

    name, kw = VARIANTS[variant]
    kw = dict(kw, img_size=img_size)
    save_for_hf(_timm_model(name, **kw), tmp_path, safe_serialization=safe, data_config=data_config)
    ref = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)
        ours = vitfast.load_checkpoint(tmp_path)
    x = torch.randn(2, 3, *ours.config.img_hw)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)
    transform = create_transform(**resolve_data_config(model=ref))
    rng = np.random.default_rng(zlib.crc32(repr((variant, img_size, data_config)).encode()))
    _assert_preprocess_matches(transform, ours.config, _random_images(rng, ours.config.img_hw))


def test_registry_matches_timm_architectures():
    """Every registered timm name builds the same parameter shapes (eva.py's DINOv3 in vitfast's names), MLP kind,
    activation, LayerNorm eps, pooling and positions (learned, rotary: which form, which base) as timm's own model, and
    has the preprocessing timm resolves for it (its default pretrained tag)."""
    from timm.data import resolve_data_config

    acts = {"GELU": "gelu", "GELUTanh": "gelu_tanh", "QuickGELU": "quick_gelu", "SiLU": "silu"}  # timm's activation classes

    for name in vitfast.list_models():
        if name not in timm.list_models():
            continue
        with torch.device("meta"):
            ref = timm.create_model(name, pretrained=False)
            ours = vitfast.create_model(name)
        ref_sd, _ = timm_layout(ref.state_dict(), name, rope=ours.config.rope)  # and no structure refused
        ref_shapes = {k: tuple(v.shape) for k, v in ref_sd.items()}
        our_shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
        assert our_shapes == ref_shapes, name
        c = ours.config
        rope = getattr(ref, "rope", None)  # eva.py's; vision_transformer.py has none
        assert (c.abs_pos_embed, c.rope) == (ref.pos_embed is not None, _TIMM_ROPE.get(type(rope).__name__)), name
        if rope is not None:
            assert _rope_settings(rope) == _our_rope_settings(c), name
        inner = [getattr(ref.blocks[0].attn, "norm", None), getattr(ref.blocks[0].mlp, "norm", None)]
        assert [type(m).__name__ not in ("Identity", "NoneType") for m in inner] == [c.scale_attn_norm, c.scale_mlp_norm], name
        assert (ref.global_pool, type(ref.fc_norm).__name__ != "Identity") == (c.global_pool, c.use_fc_norm), name
        if getattr(ref, "attn_pool", None) is not None:  # eva.py's attention pool reads the prefix tokens too
            assert (ours.attn_pool.num_heads, c.pool_include_prefix) == (ref.attn_pool.num_heads, getattr(ref, "pool_include_prefix", True)), name
        ref_act = ref.blocks[0].mlp.act
        assert acts.get(type(ref_act).__name__) == c.act_layer or (type(ref_act).__name__ == "GELU" and ref_act.approximate == "tanh"
                                                                     and c.act_layer == "gelu_tanh"), name  # fmt: skip
        assert ref.blocks[0].norm1.eps == c.norm_eps, name
        norms = {"LayerNorm": "layernorm", "RmsNorm": "rmsnorm"}  # timm's classes
        assert {norms[type(m).__name__] for m in (ref.blocks[0].norm1, ref.blocks[-1].norm2, ref.norm, ref.fc_norm)
                if type(m).__name__ in norms} == {c.norm_layer}, name  # fmt: skip
        assert (type(getattr(ref.patch_embed, "norm", None)).__name__ not in ("Identity", "NoneType")) == c.embed_norm, name
        mlp = ref.blocks[0].mlp  # timm's SwiGLUPacked is a GluMlp gating with the first half
        kind = "swiglu_packed" if type(mlp).__name__ == "GluMlp" and not mlp.gate_last else "swiglu" if type(mlp).__name__ == "SwiGLU" else "mlp"
        assert kind == c.mlp_layer, name
        ours_data = {"input_size": (c.in_chans, *c.img_hw), "interpolation": c.interpolation, "mean": c.mean,
                     "std": c.std, "crop_pct": c.crop_pct, "crop_mode": c.crop_mode}  # fmt: skip
        assert ours_data == resolve_data_config(model=ref), name


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize(
    "crop_mode, crop_pct, img_size", [("center", 0.875, 224), ("center", 0.9, 32), ("squash", 0.875, 32), ("center", 0.95, (24, 40))]
)
def test_preprocess_matches_timm_eval_transform(crop_mode, crop_pct, img_size, interpolation):
    """vitfast.preprocess == timm's create_transform(is_training=False) on PIL images of many shapes."""
    from timm.data import create_transform

    cfg = vitfast.ViTConfig(img_size=img_size, patch_size=8, embed_dim=16, depth=1, num_heads=1, num_classes=2,
                            mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), crop_pct=crop_pct,
                            crop_mode=crop_mode, interpolation=interpolation)  # fmt: skip
    transform = create_transform(input_size=(3, *cfg.img_hw), is_training=False, interpolation=interpolation,
                                 mean=cfg.mean, std=cfg.std, crop_pct=crop_pct, crop_mode=crop_mode)  # fmt: skip
    rng = np.random.default_rng(0)
    for h, w in [(480, 640), (640, 480), (97, 131), (3, 5), (1500, 2000), (224, 224)]:
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        torch.testing.assert_close(vitfast.preprocess(image, cfg)[0], transform(image), atol=2e-6, rtol=0, msg=f"{h}x{w}")


def _pretrained_cfg_variants() -> list[tuple[str, dict]]:
    """(timm tag, overrides): one real pretrained_cfg per distinct eval preprocessing among the
    registered architectures' tags, one per (crop_mode, interpolation, square or not) among all of
    timm's tags (e.g. border: deepseek_vit, non-square squash: sapiens2), and non-square border /
    squash at crop_pct < 1 (border then crops one side and pads the other), which no timm tag has."""
    from timm.models import get_pretrained_cfg

    registered, picked = set(vitfast.list_models()), {}
    for tag in timm.list_pretrained():
        pc = get_pretrained_cfg(tag).to_dict()
        key = (pc.get("crop_mode"), pc["interpolation"], pc["input_size"][1] == pc["input_size"][2])
        if tag.split(".")[0] in registered:
            key += (pc["input_size"], pc["crop_pct"], tuple(pc["mean"]), tuple(pc["std"]))
        picked.setdefault(key, (tag, {}))
    base = "vit_base_patch16_224.augreg2_in21k_ft_in1k"
    extra = [(base, {"crop_mode": "border", "crop_pct": 0.875, "input_size": (3, 224, 280)}),
             (base, {"crop_mode": "squash", "interpolation": "bilinear", "crop_pct": 0.9, "input_size": (3, 320, 224)})]  # fmt: skip
    return sorted(picked.values()) + extra


def _random_images(rng: np.random.Generator, input_hw: tuple[int, int]) -> list[Image.Image]:
    """Odd, tiny, huge, exact-size and random-shaped RGB images, and one grayscale image."""
    h, w = input_hw
    shapes = [(h, w), (h + 1, w), (480, 640), (640, 480), (3, 5), (2, 300), (97, 131), (1500, 2000)]
    shapes += [tuple(int(v) for v in rng.integers(8, 900, 2)) for _ in range(4)]
    images = [Image.fromarray(rng.integers(0, 256, (*hw, 3), dtype=np.uint8)) for hw in shapes]
    return images + [Image.fromarray(rng.integers(0, 256, (333, 250), dtype=np.uint8))]


def _assert_preprocess_matches(transform, config: vitfast.ViTConfig, images: list[Image.Image]) -> None:
    """vitfast.preprocess == timm's transform, bit for bit. Where timm fails (border mode rounds
    a sliver image's short side to 0 pixels), vitfast keeps one pixel row and still answers."""
    for image in images:
        ours = vitfast.preprocess(image, config)[0]
        try:
            expected = transform(image.convert("RGB"))
        except ValueError as exc:
            assert config.crop_mode == "border" and "must be > 0" in str(exc), exc
            assert ours.shape == (3, *config.img_hw) and bool(torch.isfinite(ours).all())
            continue
        torch.testing.assert_close(ours, expected, atol=0, rtol=0, msg=lambda m: f"{image.size} {image.mode}: {m}")


@pytest.mark.parametrize("tag, overrides", _pretrained_cfg_variants(), ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_pretrained_cfg_preprocessing_matches_timm(tag, overrides):
    """A timm Hub config.json (and `--config` with it) preprocesses like timm's
    resolve_data_config + create_transform for the same pretrained_cfg, on fresh random PIL images."""
    from timm.data import create_transform, resolve_data_config
    from timm.models import get_pretrained_cfg

    pc = get_pretrained_cfg(tag).to_dict() | overrides
    data_cfg = resolve_data_config(pretrained_cfg=pc)
    transform = create_transform(**data_cfg)
    hw = data_cfg["input_size"][1:]
    arch = next(n for n in vitfast.list_models() if all(s % vitfast.get_config(n).patch_size == 0 for s in hw))
    hub = {"architecture": arch, "num_classes": 10, "pretrained_cfg": pc}
    from_hub, guesses = timm_hub_config(hub, {})
    assert not guesses, guesses
    from_flag = vitfast.get_config(arch).replace(**config_file_fields(hub)[0])
    rng = np.random.default_rng(zlib.crc32(repr((tag, overrides)).encode()))
    images = _random_images(rng, hw)
    for config in (from_hub, from_flag):
        _assert_preprocess_matches(transform, config, images)


# ---------------------------------------------------------------------------- DINOv3 (timm's eva.py, Meta's layout)
_TIMM_ROPE = {"RotaryEmbeddingDinoV3": "dinov3", "RotaryEmbeddingCat": "axial", "NoneType": None}  # timm's rotary class -> vitfast's rope
# what vitfast's rope="dinov3" computes, in RotaryEmbeddingDinoV3's terms after the base (rope_theta): periods from the base,
# not min/max; coordinates normalised per axis, not offset; then the axis order (rope_grid_indexing), the rotate-half layout
DINOV3_ROPE_SETTINGS = (None, None, "separate", 0.0)
# and rope="axial", in RotaryEmbeddingCat's terms after the base and the reference grid: inverse-frequency bands (not
# pixel ones), integer patch indices; then their offset (rope_grid_offset), the axis order (rope_grid_indexing), the interleaved layout
AXIAL_ROPE_SETTINGS = (False, "index")
DINOV3_SIZES = ["vit_tiny_patch16_dinov3_qkvb", "vit_small_patch16_dinov3", "vit_small_plus_patch16_dinov3_qkvb", "vit_base_patch16_dinov3"]


def _rope_settings(rope) -> tuple:
    if type(rope).__name__ == "RotaryEmbeddingCat":
        ref = tuple(rope.ref_feat_shape) if rope.ref_feat_shape is not None else None
        return (rope.temperature, ref, rope.in_pixels, rope.grid_type, rope.grid_offset, rope.grid_indexing, rope.rotate_half)
    return (rope.temperature, rope.min_period, rope.max_period, rope.normalize_coords, rope.grid_offset, rope.grid_indexing, rope.rotate_half)


def _our_rope_settings(c: vitfast.ViTConfig) -> tuple:
    """A config's rotary positions in `_rope_settings`'s terms."""
    if c.rope == "axial":
        return (c.rope_base, c.rope_ref_grid, *AXIAL_ROPE_SETTINGS, c.rope_grid_offset, c.rope_grid_indexing, False)
    return (c.rope_base, *DINOV3_ROPE_SETTINGS, c.rope_grid_indexing, True)


@pytest.mark.parametrize("global_pool", ["avg", "token"])
@pytest.mark.parametrize("name", DINOV3_SIZES)
def test_timm_dinov3_hub_folder_and_state_dict_match_timm(tmp_path, name, global_pool):
    """timm's eva.py DINOv3 (random weights: layer scales and q/v biases off their init), pooling the mean patch token
    (timm's default) or the class token (DINOv3's own): its save_for_hf folder, nothing guessed, and its bare state dict
    with the registered config give timm's tokens and outputs."""
    from timm.models import save_for_hf

    ref = _timm_model(name, img_size=64, depth=2, global_pool=global_pool)
    save_for_hf(ref, tmp_path / "hub")
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)
        hub = vitfast.load_checkpoint(tmp_path / "hub", img_size=64)  # pretrained_cfg says 256 px; rotary positions fit any size
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    bare = vitfast.load_checkpoint(tmp_path / "model.pth", config=vitfast.get_config(name, img_size=64, depth=2, global_pool=global_pool))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        for ours in (hub, bare):
            assert (ours.config.global_pool, ours.config.rope, ours.config.abs_pos_embed) == (global_pool, "dinov3", False)
            torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=ATOL, rtol=0)
            torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name, global_pool", [("vit_small_patch16_dinov3_qkvb", "avg"), ("vit_small_patch16_lingbot", "token")])
def test_bare_timm_dinov3_state_dict_is_read_off_its_keys_and_says_what_it_assumed(tmp_path, name, global_pool):
    """A bare eva.py state dict with a class token and registers but no learned positions is a DINOv3's: the head count
    comes from the registered DINOv3 of its width and depth (full depth here), the pooling is timm's DINOv3 default,
    both said. LingBot, DINOv3's architecture pooling its class token, needs that pooling named to match."""
    ref = _timm_model(name, img_size=64, global_pool=global_pool)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"num_heads=6 \(.*vit_small_patch16_dinov3, .*global_pool='avg' \("):
        guessed = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=64)
    with pytest.warns(vitfast.GuessedConfigWarning):
        ours = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=64, overrides={"global_pool": global_pool})
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(guessed.forward_features(x), ref.forward_features(x), atol=ATOL, rtol=0)
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)
        if global_pool != "avg":
            assert (guessed(x) - ref(x)).abs().max() > 100 * ATOL  # the guess is another pooling, and says so


def test_eva_models_load_exactly_when_timm_gives_them_the_rotary_positions_vitfast_reads_them_with():
    """The rule that reads a bare eva.py state dict as a DINOv3 (a class token and registers, no learned positions), an
    EVA-02 (a class token and learned positions, no registers, no layer scale, no norm before the blocks, a SwiGLU
    MLP), an sbb RoPE ViT (registers, no class token, no learned positions, layer scale, a GELU MLP) or a Naver
    RoPE-ViT (a class token, learned positions for the patches or none, layer scale, a GELU MLP), or a Perception Encoder
    (a pre-norm, then an attention pool and a final norm: core; nothing after the blocks: spatial), over every eva.py
    model timm has: whatever loads gets the rotary embedding timm builds it with, its settings included (so no other
    rotary form ever loads as one of them); every vit_*_dinov3*, eva02_* (but the post-norm enormous one),
    vit_*_rope_reg*_gap_256, vit_*_patch16_rope[_ape]_224 and vit_pe_{core,spatial}_* name loads, and the only other names
    that do are LingBot's (DINOv3's architecture) and PE's language towers (the spatial ones' architecture, registered); the rest
    (EVA-01, RoPE-Mixed, Sapiens2, the enormous EVA-02) are refused."""
    from vitfast.convert import timm_config

    loaded, refused = set(), {}
    for name in timm.list_models(module="eva"):
        with torch.device("meta"):
            ref = timm.create_model(name, pretrained=False)
        try:
            sd, family = timm_layout(ref.state_dict(), name)
        except vitfast.CheckpointError as exc:
            refused[name] = str(exc)
            continue
        assert family is not None, name  # nothing from eva.py reads as a plain ViT
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg, _ = timm_config(sd, family)
        assert _TIMM_ROPE[type(ref.rope).__name__] == cfg.rope and _rope_settings(ref.rope) == _our_rope_settings(cfg), name
        attn = ref.blocks[0].attn  # Naver's RoPE-ViT has timm's AttentionRope: the same math, ungated, no qk-norm
        assert ref.blocks[0].norm1.eps == cfg.norm_eps and type(attn).__name__ in ("EvaAttention", "AttentionRope"), name
        assert getattr(attn, "gate", None) is None and type(attn.q_norm).__name__ == "Identity", name
        assert type(ref.blocks[0]).__name__ == "EvaBlock", name  # pre-norm
        loaded.add(name)
    dinov3_names = set(timm.list_models("*_dinov3*", module="eva"))
    assert dinov3_names == {n for n in vitfast.list_models() if "dinov3" in n} and len(dinov3_names) == 12
    eva02_names = set(timm.list_models("eva02_*", module="eva")) - {"eva02_enormous_patch14_clip_224"}
    assert eva02_names == {n for n in vitfast.list_models() if n.startswith("eva02")} and len(eva02_names) == 11
    pe_core_names = set(timm.list_models("vit_pe_core_*", module="eva"))
    assert pe_core_names == {n for n in vitfast.list_models() if n.startswith("vit_pe_core")} and len(pe_core_names) == 5
    pe_spatial_names = set(timm.list_models("vit_pe_spatial_*", module="eva"))
    assert pe_spatial_names == {n for n in vitfast.list_models() if n.startswith("vit_pe_spatial")} and len(pe_spatial_names) == 5
    rope_names = set(timm.list_models("vit_*_rope_reg*_gap_256", module="eva")) | set(timm.list_models("vit_*_patch16_rope_*224", module="eva"))
    rope_names -= set(timm.list_models("*_rope_mixed_*", module="eva"))
    assert rope_names == {n for n in vitfast.list_models() if "_rope_" in n} and len(rope_names) == 10
    # PE's language towers are built as its spatial ones, with layer scale: they load as one, registered by their own names
    pe_lang_names = set(timm.list_models("vit_pe_lang_*", module="eva"))
    assert pe_lang_names == {n for n in vitfast.list_models() if n.startswith("vit_pe_lang")} and len(pe_lang_names) == 2
    assert loaded == (dinov3_names | eva02_names | rope_names | pe_core_names | pe_spatial_names | pe_lang_names
                      | set(timm.list_models("*_lingbot", module="eva")))  # fmt: skip
    assert len(refused) == 16 and all("does not implement" in why for why in refused.values())
    assert {n for n, why in refused.items() if "learned rotary frequencies" in why} == set(timm.list_models("*_rope_mixed_*", module="eva"))
    assert {n for n, why in refused.items() if "query/key normalisation" in why} == set(timm.list_models("*_sapiens2", module="eva"))
    assert {n for n, why in refused.items() if "separate q/k/v" in why} == {"eva02_enormous_patch14_clip_224"} | set(timm.list_models(
        "eva_giant_*", module="eva"))


@pytest.mark.parametrize(
    "name, hw, assumed",
    [
        ("vit_base_patch16_rope_reg1_gap_256", (48, 80), "base 10000, patch indices scaled to a 16x16 grid, y's"),
        ("vit_betwixt_patch16_rope_reg4_gap_256", (64, 64), "base 10000, patch indices scaled to a 16x16 grid, y's"),
        ("vit_small_patch16_rope_224", (80, 48), "base 100, patch indices unscaled, x's"),
        ("vit_small_patch16_rope_ape_224", (64, 64), "base 100, patch indices unscaled, x's"),
    ],
)
def test_bare_timm_rope_vit_state_dict_is_read_off_its_keys_and_says_what_it_assumed(tmp_path, name, hw, assumed):
    """A bare state dict of timm's sbb RoPE ViTs (registers, no class token) or Naver's RoPE-ViT (a class token, patch-only
    learned positions or none; x's frequencies first, which a non-square grid shows) at full depth: its rotary positions
    and preprocessing come from the registered model of its family and shapes, said; at another image size, rectangular
    too, the model equals timm's, token for token. Naver's with y's frequencies first would be another model."""
    ref = _timm_model(name, img_size=hw)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=rf"rope='axial', rope_theta=.* \(rotary positions are not stored in weights; {name}'s assumed: axial, {assumed}"):
        ours = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=hw)
    fields = ("rope", "rope_base", "rope_ref_grid", "rope_grid_indexing", "abs_pos_embed", "no_embed_class", "class_token", "reg_tokens",
              "global_pool", "use_fc_norm", "num_heads", "qkv_bias", "mean", "std", "crop_pct", "interpolation")  # fmt: skip
    assert [getattr(ours.config, k) for k in fields] == [getattr(vitfast.get_config(name), k) for k in fields]
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=ATOL, rtol=0)
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)
        if ours.config.rope_grid_indexing == "xy":
            other = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=hw, overrides={"rope_grid_indexing": "ij"})
            assert (other(x) - ref(x)).abs().max() > 100 * ATOL


def test_bare_timm_pe_core_state_dict_is_read_off_its_keys_and_says_what_it_assumed(tmp_path):
    """Meta's Perception Encoder core tower (a pre-norm, an attention pool and a final norm: a CLIP tower's keys, none of
    eva.py's) at full depth: its rotary positions (index + 1 scaled to the 24x24 reference grid, x's first) and its pool's
    8 heads reading the class token come from the registered model of its shapes, said; then it equals timm's. With
    the pool on the patches only (vision_transformer.py's way) it would be another model."""
    name = "vit_pe_core_tiny_patch16_384"
    ref = _timm_model(name, img_size=64)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=rf"{name}'s assumed: axial, base 10000, patch indices \+ 1 scaled to a 24x24 grid, x's.*"
                                                           rf"pool_include_prefix=True, attn_pool_num_heads=8 \(.*{name}'s assumed"):  # fmt: skip
        ours = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=64)
    assert (ours.config.rope_grid_offset, ours.config.num_classes, ours.attn_pool.num_heads) == (1.0, 512, 8)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=ATOL, rtol=0)
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)
        other = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=64, overrides={"pool_include_prefix": False})
        assert (other(x) - ref(x)).abs().max() > 100 * ATOL


@pytest.mark.parametrize(
    "name, kw, img_size, assumed",
    [
        ("vit_pe_spatial_tiny_patch16_512", {}, 64, "vit_pe_spatial_tiny_patch16_512's assumed: axial, base 10000, patch indices \\+ 1 scaled "
                                                    "to a 32x32 grid, x's"),
        # unregistered shapes, eva.py's layer scale names, no class token: Meta's reference grid (its learned positions'), no offset
        ("vit_pe_spatial_gigantic_patch14_448", dict(depth=2, embed_dim=128, num_heads=2, mlp_ratio=6.0), 448,
         "timm's Perception Encoder spatial defaults assumed: axial, base 10000, patch indices scaled to a 32x32 grid, x's"),
    ],
    ids=["tiny", "gigantic-narrow"],
)  # fmt: skip
def test_bare_timm_pe_spatial_state_dict_is_read_off_its_keys_and_says_what_it_assumed(tmp_path, name, kw, img_size, assumed):
    """Meta's Perception Encoder spatial tower (a pre-norm and nothing after the blocks: no final norm, no pool; a CLIP
    tower's keys, none of eva.py's but the layer scale) at full depth, or narrow and unregistered: its rotary positions
    and timm's pooling (the plain mean of the patch tokens) are read as the registered model of its shapes has them, or as
    Meta builds them, said; then its tokens and pooled output equal timm's. Without the index offset its class token would
    see the patches at other angles: another model."""
    ref = _timm_model(name, img_size=img_size, **kw)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=rf"global_pool='avg' \(.*Perception Encoder spatial.*{assumed}"):
        ours = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=img_size)
    c = ours.config
    assert (c.final_norm, c.use_fc_norm, c.pre_norm, c.num_classes, c.num_heads) == (False, False, True, 0, ref.blocks[0].attn.num_heads)
    assert (c.rope_grid_offset, c.init_values is not None) == (float(c.class_token), "blocks.0.gamma_1" in ref.state_dict())
    x = torch.randn(2, 3, img_size, img_size)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=ATOL, rtol=0)
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)
        if c.class_token:
            other = vitfast.load_checkpoint(tmp_path / "model.pth", img_size=img_size, overrides={"rope_grid_offset": 0.0})
            assert (other.forward_features(x) - ref.forward_features(x)).abs().max() > 100 * ATOL


def _meta_state_dict(ref) -> dict[str, torch.Tensor]:
    """Meta's facebookresearch/dinov3 layout of a timm eva.py DINOv3: timm's checkpoint_filter_fn run backwards
    (ls1.gamma, storage_tokens, qkv.bias with a bias_mask, SwiGLU as w1 / w2 / w3), with a key bias the mask removes, the
    rotary periods in bf16 as the released files hold them, and what Meta uses in training only (mask_token, the 7B's
    local_cls_norm)."""
    sd: dict[str, torch.Tensor] = {}
    own = ref.state_dict()
    swiglu = type(ref.blocks[0].mlp).__name__ == "SwiGLU"
    for key, value in own.items():
        key = key.replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma").replace("reg_token", "storage_tokens")
        if swiglu:
            key = key.replace("mlp.fc1_g.", "mlp.w1.").replace("mlp.fc1_x.", "mlp.w2.").replace("mlp.fc2.", "mlp.w3.")
        if key.endswith("attn.q_bias"):
            qkv = key.replace("q_bias", "qkv.bias")
            sd[qkv] = torch.cat([value, torch.randn_like(value), own[key.replace("q_bias", "v_bias")]])
            sd[qkv + "_mask"] = torch.cat([torch.ones_like(value), torch.zeros_like(value), torch.ones_like(value)])
        elif not key.endswith("attn.v_bias"):
            sd[key] = value
    dim, head_dim = ref.embed_dim, ref.blocks[0].attn.head_dim
    sd["rope_embed.periods"] = (100.0 ** (torch.arange(head_dim // 4) * 4 / head_dim)).bfloat16()
    sd["mask_token"] = torch.randn(1, dim)
    sd["local_cls_norm.weight"], sd["local_cls_norm.bias"] = torch.randn(dim), torch.randn(dim)
    return sd


@pytest.mark.parametrize(
    "name, kw",
    [("vit_small_patch16_dinov3_qkvb", {}), ("vit_small_plus_patch16_dinov3_qkvb", {}), ("vit_7b_patch16_dinov3", dict(embed_dim=256, num_heads=4))],
    ids=["vits16", "vits16plus", "vit7b16-narrow"],
)  # fmt: skip
def test_meta_checkpoint_loads_as_timm_converts_it(tmp_path, name, kw):
    """Meta's original .pth equals timm's model loaded through timm's own checkpoint_filter_fn (which keeps q and v of
    the qkv bias and drops the masked key's): tokens and the class-token output Meta's forward returns. The head count
    and rope base are read off rope_embed.periods, not guessed."""
    from timm.models.eva import checkpoint_filter_fn

    meta = _meta_state_dict(_timm_model(name, img_size=64, depth=2, **kw))
    ref = timm.create_model(name, pretrained=False, img_size=64, depth=2, global_pool="token", **kw).eval()
    ref.load_state_dict(checkpoint_filter_fn(meta, ref))
    torch.save(meta, tmp_path / "dinov3_pretrain.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match="Meta's README eval transform"):
        ours = vitfast.load_checkpoint(tmp_path / "dinov3_pretrain.pth", img_size=64)
    assert not {"num_heads", "rope_theta", "global_pool"} & set(ours.config_guesses)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=ATOL, rtol=0)
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "name, named",
    [
        ("vit_small_patch16_18x2_224", "ParallelThingsBlock"),
        ("vit_base_patch16_xp_224", "ParallelScalingBlock"),
        ("vit_pwee_patch16_reg1_gap_256", "ParallelScalingBlock"),
        ("vit_dwee_patch16_reg1_gap_256", "differential attention"),
        ("eva02_enormous_patch14_clip_224", "separate q/k/v projections"),  # post-norm: its keys are EVA-01's
        ("eva_giant_patch14_224", "separate q/k/v projections"),
        ("beitv2_base_patch16_224", "relative position biases"),
        ("vit_small_patch16_rope_mixed_224", "learned rotary frequencies"),
        ("cait_xxs24_224", "gamma_1"),  # a class token, patch-only positions, layer scale, a GELU MLP: and class-attention blocks
    ],
)
def test_timm_models_vitfast_cannot_build_are_named_from_their_weights(tmp_path, name, named):
    """Real timm models whose blocks vitfast does not implement: a bare state dict and a save_for_hf folder
    both stop with the structure named (before, most stopped with a KeyError)."""
    from timm.models import save_for_hf

    ref = timm.create_model(name, pretrained=False, depth=1, img_size=64)
    torch.save(ref.state_dict(), tmp_path / "model.pth")
    save_for_hf(ref, tmp_path / "hub")
    for path in (tmp_path / "model.pth", tmp_path / "hub"):
        with pytest.raises(vitfast.CheckpointError, match=rf"(blocks have|holds {name}: ).*{named}.*does not implement"):
            vitfast.load_checkpoint(path)


def test_a_res_post_norm_hub_folder_is_refused_though_its_weights_fit_a_plain_vit(tmp_path):
    """timm's ResPostBlock ViT has a pre-norm ViT's keys and shapes; only its architecture name tells them apart."""
    from timm.models import save_for_hf

    save_for_hf(timm.create_model("vit_base_patch16_rpn_224", pretrained=False, depth=1, img_size=64), tmp_path)
    with pytest.raises(vitfast.CheckpointError, match="ResPostBlock"):
        vitfast.load_checkpoint(tmp_path)
