"""MAC counts against torch's FLOP counter, and preprocessing against a hand-made expectation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

import vitfast
from vitfast.flops import count_macs, count_params


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("vit_base_patch16_224", {}),
        ("deit_tiny_distilled_patch16_224", {}),
        ("vit_base_patch16_reg4_gap_256", {}),
        ("vit_base_r50_s16_224", dict(depth=2)),
        ("vit_small_r26_s32_224", dict(img_size=96, depth=1)),
        ("vit_cifar_patch4_32", dict(representation_size=32)),
        ("vit_cifar_patch4_32", dict(class_token=False, global_pool="map", reg_tokens=2)),
        ("vit_cifar_patch4_32", dict(global_pool="token_avg", representation_size=32)),
        ("vit_giant_patch14_reg4_dinov2", dict(img_size=56, depth=2)),
        ("aimv2_large_patch14_224", dict(depth=2)),
        ("vit_small_plus_patch16_dinov3", dict(depth=2)),
        ("vit_base_patch16_siglip_224", dict(depth=2, attn_pool_mlp_ratio=2.0)),  # the pool's MLP has its own width
        ("vit_pe_core_base_patch16_224", dict(depth=2)),  # the pool reads the class token too (pool_include_prefix)
    ],
)
def test_mac_count_matches_torch_flop_counter(name, overrides):
    cfg = vitfast.get_config(name, **overrides)
    with torch.device("meta"):
        model = vitfast.create_model(cfg).set_fused_attn(False)
        x = torch.empty(1, cfg.in_chans, *cfg.img_hw)
    with FlopCounterMode(display=False) as counter:
        model(x)
    assert count_macs(cfg) == counter.get_total_flops() // 2


def test_vit_base_numbers():
    cfg = vitfast.get_config("vit_base_patch16_224")
    assert 17.5e9 <= count_macs(cfg) <= 17.6e9
    assert count_params(cfg) == 86_567_656


def _gradient_image(w, h):
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None, None]
    return np.concatenate([np.broadcast_to(x, (h, w, 1)), np.broadcast_to(y, (h, w, 1)), np.full((h, w, 1), 128.0)], 2).astype(np.uint8)


def test_preprocess_resize_crop_normalise():
    cfg = vitfast.get_config("vit_cifar_patch4_32", crop_pct=0.5, interpolation="bilinear")
    img = _gradient_image(128, 96)  # landscape: shorter side 96 -> 64, width 128 -> 85
    out = vitfast.preprocess(img, cfg)
    assert out.shape == (1, 3, 32, 32) and out.dtype == torch.float32
    resized = Image.fromarray(img).resize((85, 64), Image.Resampling.BILINEAR)
    left, top = round((85 - 32) / 2), round((64 - 32) / 2)
    crop = np.asarray(resized.crop((left, top, left + 32, top + 32)), dtype=np.float32) / 255
    expected = (crop - np.array(cfg.mean, dtype=np.float32)) / np.array(cfg.std, dtype=np.float32)
    np.testing.assert_allclose(out[0].permute(1, 2, 0).numpy(), expected, atol=1e-6)


def test_preprocess_border_keeps_the_whole_image_and_pads_with_the_mean():
    """timm's border mode: longest side to img_size / crop_pct, the short side padded with round(255 * mean)."""
    cfg = vitfast.get_config("vit_cifar_patch4_32", crop_pct=0.8, crop_mode="border", interpolation="bilinear")
    img = _gradient_image(25, 80)  # portrait: height 80 -> 40, width 25 -> round(12.5) = 12, padded 10 + 10 to 32
    out = vitfast.preprocess(img, cfg)[0].permute(1, 2, 0).numpy()
    resized = np.asarray(Image.fromarray(img).resize((12, 40), Image.Resampling.BILINEAR), dtype=np.float32)
    padded = np.empty((40, 32, 3), np.float32)
    padded[:] = [round(255 * m) for m in cfg.mean]
    padded[:, 10:22] = resized
    expected = (padded[4:36] / 255 - np.array(cfg.mean, dtype=np.float32)) / np.array(cfg.std, dtype=np.float32)
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_preprocess_batches_pil_arrays_and_tensors_alike():
    cfg = vitfast.get_config("vit_cifar_patch4_32")
    imgs = np.stack([_gradient_image(40, 40), _gradient_image(40, 40)[::-1].copy()])
    from_array = vitfast.preprocess(imgs, cfg)
    from_tensor = vitfast.preprocess(torch.from_numpy(imgs), cfg)
    from_pil = vitfast.preprocess([Image.fromarray(i) for i in imgs], cfg)
    assert from_array.shape == (2, 3, 32, 32)
    assert torch.equal(from_array, from_tensor) and torch.equal(from_array, from_pil)
    model = vitfast.create_model(cfg)
    with torch.no_grad():
        assert model(from_array).shape == (2, 10)


