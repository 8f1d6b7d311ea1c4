"""Meta's original DINOv2 `.pth` files (facebookresearch/dinov2's torch.hub weights, e.g. dinov2_vits14_reg4_pretrain.pth),
written here from vitfast models of timm's DINOv2 names by running timm's `_convert_dinov2` backwards: each loads into
the weights it came from, as the registered model of its shapes."""

from __future__ import annotations

import pytest
import torch

import vitfast
from conftest import randomize
from vitfast.convert import timm_config, timm_layout

# (registered name, overrides that keep it small but keep its structure)
SMALL = {
    "plain": ("vit_small_patch14_dinov2", dict(img_size=56, depth=2)),
    "reg4": ("vit_small_patch14_reg4_dinov2", dict(img_size=56, depth=2)),
    "giant-swiglu": ("vit_giant_patch14_dinov2", dict(img_size=56, depth=2, embed_dim=96, num_heads=4)),
    "giant-swiglu-reg4": ("vit_giant_patch14_reg4_dinov2", dict(img_size=56, depth=2, embed_dim=96, num_heads=4)),
}
DINOV2_NAMES = [n for n in vitfast.list_models() if n.endswith("_dinov2")]
PREPROCESSING = {"mean", "std", "crop_pct", "interpolation", "crop_mode"}


def _to_meta(model) -> dict[str, torch.Tensor]:
    """Meta's layout of a vitfast DINOv2 (timm's names): its masked-image-modelling token added; the giant's packed SwiGLU
    as SwiGLUFFNFused's w12 / w3; registers as register_tokens, with a class-token row in pos_embed that Meta adds to the
    class token before inserting the registers (so the class token stored is the model's minus that row). Stored in
    float64, where undoing that subtraction gives the float32 model's class token back exactly."""
    sd = {k: v.double() for k, v in model.state_dict().items()}
    dim = model.config.embed_dim
    if model.config.mlp_layer == "swiglu_packed":
        sd = {k.replace(".mlp.fc1.", ".mlp.w12.").replace(".mlp.fc2.", ".mlp.w3."): v for k, v in sd.items()}
    if "reg_token" in sd:
        cls_pos = torch.randn(1, 1, dim, dtype=torch.float64)
        sd["register_tokens"] = sd.pop("reg_token")
        sd["pos_embed"] = torch.cat([cls_pos, sd["pos_embed"]], dim=1)
        sd["cls_token"] = sd["cls_token"] - cls_pos
    return sd | {"mask_token": torch.randn(1, dim, dtype=torch.float64)}


def _assert_same_config(read: vitfast.ViTConfig, registered: vitfast.ViTConfig) -> None:
    """Equal but for what no weights can tell apart: the layer scale's init (the weights overwrite it), fc_norm None
    (timm's rule, here False) and the MLP ratio of the same width (timm's giant: 2.66667 * 2, the weights': 8192 / 1536)."""
    assert read.mlp_hidden == registered.mlp_hidden
    assert read == registered.replace(init_values=1e-6, fc_norm=False, mlp_ratio=read.mlp_ratio)


@pytest.mark.parametrize("variant", list(SMALL))
def test_meta_checkpoint_loads_the_weights_it_came_from(tmp_path, variant):
    name, kw = SMALL[variant]
    source = randomize(vitfast.create_model(name, **kw)).eval()
    torch.save(_to_meta(source), tmp_path / "dinov2_pretrain.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match="timm.s DINOv2 defaults assumed"):
        loaded = vitfast.load_checkpoint(tmp_path / "dinov2_pretrain.pth", overrides={"num_heads": kw.get("num_heads", 6)})
    assert set(loaded.config_guesses) == PREPROCESSING
    _assert_same_config(loaded.config, source.config)
    assert loaded.state_dict().keys() == source.state_dict().keys()
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    x = torch.randn(2, 3, kw["img_size"], kw["img_size"])
    with torch.no_grad():
        assert torch.equal(loaded.forward_features(x), source.forward_features(x))
        assert torch.equal(loaded(x), source(x))


@pytest.mark.parametrize("name", DINOV2_NAMES)
def test_meta_checkpoint_of_released_shapes_reads_as_the_registered_model(name):
    """At the released sizes (518 px, 37 x 37 patches; the giant's SwiGLU) the config is the registered model's, its
    head count and preprocessing taken from it and said to be."""
    with torch.device("meta"):
        meta = _to_meta(vitfast.create_model(name))
    sd, family = timm_layout(meta, "dinov2.pth")
    cfg, guesses = timm_config(sd, family)
    _assert_same_config(cfg, vitfast.get_config(name))
    assert set(guesses) == PREPROCESSING | {"num_heads"} and name in guesses["num_heads"]


def test_a_config_given_takes_meta_weights_too(tmp_path):
    name, kw = SMALL["reg4"]
    source = randomize(vitfast.create_model(name, **kw)).eval()
    torch.save(_to_meta(source), tmp_path / "dinov2.pth")
    loaded = vitfast.load_checkpoint(tmp_path / "dinov2.pth", config=source.config)
    assert not loaded.config_guesses
    x = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))


def test_registers_without_a_class_token_position_are_refused(tmp_path):
    """Meta's pos_embed has a row for the class token; one without it is not Meta's layout, and folding a patch's
    position into the class token would load something else."""
    source = randomize(vitfast.create_model(SMALL["reg4"][0], **SMALL["reg4"][1]))
    meta = _to_meta(source)
    torch.save(meta | {"pos_embed": meta["pos_embed"][:, 1:]}, tmp_path / "dinov2.pth")
    with pytest.raises(vitfast.CheckpointError, match=r"pos_embed of shape \[1, 16, 384\].*one row for the class token"):
        vitfast.load_checkpoint(tmp_path / "dinov2.pth")


def test_other_mask_tokens_are_not_taken_for_meta_dinov2(tmp_path):
    """MAE's and BEiT's mask tokens are [1, 1, C]: not Meta's DINOv2, so reported, not dropped."""
    model = randomize(vitfast.create_model(SMALL["plain"][0], **SMALL["plain"][1]))
    torch.save(model.state_dict() | {"mask_token": torch.zeros(1, 1, 384)}, tmp_path / "mae.pth")
    with pytest.raises(vitfast.CheckpointError, match=r"1 unexpected: mask_token\. The unexpected weights have no place"):
        vitfast.load_checkpoint(tmp_path / "mae.pth", overrides={"num_heads": 6})
