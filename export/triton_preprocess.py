"""Server-side preprocessing for Triton: raw uint8 images -> the normalised float tensor a model expects.

This file is self-contained (numpy and the standard library only) because it is copied verbatim
into a Triton model repository as the python-backend model `<name>_preprocess/1/model.py`, where
vitfast, torch and Pillow may not be installed. It reproduces `vitfast.preprocess` exactly: the
same resize (crop_mode "center", "squash" or "border" with its padding), centre crop (offset rounded or floored) and mean/std, with
Pillow's resampling re-done in numpy, including Pillow's 8-bit fixed-point arithmetic, its
rounding of the intermediate image between the two passes and (Pillow >= 13) its choice of which
pass runs first, so the server and `engine(uint8_images)` see bit-identical inputs. Any number of
channels: each is resized on its own, as Pillow resizes "L" and "RGB" images (and `vitfast.preprocess` the others).
"""

import json
import math

import numpy as np

# Pillow's 8-bit resampling: coefficients in fixed point with 22 fractional bits (Resample.c).
PRECISION_BITS = 32 - 8 - 2


def _bicubic(x):
    """Pillow's bicubic kernel (a = -0.5), elementwise."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _bilinear(x):
    """Pillow's triangle kernel, elementwise."""
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


_KERNELS = {"bicubic": (_bicubic, 2.0), "bilinear": (_bilinear, 1.0)}


class PreprocessSpec:
    """What the model expects: image size, channels, mean/std, crop_pct, interpolation, crop mode and rounding."""

    def __init__(self, img_size, in_chans, mean, std, crop_pct, interpolation, crop_mode="center", crop_rounding="round"):
        self.img_size = (int(img_size[0]), int(img_size[1]))
        self.in_chans = int(in_chans)
        self.mean = tuple(float(v) for v in mean)
        self.std = tuple(float(v) for v in std)
        self.crop_pct = float(crop_pct)
        self.interpolation = str(interpolation)
        self.crop_mode = str(crop_mode)
        self.crop_rounding = str(crop_rounding)
        if self.interpolation not in ("bicubic", "bilinear", "nearest"):
            raise ValueError(f"unknown interpolation {self.interpolation!r}")
        if self.crop_mode not in ("center", "squash", "border") or self.crop_rounding not in ("round", "floor"):
            raise ValueError(f"unknown crop_mode {self.crop_mode!r} or crop_rounding {self.crop_rounding!r}")

    @classmethod
    def from_config(cls, config):
        """The spec of a `ViTConfig` (or anything with its preprocessing attributes)."""
        return cls(config.img_hw, config.in_chans, config.mean, config.std, config.crop_pct, config.interpolation,
                   config.crop_mode, config.crop_rounding)  # fmt: skip

    def to_parameters(self):
        """String parameters for a Triton `config.pbtxt` (floats written with full precision)."""
        return {
            "img_size": ",".join(str(v) for v in self.img_size),
            "in_chans": str(self.in_chans),
            "mean": ",".join(repr(v) for v in self.mean),
            "std": ",".join(repr(v) for v in self.std),
            "crop_pct": repr(self.crop_pct),
            "interpolation": self.interpolation,
            "crop_mode": self.crop_mode,
            "crop_rounding": self.crop_rounding,
        }

    @classmethod
    def from_parameters(cls, params):
        """Inverse of `to_parameters`."""

        def floats(key):
            return [float(v) for v in params[key].split(",")]

        return cls([int(v) for v in params["img_size"].split(",")], int(params["in_chans"]), floats("mean"),
                   floats("std"), float(params["crop_pct"]), params["interpolation"],
                   params.get("crop_mode", "center"), params.get("crop_rounding", "round"))  # fmt: skip


def _coefficients(in_size, out_size, kernel, support):
    """Per output pixel: first source index, tap count and integer weights (Pillow's precompute_coeffs)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = support * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    # C's (int) cast truncates toward zero; clamping to the image makes that equal to floor here.
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5), in_size).astype(np.int64) - xmin
    taps = np.arange(ksize)
    weights = kernel(((taps[None, :] + xmin[:, None]) - center[:, None] + 0.5) * (1.0 / filterscale))
    weights = np.where(taps[None, :] < xmax[:, None], weights, 0.0)
    total = np.zeros(out_size)
    for tap in range(ksize):  # summed in Pillow's order: the rounding of the total matters
        total = total + weights[:, tap]
    weights = weights / np.where(total != 0.0, total, 1.0)[:, None]
    fixed = np.trunc(weights * (1 << PRECISION_BITS) + np.where(weights < 0, -0.5, 0.5)).astype(np.int64)
    return xmin, xmax, fixed


def _resample_axis(image, out_size, axis, kernel, support):
    """One Pillow 8-bit convolution pass along `axis` of a uint8 [H, W, C] image."""
    source = np.ascontiguousarray(np.swapaxes(image, 0, axis)).astype(np.int64)  # gathers along axis 0 are fastest
    xmin, xmax, fixed = _coefficients(source.shape[0], out_size, kernel, support)
    acc = np.full((out_size,) + source.shape[1:], 1 << (PRECISION_BITS - 1), dtype=np.int64)
    for tap in range(fixed.shape[1]):
        index = np.minimum(xmin + tap, source.shape[0] - 1)  # taps past xmax have weight 0
        weight = np.where(tap < xmax, fixed[:, tap], 0)
        acc += source[index] * weight[:, None, None]
    return np.swapaxes(np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8), 0, axis)


def _nearest_index(in_size, out_size):
    """Source index per output pixel as Pillow's ImagingScaleAffine computes it (accumulated)."""
    step = in_size / out_size
    position = step * 0.5
    index = np.empty(out_size, dtype=np.int64)
    for i in range(out_size):  # Pillow adds the step repeatedly; its rounding decides ties
        index[i] = int(position)
        position += step
    return np.minimum(index, in_size - 1)