@pytest.mark.parametrize("crop_mode", ["center", "border"])
@pytest.mark.parametrize("channels", [2, 4])
def test_preprocess_resizes_each_channel_of_a_2_or_4_channel_array_on_its_own(channels, crop_mode):
    """A 2- or 4-channel array is not LA / RGBA: Pillow's resize of those premultiplies by the last channel (alpha)."""
    cfg = vitfast.ViTConfig(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=1, num_classes=2, in_chans=channels,
                            mean=(0.25,) * channels, std=(0.5,) * channels, crop_pct=0.8, crop_mode=crop_mode)  # fmt: skip
    img = np.random.default_rng(0).integers(0, 256, (45, 61, channels), dtype=np.uint8)
    img[..., -1] = np.arange(61) % 2 * 255  # a half-transparent "alpha" is where premultiplying shows most
    size = vitfast.preprocessing.resize_size(45, 61, cfg)
    planes = []
    for c in range(channels):  # the reference: each channel as its own "L" image, padded and cropped as usual
        plane = Image.new("L", (max(size[0], 32), max(size[1], 32)), round(255 * 0.25))
        plane.paste(Image.fromarray(img[..., c].copy()).resize(size, Image.Resampling.BICUBIC),
                    ((plane.size[0] - size[0]) // 2, (plane.size[1] - size[1]) // 2))  # fmt: skip
        left, top = round((plane.size[0] - 32) / 2), round((plane.size[1] - 32) / 2)
        planes.append(np.asarray(plane.crop((left, top, left + 32, top + 32)), dtype=np.float32))
    expected = (np.stack(planes) / 255 - np.float32(0.25)) / np.float32(0.5)
    np.testing.assert_array_equal(vitfast.preprocess(img, cfg)[0].numpy(), expected)


def test_a_4_channel_model_takes_a_pil_image_band_by_band_and_refuses_other_band_counts():
    """An RGBA PIL image for a 4-channel model gives what its uint8 array gives (each band resized on its own); an RGB
    one is refused rather than converted (which made every channel the grey image: mean/std broadcast over one band)."""
    cfg = vitfast.ViTConfig(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=1, num_classes=2, in_chans=4,
                            mean=(0.25,) * 4, std=(0.5,) * 4)  # fmt: skip
    arr = np.random.default_rng(2).integers(0, 256, (37, 51, 4), dtype=np.uint8)
    assert torch.equal(vitfast.preprocess(Image.fromarray(arr), cfg), vitfast.preprocess(arr, cfg))
    with pytest.raises(vitfast.InputError, match="a RGB image has 3 channels and this model takes 4"):
        vitfast.preprocess(Image.fromarray(arr[..., :3]), cfg)


def test_preprocess_keeps_a_3_channel_model_s_rgba_photo_as_pillow_converts_it():
    """An RGBA photo for an RGB model is still Pillow's convert("RGB") (not split per channel)."""
    cfg = vitfast.get_config("vit_cifar_patch4_32")
    rgba = np.random.default_rng(1).integers(0, 256, (40, 40, 4), dtype=np.uint8)
    out = vitfast.preprocess(Image.fromarray(rgba), cfg)
    assert torch.equal(out, vitfast.preprocess(Image.fromarray(rgba).convert("RGB"), cfg))


@pytest.mark.parametrize(
    "bad, message",
    [
        (np.zeros((8, 8, 3), dtype=np.float32), "must be uint8"),
        (np.zeros((8, 8, 4), dtype=np.uint8), r"expected a uint8 image \[H, W, 3\]"),
        (np.zeros((2, 2, 8, 8, 3), dtype=np.uint8), "got shape"),
        ([], "empty batch"),
    ],
)
def test_preprocess_rejects_bad_images(bad, message):
    with pytest.raises(vitfast.InputError, match=message):
        vitfast.preprocess(bad, vitfast.get_config("vit_cifar_patch4_32"))
