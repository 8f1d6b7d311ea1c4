"""Parity against timm itself. timm needs torchvision, which does not install beside the CPU
torch used here, so these tests skip unless timm imports (`make test-timm` builds a venv where it does)."""

from __future__ import annotations

import pytest
import torch

import vitfast
from conftest import randomize

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
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("variant", ["plain", "deit-distilled", "hybrid-r26"])
def test_timm_config_inferred_from_shapes(tmp_path, variant):
    name, kw = VARIANTS[variant]
    ref = _timm_model(name, **kw)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "model.safetensors")
    ours = vitfast.load_checkpoint(tmp_path / "model.safetensors")
    x = torch.randn(2, 3, kw["img_size"], kw["img_size"])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", ["plain", "deit-distilled", "deit3-layerscale", "reg4-gap"])
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


def test_registry_matches_timm_architectures():
    """Every registered timm name builds the same parameter shapes as timm's own model."""
    for name in vitfast.list_models():
        if name not in timm.list_models():
            continue
        with torch.device("meta"):
            ref = timm.create_model(name, pretrained=False)
            ours = vitfast.create_model(name)
        ref_shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
        our_shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
        assert our_shapes == ref_shapes, name
        cfg = ref.pretrained_cfg
        assert tuple(cfg["mean"]) == ours.config.mean and cfg["crop_pct"] == ours.config.crop_pct, name


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize(
    "crop_mode, crop_pct, img_size", [("center", 0.875, 224), ("center", 0.9, 32), ("squash", 0.875, 32), ("center", 0.95, (24, 40))]
)
def test_preprocess_matches_timm_eval_transform(crop_mode, crop_pct, img_size, interpolation):
    """vitfast.preprocess == timm's create_transform(is_training=False) on PIL images of many shapes."""
    import numpy as np
    from PIL import Image
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
