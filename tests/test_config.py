"""ViTConfig validation, JSON round trip and the name registry."""

from __future__ import annotations

import json
import re

import pytest

import vitfast
from conftest import tiny_config
from vitfast import ConfigError, ViTConfig


def test_json_round_trip_every_registered_model():
    for name in vitfast.list_models():
        cfg = vitfast.get_config(name)
        again = ViTConfig.from_json(cfg.to_json())
        assert again == cfg and again.name == name
        assert json.loads(cfg.to_json())["img_size"] == cfg.img_size


def test_non_square_image_size_round_trips():
    cfg = ViTConfig(img_size=(32, 48), patch_size=16, embed_dim=64, num_heads=4)
    assert cfg.grid_size == (2, 3) and cfg.num_patches == 6 and cfg.seq_len == 7
    assert ViTConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(img_size=12, patch_size=16), "smaller than one 16x16 patch"),
        (dict(img_size=232, hybrid_layers=(3, 4, 9)), "hybrid model is not divisible by patch_size 16"),
        (dict(embed_dim=100, num_heads=12), "not divisible by num_heads 12"),
        (dict(global_pool="token", class_token=False), 'global_pool="token" needs class_token=True'),
        (dict(global_pool="max"), "global_pool must be one of"),
        (dict(global_pool="token_avg", class_token=False), 'global_pool="token_avg" needs class_token=True'),
        (dict(global_pool="token_avg", fc_norm=True), 'fc_norm is not supported with global_pool="token_avg"'),
        (dict(global_pool="avg", fc_norm=True, final_norm=False), "fc_norm=True asks for the norm after pooling that final_norm=False removes"),
        (dict(mlp_layer="geglu"), "mlp_layer must be one of"),
        (dict(mlp_layer="swiglu_packed"), 'goes with act_layer="silu"'),
        (dict(mlp_layer="swiglu"), 'goes with act_layer="silu"'),
        (dict(act_layer="silu"), 'goes with act_layer="silu"'),
        (dict(mlp_layer="swiglu", act_layer="silu", global_pool="map"), "not supported"),
        (dict(norm_layer="batchnorm"), "norm_layer must be one of"),
        (dict(embed_norm=True, hybrid_layers=(1,), patch_size=16, img_size=32), "embed_norm is not supported with a hybrid"),
        (dict(act_layer="silu"), 'goes with act_layer="silu"'),
        (dict(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=4.5, embed_dim=66, num_heads=6), "even MLP width"),
        (dict(mlp_layer="swiglu_packed", act_layer="silu", global_pool="map"), "not supported"),
        (dict(act_layer="relu"), "act_layer must be one of"),
        (dict(in_chans=1, mean=(0.4, 0.5, 0.6)), "one value per input channel"),
        (dict(depth=0), "depth must be a positive integer"),
        (dict(drop_path_rate=1.5), "drop_path_rate must be in [0, 1)"),
        (dict(hybrid_layers=(3, 4, 9), patch_size=8), "multiple of the hybrid stem's stride 16"),
        (dict(distilled=True, global_pool="avg"), "distilled"),
        (dict(img_size=224.0), "img_size must be a positive int or (height, width) ints, got 224.0"),
        (dict(img_size=(224, 224.5)), "img_size must be a positive int or (height, width) ints"),
        (dict(hybrid_layers=(3, 0)), "hybrid_layers must be positive stage depths"),
        (dict(dist_head=False), "dist_head=False leaves out the distillation token's head; it needs distilled=True"),
        (dict(num_classes=-1), "num_classes must be >= 0"),
        (dict(crop_pct=0), "crop_pct must be in (0, 1]"),
        (dict(crop_mode="letterbox"), "crop_mode must be one of"),
        (dict(crop_rounding="ceil"), "crop_rounding must be one of"),
        (dict(num_classes=3, labels=("a", "b")), "2 labels for 3 classes"),
        (dict(problem_type="multilabel"), "problem_type must be one of single_label_classification, multi_label_classification"),
        (dict(rope="eva"), "rope must be None or one of ('dinov3', 'axial')"),
        (dict(rope="dinov3", rope_ref_grid=(16, 16)), 'rope_ref_grid scales the patch indices of rope="axial" only'),
        (dict(rope="axial", rope_ref_grid=(16, 0)), "rope_ref_grid must be two positive integers"),
        (dict(rope="dinov3", embed_dim=72, num_heads=4), "head_dim divisible by 4"),
        (dict(rope="dinov3", rope_theta=0.0), "rope_theta must be > 0"),
    ],
)
def test_invalid_configs_name_the_problem(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ViTConfig(**fields)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("labels", "l.txt", "labels must be a list of strings or null, got 'l.txt' (a labels file goes in --labels FILE)"),
        ("mean", 0.5, "mean must be a list of numbers, got 0.5"),
        ("mean", "0.5", "mean must be a list of numbers, got '0.5'"),
        ("mean", None, "mean must be a list of numbers, got None"),
        ("std", [0.5, "x", 0.5], "std must be a list of numbers, got [0.5, 'x', 0.5]"),
        ("crop_pct", "0.9", "crop_pct must be a number, got '0.9'"),
        ("norm_eps", "1e-6", "norm_eps must be a number, got '1e-6'"),
        ("num_classes", "5", "num_classes must be an integer, got '5'"),
        ("num_classes", 5.0, "num_classes must be an integer, got 5.0"),
        ("qkv_bias", "false", "qkv_bias must be true or false, got 'false'"),
        ("init_values", [1e-5], "init_values must be a number or null, got [1e-05]"),
    ],
)
def test_config_json_fields_of_the_wrong_type_name_the_field_the_type_and_the_value(field, value, message):
    """A `--config` JSON's values are checked against the field types: `"labels": "l.txt"` was read as one label per
    character, and the others crashed with a Python traceback."""
    data = ViTConfig(img_size=32, patch_size=8, embed_dim=64, num_heads=4, num_classes=3).to_dict() | {field: value}
    with pytest.raises(ConfigError, match="^invalid ViTConfig: " + re.escape(message) + "$"):
        ViTConfig.from_json(json.dumps(data))


