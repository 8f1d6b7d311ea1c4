"""One runtime for every artifact: `load_engine(path)` -> `Engine`, and `engine(images) -> logits`.

- a vitfast / timm / Hugging Face checkpoint: the PyTorch reference model (optionally optimized);
- an ONNX file (`.onnx`): ONNX Runtime, CUDA provider when present, else CPU;
- a TensorRT engine (`.engine` / `.plan` / `.trt`): `vitfast.export.tensorrt.TensorRTEngine`.
Images in: normalised float `[B, C, H, W]`, or uint8 `[B, H, W, C]` / PIL images, which go through
`vitfast.preprocess` with the artifact's own preprocessing. Logits out: float32 `[B, classes]`.
"""

from __future__ import annotations

import abc
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import PREPROCESSING_FIELDS, ViTConfig
from .errors import ArtifactError, BackendUnavailable, InputError
from .preprocessing import preprocess

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")


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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path or self.config.name}, precision={self.precision})"

    def prepare(self, images) -> torch.Tensor:
        """Any accepted image form -> a checked float32 [B, C, H, W] tensor."""
        if not isinstance(images, (torch.Tensor, np.ndarray, list, tuple)) and not hasattr(images, "getbands"):
            raise InputError(f"{self!r} takes images as a float tensor [B, C, H, W], a uint8 array [B, H, W, C] or PIL images, "
                             f"got {type(images).__name__}")  # fmt: skip
        if isinstance(images, torch.Tensor):
            images = images.detach()  # inference only: a tensor that requires grad is fine
        if is_float_images(images):
            x = torch.as_tensor(images)
        else:
            x = preprocess(images, self.config)
        h, w = self.config.img_hw
        expected = f"[B, {self.config.in_chans}, {h}, {w}]"
        if x.ndim != 4 or tuple(x.shape[1:]) != (self.config.in_chans, h, w):
            raise InputError(f"{self!r} expects normalised float images {expected}, got shape {tuple(x.shape)}")
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

    def __call__(self, images) -> torch.Tensor:
        return self._run(self.prepare(images))

    @abc.abstractmethod
    def _run(self, x: torch.Tensor) -> torch.Tensor:
        """Checked float32 [B, C, H, W] -> float32 logits [B, num_classes], on the backend."""


class TorchEngine(Engine):
    """The PyTorch model from a checkpoint; `optimized=True` swaps in the Triton kernels."""

    kind = "pytorch"

    def __init__(self, model: torch.nn.Module, *, device: str | None = None, dtype: torch.dtype = torch.float32,
                 optimized: bool = False, path: Path | None = None):  # fmt: skip
        precision = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
        super().__init__(model.config, precision=precision, path=path)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype
        self.model = model.to(self.device, dtype).eval()
        if optimized:
            from .optimize import optimize

            optimize(self.model)

    @torch.inference_mode()
    def _run(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.to(self.device, self.dtype)).float()


class OnnxEngine(Engine):
    """ONNX Runtime session over an `.onnx` file: config from its vitfast sidecar, or, for a graph
    another tool exported, input/output read from the graph and preprocessing from `overrides`
    (ViTConfig fields: img_size and the preprocessing ones) or an Optimum folder's files."""

    kind = "onnxruntime"

    def __init__(self, path: Path, *, providers: list[str] | None = None, threads: int | None = None,
                 overrides: dict[str, Any] | None = None):  # fmt: skip
        try:
            import onnxruntime as ort
        except ImportError:
            raise BackendUnavailable("running ONNX files needs onnxruntime: pip install 'vitfast[export]'") from None
        from vitfast.export.artifacts import read_sidecar, sidecar_path

        from . import foreign

        path = foreign.resolve_onnx_path(path)
        self.io = foreign.read_graph_io(path)
        if sidecar_path(path).exists():
            meta = read_sidecar(path)
            stated = {k: v for k, v in (overrides or {}).items() if k in PREPROCESSING_FIELDS and v is not None}
            config, missing = ViTConfig.from_dict(meta["config"]).replace(**stated), []
            batch = meta.get("input", {}).get("batch")
        else:
            config, missing, assumed = foreign.foreign_config(path, self.io, overrides)
            batch = (self.io.batch,) * 3 if self.io.batch else None
            meta = {"foreign": True, "graph": self.io.describe(), "precision": self.io.precision, "assumed": assumed}
        super().__init__(config, precision=meta.get("precision", "fp32"),
                         batch=tuple(batch) if batch else None, metadata=meta, path=path)  # fmt: skip
        self.missing_preprocessing = foreign.missing_preprocessing_message(path, missing) if missing else None
        available = ort.get_available_providers()
        if providers is None:
            providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # ORT raises its own exception types for unreadable models
            raise ArtifactError(f"ONNX Runtime cannot load {path}: {str(exc).splitlines()[0][:300]}") from None
        if not meta.get("foreign"):
            from vitfast.export.artifacts import check_graph_matches

            check_graph_matches(path, meta, *([(t.name, t.shape) for t in ts] for ts in (self.session.get_inputs(), self.session.get_outputs())))
        self.input_name = self.io.input_name
        self.providers = self.session.get_providers()

    def prepare(self, images) -> torch.Tensor:
        if self.missing_preprocessing and not is_float_images(images):
            raise InputError(self.missing_preprocessing)
        return super().prepare(images)

    def feed(self, x: torch.Tensor) -> dict[str, np.ndarray]:
        """Checked float32 [B, C, H, W] -> the graph's input in its own layout and dtype."""
        if self.io.layout == "NHWC":
            x = x.permute(0, 2, 3, 1)
        return {self.input_name: np.ascontiguousarray(x.cpu().numpy().astype(self.io.dtype))}

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        (logits,) = self.session.run([self.io.output_name], self.feed(x))
        return torch.from_numpy(logits).float()


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
        from vitfast.export.tensorrt import TensorRTEngine

        return TensorRTEngine(path, **kwargs)
    from .checkpoint import load_checkpoint

    overrides = dict(overrides or {})
    img_size = overrides.pop("img_size", None)
    return TorchEngine(load_checkpoint(path, img_size=img_size, overrides=overrides), device=device, optimized=optimized,
                       path=path, **kwargs)  # fmt: skip
