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
from vitfast.errors import ArtifactError, InputError

from .engine import Engine, is_float_images
from .onnx_engine import OnnxEngine
from .sidecar import read_sidecar, sidecar_path
from .tensorrt_engine import ENGINE_SUFFIXES, TensorRTEngine
from .torch_engine import TorchEngine

__all__ = ["ENGINE_SUFFIXES", "Engine", "is_float_images", "OnnxEngine", "TensorRTEngine", "TorchEngine", "load_engine", "read_sidecar", "sidecar_path"]


BACKENDS = ("auto", "torch", "onnxruntime", "openvino", "tensorrt")


def onnx_backend(int8_target: str | None = None) -> str:
    """`backend="auto"` for a vitfast ONNX file: ONNX Runtime where it has a CUDA GPU or for the
    uint8 `--int8-target cpu` form (OpenVINO lost 10 points of top-1 on it in
    tests/test_export_real_data.py), else OpenVINO when installed (measured faster on CPU for fp32,
    fp16 and int8 files: benchmarks/cpu_runtimes.py), else ONNX Runtime."""
    if int8_target == "cpu":
        return "onnxruntime"
    import importlib.util

    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime as ort

        if "CUDAExecutionProvider" in ort.get_available_providers():
            return "onnxruntime"
    return "openvino" if importlib.util.find_spec("openvino") is not None else "onnxruntime"


def load_engine(path: str | os.PathLike, *, backend: str = "auto", device: str | None = None, optimized: bool = False,
                overrides: dict[str, Any] | None = None, **kwargs) -> Engine:  # fmt: skip
    """An `Engine` for a checkpoint, an ONNX file (vitfast's or another tool's), an Optimum export
    folder or a TensorRT engine, chosen from the path. `overrides`: ViTConfig fields for a checkpoint,
    as `load_checkpoint` takes them (plus `img_size`); for an ONNX file, its preprocessing (all of
    img_size/mean/std/... for a graph without a vitfast sidecar).

    `backend`: "auto" (the fastest this machine has for the artifact: `onnx_backend`), or one of
    "torch" (checkpoints), "onnxruntime" / "openvino" (ONNX files; openvino for vitfast's own), "tensorrt" (engines)."""
    path = Path(path)
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if not path.exists():
        raise ArtifactError(f"no such artifact: {path}")
    suffix = path.suffix.lower()
    kind = "onnx" if suffix == ".onnx" or (path / "model.onnx").is_file() else "engine" if suffix in ENGINE_SUFFIXES else "checkpoint"
    allowed = {"onnx": ("onnxruntime", "openvino"), "engine": ("tensorrt",), "checkpoint": ("torch",)}[kind]
    if backend != "auto" and backend not in allowed:
        raise InputError(f"{path} is a{'n' if kind != 'checkpoint' else ''} {kind}: the {backend} backend cannot run it; "
                         f"use backend {' or '.join(allowed)} (or auto)")  # fmt: skip
    if kind == "onnx":
        ours = path.is_file() and sidecar_path(path).exists()  # vitfast's export: config and input spec in the sidecar
        if backend == "auto":
            backend = onnx_backend((read_sidecar(path).get("int8") or {}).get("target")) if ours else "onnxruntime"
        if backend == "openvino":
            if not ours:
                raise InputError(f"the openvino backend runs ONNX files exported by vitfast (with a .json sidecar); "
                                 f"{path} has none: use backend onnxruntime")  # fmt: skip
            from .openvino_engine import OpenVinoEngine

            return OpenVinoEngine(path, **kwargs)
        return OnnxEngine(path, overrides=overrides, **kwargs)
    if kind == "engine":
        return TensorRTEngine(path, **kwargs)
    overrides = dict(overrides or {})
    img_size = overrides.pop("img_size", None)
    return TorchEngine(load_checkpoint(path, img_size=img_size, overrides=overrides), device=device, optimized=optimized,
                       path=path, **kwargs)  # fmt: skip