def resize(image, size, interpolation):
    """uint8 [H, W, C] -> [size[1], size[0], C] exactly as `PIL.Image.resize(size, filter)`."""
    width, height = size
    if (image.shape[1], image.shape[0]) == (width, height):
        return image.copy()
    if interpolation == "nearest":
        return image[_nearest_index(image.shape[0], height)][:, _nearest_index(image.shape[1], width)]
    kernel, support = _KERNELS[interpolation]
    # Two passes, each rounded to uint8. Pillow >= 13 runs the vertical one first when the height
    # shrinks by more than twice as many pixels as the width; the order changes the rounding.
    shrink_h, shrink_w = image.shape[0] - height, image.shape[1] - width
    axes = (0, 1) if shrink_h > 0 and shrink_h > 2 * shrink_w else (1, 0)
    for axis in axes:
        target = height if axis == 0 else width
        if image.shape[axis] != target:
            image = _resample_axis(image, target, axis, kernel, support)
    return image


def _resize_size(height, width, spec):
    """The (width, height) the image is resized to before the centre crop (vitfast.preprocessing.resize_size)."""
    h, w = spec.img_size
    scale_h, scale_w = math.floor(h / spec.crop_pct), math.floor(w / spec.crop_pct)
    if spec.crop_mode == "squash":
        return scale_w, scale_h
    if spec.crop_mode == "center" and scale_h == scale_w:
        if width <= height:
            return scale_w, int(scale_w * height / width)
        return int(scale_h * width / height), scale_h
    ratios = (height / scale_h, width / scale_w)
    ratio = max(ratios) if spec.crop_mode == "border" else min(ratios)
    return max(1, round(width / ratio)), max(1, round(height / ratio))


def _pad_to(image, height, width, mean):
    """Pad to at least height x width with round(255 * mean), centred (vitfast.preprocessing._pad_to)."""
    out_h, out_w = max(height, image.shape[0]), max(width, image.shape[1])
    canvas = np.empty((out_h, out_w, image.shape[2]), dtype=np.uint8)
    canvas[...] = np.asarray([round(255 * m) for m in mean], dtype=np.uint8)
    top, left = (out_h - image.shape[0]) // 2, (out_w - image.shape[1]) // 2
    canvas[top : top + image.shape[0], left : left + image.shape[1]] = image
    return canvas


def _offset(size, crop, rounding):
    """Start of the centre crop (vitfast.preprocessing.crop_offset)."""
    return (size - crop) // 2 if rounding == "floor" else int(round((size - crop) / 2.0))


def _centre_crop(image, height, width, rounding):
    """The centre box of Pillow's crop (crop_pct <= 1, so the resized or padded image always covers it)."""
    top = _offset(image.shape[0], height, rounding)
    left = _offset(image.shape[1], width, rounding)
    return image[top : top + height, left : left + width]


def preprocess_image(image, spec):
    """One uint8 image [H, W, C] -> float32 [C, img_h, img_w], normalised."""
    if image.dtype != np.uint8:
        raise ValueError(f"raw images must be uint8, got {image.dtype}")
    if image.ndim != 3 or image.shape[2] != spec.in_chans:
        raise ValueError(f"expected uint8 images [H, W, {spec.in_chans}] (channels last), got {list(image.shape)}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"image has no pixels: shape {list(image.shape)}; send uint8 images [B, H, W, {spec.in_chans}] with H, W >= 1")
    h, w = spec.img_size
    resized = resize(image, _resize_size(image.shape[0], image.shape[1], spec), spec.interpolation)
    if spec.crop_mode == "border":
        resized = _pad_to(resized, h, w, spec.mean)
    pixels = _centre_crop(resized, h, w, spec.crop_rounding).astype(np.float32) / 255.0
    mean, std = np.asarray(spec.mean, dtype=np.float32), np.asarray(spec.std, dtype=np.float32)
    return ((pixels - mean) / std).transpose(2, 0, 1)


def preprocess_batch(images, spec):
    """uint8 [B, H, W, C] -> float32 [B, C, img_h, img_w], normalised (`vitfast.preprocess`'s result)."""
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"expected a batch of uint8 images [B, H, W, {spec.in_chans}], got shape {list(images.shape)}")
    if images.shape[0] == 0:
        raise ValueError(f"empty batch: send at least one image, shape [B>=1, H, W, {spec.in_chans}]")
    return np.ascontiguousarray(np.stack([preprocess_image(image, spec) for image in images]))


class TritonPythonModel:
    """Triton python-backend model: input `images` UINT8 [B, H, W, C] -> output `pixels` FP32 [B, C, H, W].

    A bad request (wrong dtype, no pixels) gets its own error response; the others in the batch are served.
    """

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.spec = PreprocessSpec.from_parameters(params)

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils  # only exists inside Triton's python backend

        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "images").as_numpy()
            try:
                pixels = preprocess_batch(images, self.spec)
            except ValueError as exc:  # a client error: HTTP 400 / gRPC INVALID_ARGUMENT where Triton has the code
                code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
                error = pb_utils.TritonError(f"preprocessing: {exc}", *([code] if code is not None else []))
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("pixels", pixels)]))
        return responses
