"""`OnnxEngine`: an exported `.onnx` file run by ONNX Runtime (CUDA provider when present, else CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import torch

from vitfast import foreign
from vitfast.config import PREPROCESSING_FIELDS, ViTConfig
from vitfast.errors import ArtifactError, BackendUnavailable, InputError, first_line

from .engine import Engine, is_float_images
from .sidecar import check_graph_matches, read_sidecar, sidecar_path


class OnnxEngine(Engine):
    """ONNX Runtime session over an `.onnx` file: config from its vitfast sidecar, or, for a graph
    another tool exported, input/output read from the graph and preprocessing from `overrides`
    (ViTConfig fields: img_size and the preprocessing ones) or an Optimum folder's files."""

    kind = "onnxruntime"

    def __init__(self, path: Path, *, providers: list[str] | None = None, threads: int | None = None,
                 overrides: dict[str, Any] | None = None):  # fmt: skip
        try:
            import onnxruntime as ort  # optional and heavy: only when an ONNX file is run
        except ImportError:
            raise BackendUnavailable("running ONNX files needs onnxruntime: pip install 'vitfast[onnx]'") from None
        path = foreign.resolve_onnx_path(path)
        if sidecar_path(path).exists():
            meta = read_sidecar(path)
            stated = {k: v for k, v in (overrides or {}).items() if k in PREPROCESSING_FIELDS and v is not None}
            config, missing = ViTConfig.from_dict(meta["config"]).replace(**stated), []
            self.io = foreign.read_graph_io(path, output_rank=None)  # the sidecar's shape is checked below
            batch = meta.get("input", {}).get("batch")
        else:
            self.io = foreign.read_graph_io(path)
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
            raise ArtifactError(f"ONNX Runtime cannot load {path}: {first_line(exc)}") from None
        if not meta.get("foreign"):
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
