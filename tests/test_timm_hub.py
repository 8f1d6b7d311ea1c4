"""timm Hub folders: `config.json` as timm's `save_for_hf` / `push_to_hf_hub` writes it
(architecture, num_classes, model_args, pretrained_cfg, label_names) beside model.safetensors or
pytorch_model.bin. The config comes from the architecture, preprocessing and labels from the file."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from safetensors.torch import save_file

import vitfast

LABELS = ["tench", "goldfish", "great white shark"]
PRETRAINED_CFG = {  # the fields timm keeps (filter_pretrained_cfg drops the source and nulls)
    "tag": "augreg_in21k_ft_in1k", "custom_load": False, "input_size": [3, 48, 48], "fixed_input_size": True,
    "interpolation": "bilinear", "crop_pct": 0.875, "crop_mode": "squash", "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225], "num_classes": 3, "pool_size": None, "first_conv": "patch_embed.proj", "classifier": "head",
}  # fmt: skip


def _hub_folder(path, *, architecture="deit_tiny_patch16_224", weights="model.safetensors", **extra):
    torch.manual_seed(0)
    model = vitfast.create_model("deit_tiny_patch16_224", img_size=48, depth=2, num_classes=3)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    path.mkdir(parents=True, exist_ok=True)
    if weights == "model.safetensors":
        save_file(sd, path / weights)
    else:
        torch.save(sd, path / weights)
    config = {"architecture": architecture, "num_classes": 3, "num_features": 192, "global_pool": "token",
              "label_names": LABELS, "model_args": {"img_size": 48, "depth": 2}, "pretrained_cfg": PRETRAINED_CFG} | extra  # fmt: skip
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return model


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_timm_hub_folder_loads_with_its_preprocessing_and_labels(tmp_path, weights):
    source = _hub_folder(tmp_path, weights=weights)
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)  # nothing is guessed: the folder says it all
        model = vitfast.load_checkpoint(tmp_path)
    cfg = model.config
    assert (cfg.num_heads, cfg.depth, cfg.img_size, cfg.num_classes) == (3, 2, 48, 3)
    assert (cfg.crop_mode, cfg.crop_pct, cfg.interpolation) == ("squash", 0.875, "bilinear")
    assert cfg.mean == (0.485, 0.456, 0.406) and cfg.labels == tuple(LABELS)
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), rtol=0, atol=0)


def test_model_args_img_size_wins_over_pretrained_cfg_input_size_and_the_difference_is_said(tmp_path):
    """push_to_hf_hub(model_args=dict(img_size=...)) of a model fine-tuned at another size keeps the registered
    input_size: timm's create_model builds the model at model_args' size (input_size only fills in an unset img_size),
    the checkpoint's 6 x 6 position table as it is. That timm's transforms would feed it input_size is said."""
    source = _hub_folder(tmp_path, pretrained_cfg=PRETRAINED_CFG | {"input_size": [3, 32, 32]})
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"img_size=48 \(model_args build the model at 48x48 px.*input_size is 32x32"):
        model = vitfast.load_checkpoint(tmp_path)
    assert model.config.img_size == 48 and set(model.config_guesses) == {"img_size"}
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)  # the size asked for is no guess
        assert vitfast.load_checkpoint(tmp_path, img_size=32).config.img_size == 32


def test_label_names_as_an_index_map(tmp_path):
    _hub_folder(tmp_path, label_names={"0": "a", "1": "b", "2": "c"})
    assert vitfast.load_checkpoint(tmp_path).config.labels == ("a", "b", "c")


def test_unknown_architecture_is_read_off_the_weights_with_a_loud_head_guess(tmp_path):
    source = _hub_folder(tmp_path, architecture="my_vit_tiny")
    with pytest.warns(vitfast.GuessedConfigWarning, match="num_heads=3 .*'my_vit_tiny' is not a registered vitfast model"):
        model = vitfast.load_checkpoint(tmp_path)
    assert model.config.crop_mode == "squash" and model.config.labels == tuple(LABELS)  # still from pretrained_cfg
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), rtol=0, atol=0)


def test_unknown_architecture_takes_what_its_model_args_state(tmp_path):
    """model_args that name ViTConfig fields (num_heads, act_layer, ...) are read, not guessed."""
    _hub_folder(tmp_path, architecture="my_vit_tiny", model_args={"img_size": 48, "depth": 2, "num_heads": 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)
        assert vitfast.load_checkpoint(tmp_path).config.num_heads == 3


def test_model_args_without_a_field_are_followed_where_harmless_and_refused_by_name_otherwise(tmp_path):
    """timm's create_model takes arguments vitfast has no field for. pos_embed="none" (no learned positions) builds the
    model without them, as timm does (it failed as a truncated checkpoint); dropout, stochastic depth, init schemes and
    timm's defaults change nothing at inference; dynamic_img_pad=True (timm pads inputs that are not whole patches) is
    refused by name, never dropped."""
    torch.manual_seed(0)
    source = vitfast.create_model("deit_tiny_patch16_224", img_size=48, depth=2, num_classes=3, abs_pos_embed=False).eval()
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, tmp_path / "model.safetensors")
    args = {"img_size": 48, "depth": 2, "pos_embed": "none", "drop_path_rate": 0.1, "weight_init": "jax", "qk_norm": False,
            "dynamic_img_pad": False}  # fmt: skip
    config = {"architecture": "deit_tiny_patch16_224", "num_classes": 3, "model_args": args, "pretrained_cfg": PRETRAINED_CFG}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)
        model = vitfast.load_checkpoint(tmp_path)
    assert not model.config.abs_pos_embed
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), rtol=0, atol=0)
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_args": args | {"dynamic_img_pad": True}}))
    with pytest.raises(vitfast.ConfigError, match="model_args give deit_tiny_patch16_224 dynamic_img_pad=True, which vitfast"):
        vitfast.load_checkpoint(tmp_path)


def test_border_crop_mode_is_read(tmp_path):
    _hub_folder(tmp_path, pretrained_cfg=PRETRAINED_CFG | {"crop_mode": "border"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", vitfast.GuessedConfigWarning)
        assert vitfast.load_checkpoint(tmp_path).config.crop_mode == "border"


def test_unsupported_crop_mode_is_a_guess(tmp_path):
    _hub_folder(tmp_path, pretrained_cfg=PRETRAINED_CFG | {"crop_mode": "letterbox"})
    with pytest.warns(vitfast.GuessedConfigWarning, match="crop_mode 'letterbox' is not supported"):
        assert vitfast.load_checkpoint(tmp_path).config.crop_mode == "center"


def test_timm_weights_without_architecture_get_a_clear_error(tmp_path):
    _hub_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"num_classes": 3}))
    with pytest.raises(vitfast.CheckpointError, match="no 'architecture'"):
        vitfast.load_checkpoint(tmp_path)


@pytest.mark.parametrize("architecture", ["vit_base_patch16_rpn_224.sw_in1k", "vit_small_patch16_18x2_224", "vit_base_patch16_xp_224"])
def test_an_architecture_vitfast_cannot_build_is_refused_by_name_even_when_its_weights_fit(tmp_path, architecture):
    """timm's ResPostBlock ViT (norm after each branch) has a plain ViT's keys and shapes: read off the
    weights, it would load and give other outputs without a word. The folder's architecture says what it is."""
    _hub_folder(tmp_path, architecture=architecture)
    with pytest.raises(vitfast.CheckpointError, match=rf"holds {re.escape(architecture)}: .*(ResPostBlock|ParallelThingsBlock|ParallelScalingBlock)"):
        vitfast.load_checkpoint(tmp_path)
    with pytest.raises(vitfast.ConfigError, match="cannot be built by vitfast"):
        vitfast.create_model(architecture)
