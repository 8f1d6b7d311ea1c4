"""One runtime for every artifact: `load_engine(path)` -> `Engine`, and `engine(images) -> logits`.

- a vitfast / timm / Hugging Face checkpoint: `TorchEngine`, the PyTorch reference model (optionally optimized);
- an ONNX file (`.onnx`): `OnnxEngine`, ONNX Runtime, CUDA provider when present, else CPU;
- a TensorRT engine (`.engine` / `.plan` / `.trt`): `TensorRTEngine`.
Images in: normalised float `[B, C, H, W]`, or uint8 `[B, H, W, C]` / PIL images, which go through
`vitfast.preprocess` with the artifact's own preprocessing. Logits out: float32 `[B, classes]`.
The runtime reads artifacts and their sidecars (`sidecar.py`); it never imports `vitfast.export`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vitfast.checkpoint import load_checkpoint
from vitfast.errors import ArtifactError

from .engine import Engine, is_float_images
from .onnx_engine import OnnxEngine
from .sidecar import read_sidecar, sidecar_path
from .tensorrt_engine import ENGINE_SUFFIXES, TensorRTEngine
from .torch_engine import TorchEngine

__all__ = ["ENGINE_SUFFIXES", "Engine", "is_float_images", "OnnxEngine", "TensorRTEngine", "TorchEngine", "load_engine", "read_sidecar", "sidecar_path"]


def load_engine(path: str | os.PathLike, *, device: str | None = None, optimized: bool = False,
                overrides: dict[str, Any] | None = None, **kwargs) -> Engine:  # fmt: skip
    """An `Engine` for a checkpoint, an ONNX file (vitfast's or another tool's), an Optimum export
    folder or a TensorRT engine, chosen from the path. `overrides`: ViTConfig fields for a checkpoint,
    as `load_checkpoint` takes them (plus `img_size`); for an ONNX file, its preprocessing (all of
    img_size/mean/std/... for a graph without a vitfast sidecar)."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"no such artifact: {path}")
    suffix = path.suffix.lower()
    if suffix == ".onnx" or (path / "model.onnx").is_file():
        return OnnxEngine(path, overrides=overrides, **kwargs)
    if suffix in ENGINE_SUFFIXES:
        return TensorRTEngine(path, **kwargs)
    overrides = dict(overrides or {})
    img_size = overrides.pop("img_size", None)
    return TorchEngine(load_checkpoint(path, img_size=img_size, overrides=overrides), device=device, optimized=optimized,
                       path=path, **kwargs)  # fmt: skip