def test_preprocessing_fields_labels_and_problem_type_round_trip():
    cfg = ViTConfig(img_size=32, patch_size=8, embed_dim=64, num_heads=4, num_classes=3, labels=["cat", "dog", "emu"],
                    crop_mode="squash", crop_rounding="floor", problem_type="multi_label_classification")  # fmt: skip
    again = ViTConfig.from_json(cfg.to_json())
    assert again == cfg and again.labels == ("cat", "dog", "emu") and again.crop_mode == "squash"
    assert again.problem_type == "multi_label_classification"
    assert cfg.replace(num_classes=5).labels is None  # labels that no longer fit are dropped
    assert cfg.replace(crop_pct=0.5).labels == cfg.labels


def test_divisibility_error_suggests_a_fix():
    with pytest.raises(ConfigError, match=r"img_size=224"):
        ViTConfig(img_size=230, patch_size=16, hybrid_layers=(3, 4, 9))
    with pytest.raises(ConfigError, match=r"num_heads that divide it: .*12"):
        ViTConfig(embed_dim=768, num_heads=11)


def test_unknown_field_suggests_close_name():
    with pytest.raises(ConfigError, match=r"'embed_dims' \(did you mean 'embed_dim'\?\)"):
        ViTConfig.from_dict({"embed_dims": 64})
    with pytest.raises(ConfigError, match="did you mean 'num_heads'"):
        vitfast.get_config("vit_tiny_patch16_224", num_head=3)


def test_from_json_rejects_garbage():
    with pytest.raises(ConfigError, match="not valid JSON"):
        ViTConfig.from_json("{not json")
    with pytest.raises(ConfigError, match="must be an object"):
        ViTConfig.from_json("[1, 2]")


def test_unknown_model_name_suggests_close_names():
    with pytest.raises(ConfigError, match=r"unknown model 'vit_base_patch16_244'.*did you mean vit_base_patch16_224"):
        vitfast.create_model("vit_base_patch16_244")


def test_timm_pretrained_tag_is_accepted():
    cfg = vitfast.get_config("vit_base_patch16_224.augreg2_in21k_ft_in1k")
    assert cfg.name == "vit_base_patch16_224"


def test_uniform_normalisation_follows_channel_count():
    cfg = vitfast.get_config("vit_tiny_patch16_224", in_chans=1)
    assert cfg.mean == (0.5,) and cfg.std == (0.5,)
    with pytest.raises(ConfigError, match="pass mean= and std= with 1 values"):
        vitfast.get_config("deit_tiny_patch16_224", in_chans=1)


def test_registry_covers_the_required_families():
    names = set(vitfast.list_models())
    for size in ("tiny", "small", "base", "large", "huge"):
        assert any(n.startswith(f"vit_{size}_patch") for n in names)
    for name in ("deit_tiny_patch16_224", "deit_small_patch16_224", "deit_base_patch16_224",
                 "deit_tiny_distilled_patch16_224", "deit_small_distilled_patch16_224",
                 "deit_base_distilled_patch16_224", "vit_base_r50_s16_224", "vit_base_r50_s16_384",
                 "vit_cifar_patch4_32"):  # fmt: skip
        assert name in names
    cifar = vitfast.get_config("vit_cifar_patch4_32")
    assert (cifar.img_size, cifar.patch_size, cifar.embed_dim, cifar.depth, cifar.num_heads, cifar.mlp_hidden) == (
        32, 4, 48, 4, 4, 192
    ) and cifar.act_layer == "gelu_tanh"
    assert vitfast.list_models("deit*") == sorted(n for n in names if n.startswith("deit"))


def test_replace_resets_the_settings_of_what_an_override_removes():
    """A pool other than "map" drops the attention pool's settings, rope=None the rotary ones, a new
    num_classes the labels; given alongside, they are kept (and validated)."""
    pe = vitfast.get_config("vit_pe_core_tiny_patch16_384")
    assert (pe.pool_include_prefix, pe.attn_pool_num_heads, pe.rope_grid_offset) == (True, 8, 1.0)
    for pool in ("", "token", "avg"):
        cfg = pe.replace(global_pool=pool)
        assert (cfg.pool_include_prefix, cfg.attn_pool_num_heads, cfg.attn_pool_mlp_ratio, cfg.global_pool) == (False, None, None, pool)
    assert vitfast.get_config("vit_pe_core_tiny_patch16_384", global_pool="").output_shape == (pe.seq_len, pe.num_classes)
    no_rope = pe.replace(rope=None)
    assert (no_rope.rope_grid_offset, no_rope.rope_grid_indexing, no_rope.attn_pool_num_heads) == (0.0, "ij", 8)
    assert pe.replace(attn_pool_num_heads=4).attn_pool_num_heads == 4
    with pytest.raises(ConfigError, match="configure the attention pool"):
        pe.replace(global_pool="avg", attn_pool_num_heads=4)
    labelled = tiny_config(labels=tuple("abcdefg"))
    assert labelled.replace(global_pool="").labels == labelled.labels and labelled.replace(num_classes=0).labels is None
