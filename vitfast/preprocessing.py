"""Raw images -> the normalised float tensor a model expects, as the checkpoint's source does it.

With `scale = floor(img_size / crop_pct)` per side (all settings from the `ViTConfig`):
- `crop_mode="center"` (timm's default eval transform, Hugging Face `shortest_edge` processors):
  the shorter side to `scale`, the longer one `int(scale * long / short)` as torchvision's
  `Resize(int)`; a non-square `img_size` resizes by one ratio, rounded, as timm's `ResizeKeepRatio`, with the
  config's filter as timm 1.0.31 passes it (timm 1.0.30 and earlier resized bilinearly there, whatever the filter);
- `crop_mode="squash"` (Hugging Face `ViTImageProcessor`/`DeiTImageProcessor`, timm's squash):
  both sides straight to `scale`, ignoring the aspect ratio;
- `crop_mode="border"` (timm's `ResizeKeepRatio(longest=1)` + `CenterCropOrPad`): the longer side
  to `scale` by one ratio, rounded (at least 1 pixel: timm fails on such a sliver), and a side
  shorter than `img_size` padded evenly (the extra pixel right/bottom) with the colour
  `round(255 * mean)`, which normalises to about 0;
then the centre `img_size` crop (offset rounded as torchvision's `CenterCrop`, or floored as
Hugging Face's `center_crop` with `crop_rounding="floor"`), scale to [0, 1], subtract `mean`,
divide by `std`. Resampling is Pillow's, as both timm (on PIL images) and HF's PIL processors use.
Images with transparency become RGB by Pillow's `convert("RGB")` (timm), or composited onto white first with
`alpha_on_white` (the HF processors with `do_convert_rgb`).
"""

from __future__ import annotations

import math
from typing import Iterable, Union

import numpy as np
import torch
from PIL import Image

from .config import ViTConfig
from .errors import InputError

ImageLike = Union[Image.Image, np.ndarray, torch.Tensor]
_PIL_FILTERS = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR, "nearest": Image.Resampling.NEAREST}


def preprocess(images: ImageLike | Iterable[ImageLike], config: ViTConfig) -> torch.Tensor:
    """PIL image(s) or uint8 arrays [H, W, C] / [B, H, W, C] -> float32 [B, C, img_h, img_w]."""
    batch = [_to_planes(img, config) for img in _as_list(images)]
    if not batch:
        raise InputError("preprocess got an empty batch of images")
    out = np.stack([_transform(planes, config) for planes in batch])  # [B, H, W, C] float32 in [0, 1]
    mean = np.asarray(config.mean, dtype=np.float32)
    std = np.asarray(config.std, dtype=np.float32)
    return torch.from_numpy((out - mean) / std).permute(0, 3, 1, 2).contiguous()


def _as_list(images) -> list:
    if isinstance(images, Image.Image):
        return [images]
    if isinstance(images, (np.ndarray, torch.Tensor)):
        arr = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else images
        if arr.ndim == 3:
            return [arr]
        if arr.ndim == 4:
            return list(arr)
        raise InputError(f"expected uint8 images [H, W, C] or [B, H, W, C], got shape {tuple(arr.shape)}")
    return list(images)


def _to_planes(img: ImageLike, config: ViTConfig) -> list[Image.Image]:
    """The image as the Pillow images to resize: one "RGB" or "L" image, or for another channel count one "L" image per
    channel (of a uint8 array, or the bands of a PIL image with that many). Pillow would take a 2- or 4-channel array
    for LA / RGBA, and its resize premultiplies the other channels by the last one as alpha; a model's channels are
    independent."""
    in_chans = config.in_chans
    if isinstance(img, Image.Image):
        if config.alpha_on_white and has_alpha(img):  # transformers' convert_to_rgb
            img = Image.alpha_composite(Image.new("RGBA", img.size, (255, 255, 255, 255)), img.convert("RGBA"))
        if in_chans in (1, 3):
            return [img.convert("RGB" if in_chans == 3 else "L")]
        if len(img.getbands()) != in_chans:  # converting would make up channels (or turn every one into grey)
            raise InputError(f"a {img.mode} image has {len(img.getbands())} channels and this model takes {in_chans}: give images "
                             f"with {in_chans} bands, or uint8 arrays [H, W, {in_chans}]")  # fmt: skip
        return list(img.split())
    arr = img.detach().cpu().numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
    if arr.dtype != np.uint8:
        raise InputError(
            f"raw images must be uint8 [H, W, C], got dtype {arr.dtype}; "
            "already-normalised float images [B, C, H, W] go to the model directly"
        )
    if arr.ndim != 3 or arr.shape[-1] != in_chans:
        raise InputError(f"expected a uint8 image [H, W, {in_chans}] (channels last), got shape {tuple(arr.shape)}")
    if in_chans == 3:
        return [Image.fromarray(arr)]
    return [Image.fromarray(np.ascontiguousarray(arr[..., c])) for c in range(in_chans)]


