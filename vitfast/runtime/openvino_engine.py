"""OpenVINO as a runtime for vitfast's ONNX artifacts: `OpenVinoEngine`, and the property names
OpenVINO users know (`PERFORMANCE_HINT`, `NUM_STREAMS`, `INFERENCE_NUM_THREADS`, ...).

    engine = load_engine("m.int8.onnx", backend="openvino", hint="throughput", threads=2)
    engine = load_engine("m.onnx", backend="openvino", properties={"NUM_STREAMS": 2, "PERF_COUNT": True})

The fp32 parts of the graph run in fp32 (`INFERENCE_PRECISION_HINT=f32`) unless the properties
say otherwise: OpenVINO's CPU plugin would otherwise pick bf16 on CPUs with AVX512-BF16 or AMX,
which changes an fp32 artifact's numbers. With several streams (the throughput hint), one call's
batch is split across that many infer requests running at once, each on its own cores.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitfast.config import PREPROCESSING_FIELDS, ViTConfig
from vitfast.errors import ArtifactError, BackendUnavailable, InputError
from vitfast.foreign import read_graph_io

from .engine import Engine
from .sidecar import check_graph_matches, read_sidecar

HINTS = ("latency", "throughput", "cumulative_throughput")


def require_openvino():
    try:
        import openvino
    except ImportError:
        raise BackendUnavailable("the openvino backend needs OpenVINO: pip install 'vitfast[openvino]'") from None
    return openvino


@functools.cache
def openvino_core():
    """The process's one `openvino.Core`, as OpenVINO advises. Each engine made its own: with two Cores' compiled models
    freed (a bench's fp16 and fp32 rows), the next signal Python handles (Ctrl-C, SIGTERM) crashed the process in
    OpenVINO 2026.4's threads (SIGSEGV; tests/test_openvino.py)."""
    return require_openvino().Core()


def compile_properties(*, threads: int | None = None, streams: int | str | None = None, hint: str | None = None,
                       properties: dict | None = None) -> dict[str, Any]:  # fmt: skip
    """OpenVINO `compile_model` properties from vitfast's keywords; explicit `properties` win.

    Keys may be strings ("NUM_STREAMS") or `openvino.properties` objects (`props.streams.num`)."""
    out: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
    if hint is not None:
        if str(hint).lower() not in HINTS:
            raise InputError(f"OpenVINO performance hint must be one of {', '.join(HINTS)}, got {hint!r}")
        out["PERFORMANCE_HINT"] = str(hint).upper()
    if threads is not None:
        if int(threads) < 1:
            raise InputError(f"threads must be >= 1, got {threads}")
        out["INFERENCE_NUM_THREADS"] = int(threads)
    if streams is not None:
        if str(streams).upper() != "AUTO" and int(streams) < 1:
            raise InputError(f"streams must be >= 1 or 'AUTO', got {streams!r}")
        out["NUM_STREAMS"] = streams
    out |= {str(k): v for k, v in (properties or {}).items()}
    return out


class OpenVinoEngine(Engine):
    """An ONNX artifact compiled by OpenVINO (config, precision and batch profile from its sidecar). `output`: checked to be
    the name of the graph's one output (`--output`), as ONNX Runtime's engine takes it."""

    kind = "openvino"

    def __init__(self, path: Path, *, device: str = "CPU", threads: int | None = None, streams: int | str | None = None,
                 hint: str | None = None, properties: dict | None = None, overrides: dict[str, Any] | None = None,
                 output: str | None = None):  # fmt: skip
        ov = require_openvino()

        meta = read_sidecar(path)
        if (meta.get("int8") or {}).get("target") == "cpu":
            # Measured, not assumed: on tests/test_export_real_data.py's digits model OpenVINO ran this
            # uint8-activation form at 87.7% top-1 against 98.0% in fp32 (ONNX Runtime: 98.2%).
            raise ArtifactError(f"{path} is an --int8-target cpu file, which loses accuracy in OpenVINO; run it with "
                                "backend onnxruntime, or export the default --int8-target tensorrt file for OpenVINO")  # fmt: skip
        config = ViTConfig.from_dict(meta["config"])
        if antialiased_pos_embed_resize(config):
            # Measured: OpenVINO 2026's antialiased cubic Resize is off PyTorch's and ONNX Runtime's by up to 0.09 on a
            # tiny model's features at any grid but the stored one (tests/test_dynamic_img_size.py); plain bicubic agrees.
            raise ArtifactError(f"{path} resizes its position embeddings with an antialiased bicubic Resize in the graph "
                                "(a --dynamic-img-size export by timm's rule), which OpenVINO computes differently from PyTorch; "
                                "run it with backend onnxruntime, or export it at a fixed size")  # fmt: skip
        batch = meta.get("input", {}).get("batch")
        stated = {k: v for k, v in (overrides or {}).items() if k in PREPROCESSING_FIELDS and v is not None}
        super().__init__(config.replace(**stated), precision=meta.get("precision", "fp32"),
                         batch=tuple(batch) if batch else None, metadata=meta, path=path)  # fmt: skip
        self.properties = compile_properties(threads=threads, streams=streams, hint=hint, properties=properties)
        if path.suffix.lower() == ".onnx":  # refused before OpenVINO's parser logs protobuf errors on stderr
            read_graph_io(path, output_rank=None, output=output)  # (an OpenVINO IR .xml with a sidecar loads too)
        core = openvino_core()
        try:
            self.compiled = core.compile_model(core.read_model(str(path)), device.upper(), self.properties)
        except RuntimeError as exc:  # OpenVINO reports unreadable models and bad properties as RuntimeError
            raise ArtifactError(f"OpenVINO cannot load {path} for {device}: {_reason(exc)}") from None
        if path.suffix.lower() == ".onnx":
            check_graph_matches(path, meta, *([(t.get_any_name(), _dims(t.partial_shape)) for t in ts]
                                              for ts in (self.compiled.inputs, self.compiled.outputs)))  # fmt: skip
        self.device = device.upper()
        self.streams = int(self.compiled.get_property("NUM_STREAMS"))
        self.dynamic_batch = self.compiled.inputs[0].partial_shape[0].is_dynamic
        self.request = self.compiled.create_infer_request()
        self.queue = ov.AsyncInferQueue(self.compiled, self.streams) if self.streams > 1 and self.dynamic_batch else None
        self.lock = threading.Lock()  # infer requests are not reentrant; `vitfast serve` calls from several threads

    def compiled_properties(self) -> dict[str, str]:
        """What OpenVINO chose: streams, threads, hint, inference precision, requests."""
        names = ("PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS", "INFERENCE_PRECISION_HINT",
                 "OPTIMAL_NUMBER_OF_INFER_REQUESTS", "EXECUTION_DEVICES")  # fmt: skip
        return {name: _text(self.compiled.get_property(name)) for name in names}

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock:
            try:
                out = self._infer(np.ascontiguousarray(x.cpu().numpy()))
            except RuntimeError as exc:  # OpenVINO's errors, e.g. for a batch size the graph fixed
                raise ArtifactError(f"OpenVINO failed to run {self.path} on a batch of {x.shape[0]} "
                                    f"{x.shape[2]}x{x.shape[3]} images: {_reason(exc)}") from exc  # fmt: skip
        return torch.from_numpy(out)

    def _infer(self, images: np.ndarray) -> np.ndarray:
        if self.queue is None or len(images) < 2:
            return self.request.infer([images])[0].copy()
        chunks = np.array_split(images, min(self.streams, len(images)))
        outputs: list[np.ndarray | None] = [None] * len(chunks)

        def done(request, index):  # runs on OpenVINO's thread; copy before the request is reused
            outputs[index] = request.get_output_tensor(0).data.copy()

        self.queue.set_callback(done)
        for index, chunk in enumerate(chunks):
            self.queue.start_async([chunk], index)
        self.queue.wait_all()
        return np.concatenate(outputs)


def antialiased_pos_embed_resize(config: ViTConfig) -> bool:
    """The graph resizes learned position embeddings per input with antialiasing (dynamic_img_size, timm's rule)."""
    return config.dynamic_img_size and config.abs_pos_embed and config.pos_embed_antialias


def _dims(shape) -> list[int | None]:
    """An OpenVINO partial shape as (int | None) per axis, None for a dynamic one."""
    return [dim.get_length() if dim.is_static else None for dim in shape]


def _text(value) -> str:
    """A property value as OpenVINO's own tools print it ("f32", not "<Type: 'float32'>")."""
    if hasattr(value, "to_string"):
        return value.to_string()
    return ",".join(map(str, value)) if isinstance(value, list) else str(value).split(".")[-1]


def _reason(exc: Exception) -> str:
    """The informative line of an OpenVINO error (not its "Exception from src/...cpp:84:" frames)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.startswith("Exception from ")]
    return (lines[-1] if lines else type(exc).__name__)[:300]
