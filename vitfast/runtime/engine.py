"""`Engine`: the base of every runtime backend (input checking and preprocessing).

Images in: normalised float `[B, C, H, W]`, or uint8 `[B, H, W, C]` / PIL images, which go through
`vitfast.preprocess` with the artifact's own preprocessing. Logits out: float32 `[B, classes]`.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitfast.config import ViTConfig
from vitfast.data import other_sizes
from vitfast.errors import ArtifactError, InputError
from vitfast.layers import check_image_shape
from vitfast.preprocessing import preprocess


def is_float_images(images) -> bool:
    """Already-normalised float images (a tensor or array) rather than raw uint8 / PIL ones."""
    return (isinstance(images, torch.Tensor) and images.is_floating_point()) or (
        isinstance(images, np.ndarray) and images.dtype.kind == "f"
    )


class Engine(abc.ABC):
    """Base class: input checking and preprocessing; subclasses implement `_run`.

    NaN or infinite float inputs are refused, as `vitfast serve` refuses them (the logits would be
    NaN); set `engine.allow_nonfinite = True` to pass them through."""

    kind = "base"
    allow_nonfinite = False

    def __init__(self, config: ViTConfig, *, precision: str = "fp32", batch: tuple[int, int, int] | None = None,
                 metadata: dict[str, Any] | None = None, path: Path | None = None):  # fmt: skip
        self.config = config
        self.precision = precision
        self.batch = batch  # (min, opt, max) the artifact was built for; None = any
        self.metadata = metadata or {}
        self.path = path
        sizes = (self.metadata.get("input") or {}).get("image_sizes")  # a dynamic-size TensorRT engine's profile
        self.image_sizes = tuple(tuple(hw) for hw in sizes) if sizes else None  # (min, opt, max) (h, w); None = any

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path or self.config.name}, precision={self.precision})"

    def prepare(self, images) -> torch.Tensor:
        """Any accepted image form -> a checked float32 [B, C, H, W] tensor."""
        if not isinstance(images, (torch.Tensor, np.ndarray, list, tuple)) and not hasattr(images, "getbands"):
            raise InputError(f"{self!r} takes images as a float tensor [B, C, H, W], a uint8 array [B, H, W, C] or PIL images, "
                             f"got {type(images).__name__}")  # fmt: skip
        if isinstance(images, torch.Tensor):
            images = images.detach()  # inference only: a tensor that requires grad is fine
        if isinstance(images, np.ndarray) and images.dtype.kind == "f":  # views (BGR -> RGB's [..., ::-1]) and big-endian too
            x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
        elif is_float_images(images):
            x = images
        else:
            x = preprocess(images, self.config)
        c = self.config
        if x.ndim != 4 or x.shape[1] != c.in_chans or (not c.dynamic_img_size and tuple(x.shape[2:]) != c.img_hw):
            hw = "H, W" if c.dynamic_img_size else ", ".join(map(str, c.img_hw))
            raise InputError(f"{self!r} expects normalised float images [B, {c.in_chans}, {hw}], got shape {tuple(x.shape)}")
        if c.dynamic_img_size:  # any size in whole patches: the model's own check says which size would fit
            check_image_shape(x, c.in_chans, c.img_hw, c.patch_size)
            self._check_image_sizes(*x.shape[2:])
        if x.shape[0] == 0:
            raise InputError("empty batch: give at least one image")
        if not self.allow_nonfinite:
            bad = x.numel() - int(torch.isfinite(x).sum())
            if bad:
                raise InputError(f"non-finite values: {bad} NaN or infinite values in {x.numel()}; give finite, normalised images "
                                 "(or set engine.allow_nonfinite = True to run them anyway)")  # fmt: skip
        if self.batch and not self.batch[0] <= x.shape[0] <= self.batch[2]:
            raise InputError(
                f"batch size {x.shape[0]} is outside this artifact's profile {self.batch[0]}..{self.batch[2]}; "
                "split the batch or re-export with a wider --batch MIN:OPT:MAX"
            )
        return x.float()

    def within_image_sizes(self, h: int, w: int) -> bool:
        """Whether h x w lies in the engine's image-size profile (always, without one)."""
        if self.image_sizes is None:
            return True
        (h0, w0), _, (h1, w1) = self.image_sizes
        return h0 <= h <= h1 and w0 <= w <= w1

    def _check_image_sizes(self, h: int, w: int) -> None:
        if not self.within_image_sizes(h, w):
            (h0, w0), _, (h1, w1) = self.image_sizes
            raise InputError(f"images of {h}x{w} are outside the sizes this engine was built for, {h0}x{w0} to {h1}x{w1} (its TensorRT "
                             f"profile); resize them into that range, or rebuild it with --image-sizes covering {h}x{w}")  # fmt: skip

    def parity_sizes(self) -> list[tuple[int, int]]:
        """Image sizes besides img_size a parity check runs at: the ends of the engine's image-size profile (a TensorRT
        engine's), else `vitfast.data.other_sizes` (none for a fixed-size model)."""
        if self.image_sizes:
            ends = (self.image_sizes[0], self.image_sizes[2])
            return list(dict.fromkeys(hw for hw in ends if hw != tuple(self.config.img_hw)))
        return other_sizes(self.config)

    def __call__(self, images) -> torch.Tensor:
        x = self.prepare(images)
        out = self._run(x)
        if out.shape[0] != x.shape[0]:  # e.g. a traced export whose Reshape baked batch 1 in behind a "dynamic" batch axis
            raise ArtifactError(f"{self!r} returned {out.shape[0]} rows for a batch of {x.shape[0]} images: its batch size is fixed "
                                "inside the graph whatever its input says; run it one image at a time (--batch-size 1), or "
                                "export it again with a batch axis that is really dynamic")  # fmt: skip
        return out

    @abc.abstractmethod
    def _run(self, x: torch.Tensor) -> torch.Tensor:
        """Checked float32 [B, C, H, W] -> float32 logits [B, num_classes], on the backend."""