def has_alpha(img: Image.Image) -> bool:
    """Whether an image has transparency, as transformers' `convert_to_rgb` tells it: an alpha band, or a transparent
    colour (a palette or greyscale PNG's `transparency`)."""
    return "A" in img.getbands() or img.info.get("transparency") is not None


def resize_size(height: int, width: int, config: ViTConfig) -> tuple[int, int]:
    """(width, height) an image is resized to before the centre crop (see the module docstring)."""
    h, w = config.img_hw
    scale_h, scale_w = math.floor(h / config.crop_pct), math.floor(w / config.crop_pct)
    if config.crop_mode == "squash":
        return scale_w, scale_h
    if config.crop_mode == "center" and scale_h == scale_w:  # torchvision Resize(int): shorter side exact, longer truncated
        if width <= height:
            return scale_w, int(scale_w * height / width)
        return int(scale_h * width / height), scale_h
    ratios = (height / scale_h, width / scale_w)  # timm ResizeKeepRatio: longest=0 (center) or 1 (border)
    ratio = max(ratios) if config.crop_mode == "border" else min(ratios)
    return max(1, round(width / ratio)), max(1, round(height / ratio))


def crop_offset(size: int, crop: int, rounding: str) -> int:
    """Start of the centre crop: torchvision rounds half to even, Hugging Face floors."""
    return (size - crop) // 2 if rounding == "floor" else int(round((size - crop) / 2.0))


def _pad_to(img: Image.Image, width: int, height: int, mean: tuple[float, ...]) -> Image.Image:
    """Pad to at least width x height, centred as timm's `center_crop_or_pad` (odd pixel right/bottom)."""
    fill = tuple(round(255 * m) for m in mean)
    canvas = Image.new(img.mode, (max(width, img.size[0]), max(height, img.size[1])), fill if len(fill) > 1 else fill[0])
    canvas.paste(img, ((canvas.size[0] - img.size[0]) // 2, (canvas.size[1] - img.size[1]) // 2))
    return canvas


def _transform(planes: list[Image.Image], config: ViTConfig) -> np.ndarray:
    """Each plane resized, padded and cropped; their channels together as float32 [img_h, img_w, C] in [0, 1]."""
    out, first = [], 0
    for img in planes:
        chans = len(img.getbands())
        out.append(_transform_plane(img, config, config.mean[first : first + chans]))
        first += chans
    return np.concatenate(out, axis=-1)


def _transform_plane(img: Image.Image, config: ViTConfig, mean: tuple[float, ...]) -> np.ndarray:
    if 0 in img.size:
        raise InputError(f"empty image: {img.size[0]}x{img.size[1]} pixels; give images at least 1x1 (they are resized to {config.img_hw})")
    h, w = config.img_hw
    size = resize_size(img.size[1], img.size[0], config)
    img = img.resize(size, _PIL_FILTERS[config.interpolation])
    if config.crop_mode == "border" and (size[0] < w or size[1] < h):
        img = _pad_to(img, w, h, mean)
        size = img.size
    left, top = crop_offset(size[0], w, config.crop_rounding), crop_offset(size[1], h, config.crop_rounding)
    img = img.crop((left, top, left + w, top + h))
    arr = np.asarray(img, dtype=np.float32) / 255.0
    return arr[..., None] if arr.ndim == 2 else arr
