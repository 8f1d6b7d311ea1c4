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
    (ViTConfig fields: img_size and the preprocessing ones) or an Optimum folder's files. `output`: which of the
    graph's outputs to run, by name (default: the logits, else transformers' feature names; see `foreign`)."""

    kind = "onnxruntime"

    def __init__(self, path: Path, *, providers: list[str] | None = None, threads: int | None = None,
                 overrides: dict[str, Any] | None = None, output: str | None = None):  # fmt: skip
        try:
            import onnxruntime as ort  # optional and heavy: only when an ONNX file is run
        except ImportError:
            raise BackendUnavailable("running ONNX files needs onnxruntime: pip install 'vitfast[onnx]'") from None
        path, self.picked = foreign.resolve_onnx_path(path)  # picked: which of a folder's graphs runs, when it holds several
        ours = sidecar_path(path).exists()
        if ours:
            meta = read_sidecar(path)
            self.io = foreign.read_graph_io(path, output_rank=None, output=output)  # the sidecar's shape is checked below
        else:
            self.io = foreign.read_graph_io(path, output=output)
        self.session = _session(ort, path, providers, threads)
        self.input_name = self.io.input_name
        self.providers = self.session.get_providers()
        if ours:
            stated = {k: v for k, v in (overrides or {}).items() if k in PREPROCESSING_FIELDS and v is not None}
            config, missing = ViTConfig.from_dict(meta["config"]).replace(**stated), []
            batch = meta.get("input", {}).get("batch")
            check_graph_matches(path, meta, *([(t.name, t.shape) for t in ts] for ts in (self.session.get_inputs(), self.session.get_outputs())))
        else:
            config, missing, assumed, guessed = foreign.foreign_config(path, self.io, overrides, probe=lambda h, w: self._probe(path, h, w))
            batch = (self.io.batch,) * 3 if self.io.batch else None
            meta = {"foreign": True, "graph": self.io.describe(), "precision": self.io.precision, "assumed": assumed,
                    "warnings": [f"{k}: {reason}" for k, reason in guessed.items()],
                    "config_files": foreign.config_files(path)}
        super().__init__(config, precision=meta.get("precision", "fp32"),
                         batch=tuple(batch) if batch else None, metadata=meta, path=path)  # fmt: skip
        self.missing_preprocessing = foreign.missing_preprocessing_message(path, missing) if missing else None

    def _probe(self, path: Path, h: int, w: int) -> tuple[int, ...]:
        """A foreign graph's output dims after the batch at h x w, from one run on zeros (for dims the graph leaves dynamic)."""
        x = torch.zeros(self.io.batch or 1, self.io.in_chans, h, w)
        try:
            return tuple(self._run(x).shape[1:])
        except Exception as exc:  # ORT raises its own types for a shape the graph cannot take
            raise ArtifactError(f"{path}: a {h}x{w} test run to measure its output's shape failed: {first_line(exc)}; "
                                "pass the size it takes with --img-size") from None  # fmt: skip

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
        try:
            (logits,) = self.session.run([self.io.output_name], self.feed(x))
        except Exception as exc:  # ORT raises its own types, e.g. for a batch size a Reshape in the graph fixed
            raise ArtifactError(f"ONNX Runtime failed to run {self.path} on a batch of {x.shape[0]} "
                                f"{x.shape[2]}x{x.shape[3]} images: {first_line(exc)}") from exc  # fmt: skip
        return torch.from_numpy(logits).float()


def _session(ort, path: Path, providers: list[str] | None, threads: int | None):
    """An ONNX Runtime session over `path`: CUDA when present, else CPU; all graph optimisations."""
    available = ort.get_available_providers()
    if providers is None:
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=providers)
    except Exception as exc:  # ORT raises its own exception types for unreadable models
        raise ArtifactError(f"ONNX Runtime cannot load {path}: {first_line(exc)}") from None
