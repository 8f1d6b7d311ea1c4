"""Raw images -> the normalised float tensor a model expects, timm's eval transform.

Resize the shorter side to `floor(img_size / crop_pct)` with the config's interpolation, centre
crop `img_size`, scale to [0, 1], subtract `mean`, divide by `std` (all from the `ViTConfig`).
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
    batch = [_to_pil(img, config.in_chans) for img in _as_list(images)]
    if not batch:
        raise InputError("preprocess got an empty batch of images")
    out = np.stack([_transform(img, config) for img in batch])  # [B, H, W, C] float32 in [0, 1]
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


def _to_pil(img: ImageLike, in_chans: int) -> Image.Image:
    if isinstance(img, Image.Image):
        return img.convert("RGB" if in_chans == 3 else "L")
    arr = img.detach().cpu().numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
    if arr.dtype != np.uint8:
        raise InputError(
            f"raw images must be uint8 [H, W, C], got dtype {arr.dtype}; "
            "already-normalised float images [B, C, H, W] go to the model directly"
        )
    if arr.ndim != 3 or arr.shape[-1] != in_chans:
        raise InputError(f"expected a uint8 image [H, W, {in_chans}] (channels last), got shape {tuple(arr.shape)}")
    return Image.fromarray(arr[..., 0] if in_chans == 1 else arr)


def _transform(img: Image.Image, config: ViTConfig) -> np.ndarray:
    h, w = config.img_hw
    resample = _PIL_FILTERS[config.interpolation]
    if h == w:  # shorter side to floor(size / crop_pct), keeping the aspect ratio
        scale = math.floor(h / config.crop_pct)
        iw, ih = img.size
        if iw <= ih:
            size = (scale, max(scale, round(ih * scale / iw)))
        else:
            size = (max(scale, round(iw * scale / ih)), scale)
    else:
        size = (math.floor(w / config.crop_pct), math.floor(h / config.crop_pct))
    img = img.resize(size, resample)
    left, top = int(round((size[0] - w) / 2.0)), int(round((size[1] - h) / 2.0))  # as torchvision's CenterCrop
    img = img.crop((left, top, left + w, top + h))
    arr = np.asarray(img, dtype=np.float32) / 255.0
    return arr[..., None] if arr.ndim == 2 else arr
