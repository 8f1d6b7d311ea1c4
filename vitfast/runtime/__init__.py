"""One runtime for every artifact: `load_engine(path)` -> `Engine`, and `engine(images) -> logits`.

- a vitfast / timm / Hugging Face checkpoint: `TorchEngine`, the PyTorch reference model (optionally optimized);
- an ONNX file (`.onnx`): `OnnxEngine`, ONNX Runtime, CUDA provider when present, else CPU;
- a TensorRT engine (`.engine` / `.plan` / `.trt`): `TensorRTEngine`.
Images in: normalised float `[B, C, H, W]`, or uint8 `[B, H, W, C]` / PIL images, which go through
`vitfast.preprocess` with the artifact's own preprocessing. Logits out: float32 `[B, classes]`.
The runtime reads artifacts and their sidecars (`sidecar.py`); it never imports `vitfast.export`.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path
from typing import Any

from vitfast.checkpoint import load_checkpoint
from vitfast.config import OUTPUT_MEANING_FIELDS, PREPROCESSING_FIELDS, ViTConfig
from vitfast.errors import ArtifactError, ConfigError, InputError, ParityWarning
from vitfast.foreign import FOREIGN_FIELDS, is_onnx_artifact, resolve_onnx_path
from vitfast.parity import failure, find_the_layer

from .engine import Engine, is_float_images
from .onnx_engine import OnnxEngine
from .openvino_engine import OpenVinoEngine, antialiased_pos_embed_resize
from .sidecar import read_sidecar, sidecar_path
from .tensorrt_engine import ENGINE_SUFFIXES, TensorRTEngine
from .torch_engine import TorchEngine

__all__ = ["ENGINE_SUFFIXES", "Engine", "is_float_images", "OnnxEngine", "OpenVinoEngine", "TensorRTEngine", "TorchEngine", "load_engine", "read_sidecar", "sidecar_path"]


BACKENDS = ("auto", "torch", "onnxruntime", "openvino", "tensorrt")
OPENVINO_KEYWORDS = {"hint", "streams", "properties"}  # OpenVinoEngine's own: with auto, they pick OpenVINO


def load_engine(path: str | os.PathLike, *, backend: str = "auto", device: str | None = None, optimized: bool = False,
                overrides: dict[str, Any] | None = None, output: str | None = None, **kwargs) -> Engine:  # fmt: skip
    """An `Engine` for a checkpoint, an ONNX file (vitfast's or another tool's), an Optimum export
    folder or a TensorRT engine, chosen from the path. `overrides`: ViTConfig fields for a checkpoint,
    as `load_checkpoint` takes them (plus `img_size`); for an ONNX file or engine, its preprocessing (all of
    img_size/mean/std/... for a graph or engine without a vitfast sidecar); for any artifact, what its output means (class
    names `labels`, `problem_type`). `output`: for an ONNX file or another tool's engine, which of its outputs
    to run, by name (a graph from another tool may return logits, pooled features and every token side by side).

    `device`: a checkpoint's torch device; for an ONNX file "cpu", "cuda" or "cuda:N" (ONNX Runtime's providers; a CUDA
    device makes auto pick ONNX Runtime) or OpenVINO's own device name; a TensorRT engine runs on the current CUDA device.

    `backend`: "auto" (torch for checkpoints, TensorRT for engines, for ONNX files the rule of
    `onnx_backend`), or one of "torch", "onnxruntime" / "openvino" (ONNX files; openvino for
    vitfast's own), "tensorrt". The engine's `backend_choice` says which backend ran and why;
    code that needs ONNX Runtime itself (sessions, providers, marked outputs) asks for it by name.
    An artifact whose sidecar records a failed export parity check loads with a `vitfast.errors.ParityWarning`."""
    path = Path(path)
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if not path.exists():
        raise ArtifactError(f"no such artifact: {path}")
    suffix = path.suffix.lower()
    kind = "onnx" if is_onnx_artifact(path) else "engine" if suffix in ENGINE_SUFFIXES else "checkpoint"
    allowed = {"onnx": ("onnxruntime", "openvino"), "engine": ("tensorrt",), "checkpoint": ("torch",)}[kind]
    if backend != "auto" and backend not in allowed:
        raise InputError(f"{path} is a{'n' if kind != 'checkpoint' else ''} {kind}: the {backend} backend cannot run it; "
                         f"use backend {' or '.join(allowed)} (or auto)")  # fmt: skip
    if output is not None and kind == "checkpoint":
        raise InputError(f"--output / output= picks one of an ONNX graph's or TensorRT engine's outputs; {path} is a checkpoint: drop it")
    reason = f"{backend} requested"
    if kind == "onnx":
        graph = resolve_onnx_path(path)[0]  # a folder: the graph in it that runs, whose sidecar decides as a file's does
        ours = sidecar_path(graph).exists()  # vitfast's export: config and input spec in the sidecar
        if device is not None and _cuda(device) and backend == "auto":  # of the two, only ONNX Runtime runs on CUDA
            backend, reason = "onnxruntime", f"auto: ONNX Runtime, which runs ONNX files on CUDA (device={device!r})"
        if backend == "auto":
            backend, reason = onnx_backend(read_sidecar(graph) if ours else None, kwargs)
        if backend == "openvino":
            if not ours:
                raise InputError(f"the openvino backend runs ONNX files exported by vitfast (with a .json sidecar); "
                                 f"{path} has none: use backend onnxruntime")  # fmt: skip
            engine = OpenVinoEngine(graph, overrides=overrides, output=output, **_openvino_device(device, kwargs))
        else:
            engine = OnnxEngine(path, overrides=overrides, output=output, **_ort_device(device, kwargs))
    elif kind == "engine":
        if device is not None and device != "cuda":
            raise InputError(f"device={device!r}: a TensorRT engine runs on the current CUDA device (torch.cuda.set_device or "
                             "CUDA_VISIBLE_DEVICES choose it); pass device='cuda' or none")  # fmt: skip
        engine = TensorRTEngine(path, overrides=overrides, output=output, **kwargs)
    else:
        overrides = dict(overrides or {})
        img_size = overrides.pop("img_size", None)
        engine = TorchEngine(load_checkpoint(path, img_size=img_size, overrides=overrides), device=device, optimized=optimized,
                             path=path, **kwargs)  # fmt: skip
    if kind != "checkpoint" and overrides:
        engine.config = exported_config(engine, path, {k: v for k, v in overrides.items() if v is not None})
    engine.backend_choice = reason if kind == "onnx" or backend != "auto" else f"auto: {engine.kind} runs {kind} artifacts"
    failed = failure(engine.metadata.get("parity"))
    if failed:  # the export kept it for inspection; whoever runs it must know
        warnings.warn(ParityWarning(f"{path}: its sidecar records that its export failed the parity check ({failed}); its outputs "
                                    f"may be wrong: {find_the_layer(path)}"), stacklevel=2)  # fmt: skip
    return engine


def exported_config(engine: Engine, path: Path, overrides: dict[str, Any]) -> ViTConfig:
    """An exported artifact's config with the `overrides` it can take: what its output means (class names,
    `problem_type`), and for vitfast's own artifacts the preprocessing (and the image size of a dynamic-size ONNX
    graph). The graph or engine fixed every other field: an override that differs from it is refused, not ignored."""
    config, meta = engine.config, engine.metadata
    if meta.get("foreign") and "vitfast_version" not in meta:  # its config holds only what the graph's files and the overrides said
        return config.replace(**{k: v for k, v in overrides.items() if k in OUTPUT_MEANING_FIELDS})
    if meta.get("foreign"):  # vitfast built it from another tool's graph: only these fields describe that graph
        overrides = {k: v for k, v in overrides.items() if k in FOREIGN_FIELDS}
    takes = (*OUTPUT_MEANING_FIELDS, *PREPROCESSING_FIELDS, *(("img_size",) if config.dynamic_img_size and engine.kind != "tensorrt" else ()))
    fixed = [k for k, v in overrides.items() if k not in (*takes, "name") and not _same(config, k, v)]
    if fixed:
        said = ", ".join(f"{k} {overrides[k]!r} (it has {getattr(config, k)!r})" for k in fixed)
        raise InputError(f"{path} is an exported model and fixes what these override: {said}; drop "
                         f"{' / '.join('--' + k.replace('_', '-') for k in fixed)}, or export again from the checkpoint with them")  # fmt: skip
    return config.replace(**{k: v for k, v in overrides.items() if k in takes})


def _same(config: ViTConfig, key: str, value: Any) -> bool:
    """Whether setting `key` to `value` leaves `config` as it is (after the config's own normalising)."""
    try:
        return getattr(config.replace(**{key: value}), key) == getattr(config, key)
    except ConfigError:
        return False


def onnx_backend(meta: dict | None, kwargs: dict[str, Any]) -> tuple[str, str]:
    """(backend, why) for `backend="auto"` on an ONNX file; `meta` is its vitfast sidecar (None: none).

    The rule, from benchmarks/cpu_runtimes.py on CPU: a vitfast int8 file in a symmetric int8 QDQ form
    (`--int8-target openvino` or `tensorrt`) runs ~2x faster in OpenVINO than in ONNX Runtime, so it
    goes to OpenVINO when OpenVINO is installed and ONNX Runtime has no CUDA GPU to run it on.
    Everything else stays on ONNX Runtime: fp32/fp16 (OpenVINO was no faster), the uint8
    `--int8-target cpu` form (OpenVINO lost ~10 points of top-1 on it), graphs without a vitfast
    sidecar, graphs resizing position embeddings with antialiasing (`--dynamic-img-size` by timm's rule: OpenVINO's
    antialiased Resize differs), and calls passing ONNX Runtime's own keywords (`providers`). OpenVINO's own keywords
    (`hint`, `streams`, `properties`) pick OpenVINO for any vitfast ONNX file."""
    int8 = (meta or {}).get("int8") or {}
    if meta is not None and OPENVINO_KEYWORDS & kwargs.keys():
        return "openvino", f"auto: OpenVINO because its keywords ({', '.join(sorted(OPENVINO_KEYWORDS & kwargs.keys()))}) were given"
    if meta is not None and antialiased_pos_embed_resize(ViTConfig.from_dict(meta["config"])):
        return "onnxruntime", "auto: ONNX Runtime (OpenVINO's antialiased Resize differs from PyTorch's, and this graph resizes with one)"
    if meta is None:
        return "onnxruntime", "auto: ONNX Runtime for an ONNX graph without a vitfast sidecar"
    if meta.get("precision") != "int8":
        return "onnxruntime", f"auto: ONNX Runtime for {meta.get('precision', 'fp32')} ONNX files (OpenVINO is no faster on them)"
    if int8.get("target") == "cpu":
        return "onnxruntime", "auto: ONNX Runtime for an --int8-target cpu file (its uint8 form loses accuracy in OpenVINO)"
    if int8.get("target") not in ("tensorrt", "openvino"):
        return "onnxruntime", "auto: ONNX Runtime for an int8 file vitfast did not calibrate"
    if "providers" in kwargs:
        return "onnxruntime", "auto: ONNX Runtime because execution providers were given"
    if importlib.util.find_spec("openvino") is None:
        return "onnxruntime", "auto: ONNX Runtime (OpenVINO, the faster int8 CPU runtime, is not installed: pip install 'vitfast[openvino]')"
    if _ort_has_cuda():
        return "onnxruntime", "auto: ONNX Runtime with its CUDA provider (int8 on GPU: build a TensorRT engine)"
    return "openvino", "auto: OpenVINO runs symmetric int8 QDQ files fastest on CPU (--backend onnxruntime for ONNX Runtime)"


def _cuda(device: str) -> bool:
    return device == "cuda" or device.startswith("cuda:")


def _ort_device(device: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`device` ("cpu", "cuda", "cuda:N") as ONNX Runtime's `providers` keyword, refused beside `providers` or where this
    ONNX Runtime has no CUDA provider (it would fall back to CPU with only a log line)."""
    if device is None:
        return kwargs
    if "providers" in kwargs:
        raise InputError("give device= or providers=, not both (providers= picks ONNX Runtime's execution providers itself)")
    if device == "cpu":
        return kwargs | {"providers": ["CPUExecutionProvider"]}
    if not (device == "cuda" or _cuda(device) and device[5:].isdigit()):
        raise InputError(f"device={device!r} is not one ONNX Runtime runs on; pass 'cpu', 'cuda' or 'cuda:N'")
    if not _ort_has_cuda():
        raise InputError(f"device={device!r}: this ONNX Runtime has no CUDA provider (pip install onnxruntime-gpu), "
                         "or pass device='cpu'")  # fmt: skip
    index = int(device.partition(":")[2] or 0)
    return kwargs | {"providers": [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]}


def _openvino_device(device: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`device` as OpenVINO names it ("cpu" -> "CPU"; "GPU", "NPU", "AUTO" as they are); CUDA devices refused."""
    if device is None:
        return kwargs
    if _cuda(device):
        raise InputError(f"device={device!r}: OpenVINO does not run on CUDA GPUs; use backend onnxruntime (or a TensorRT engine)")
    return kwargs | {"device": device.upper() if device == "cpu" else device}


def _ort_has_cuda() -> bool:
    """ONNX Runtime would run the file on a CUDA GPU (it picks that provider first when it has one)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()
