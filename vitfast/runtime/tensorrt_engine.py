"""`TensorRTEngine`: a serialized TensorRT 10 engine and its sidecar (or another tool's engine without one:
`tensorrt_foreign`), run on the current CUDA device.

TensorRT is imported only when an engine is loaded, so importing this module needs neither TensorRT
nor CUDA. Portability rule enforced by `check_engine_compatible`: an engine built without TensorRT's
hardware- or version-compatibility modes (vitfast never enables them, they cost speed) runs only
under the TensorRT version it was built with (same major.minor.patch) and on the GPU model it was
built on (same device name and compute capability). NVIDIA, TensorRT support matrix, "Engine
Portability": engines are not portable across TensorRT versions, GPU architectures or platforms.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path
from typing import Any, Sequence

import torch

from vitfast.config import ViTConfig
from vitfast.errors import ArtifactError, BackendUnavailable, InputError, first_line
from vitfast import foreign
from vitfast.optimize import static_input

from .engine import Engine, is_float_images
from .sidecar import read_sidecar, sidecar_path
from .tensorrt_foreign import FOREIGN_HINT, built_precision, check_profile_size, engine_io, io_tensor_names, judge_precision, profile_batch

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")
INSTALL_HINT = (
    "run `pip install 'tensorrt>=10,<11'` on a Linux machine with an NVIDIA GPU and driver, "
    "or use an NVIDIA TensorRT container (nvcr.io/nvidia/tensorrt) that has TensorRT 10"
)
TENSOR_ALIGN = 256  # bytes: the alignment IExecutionContext.setTensorAddress requires of an IO address
REBUILD_HINT = "rebuild it on this machine with `vitfast export --format trt ...`"

Shape = tuple[int, ...]


def require_tensorrt():
    """The `tensorrt` module, imported now; `BackendUnavailable` (one line, with the fix) without it."""
    try:
        import tensorrt  # optional, Linux + NVIDIA GPU only: imported when needed
    except (ImportError, OSError) as exc:  # OSError: libnvinfer missing or built for another CUDA
        if isinstance(exc, ModuleNotFoundError) and exc.name == "tensorrt":
            raise BackendUnavailable(f"TensorRT is not installed: {INSTALL_HINT}") from None
        raise BackendUnavailable(f"TensorRT is installed but cannot be imported ({first_line(exc)}); reinstall it: {INSTALL_HINT}") from None
    return tensorrt


def parse_version(text: str) -> tuple[int, int, int]:
    """A TensorRT version string -> (major, minor, patch): '10.7.0.23' and '10.7.0.post1' -> (10, 7, 0)."""
    match = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(text))
    if not match:
        raise ArtifactError(f"cannot read a TensorRT version from {text!r}; {REBUILD_HINT}")
    major, minor, patch = (int(part or 0) for part in match.groups())
    return major, minor, patch


def parse_compute_capability(value: str | Sequence[int]) -> tuple[int, int]:
    """'8.9' or (8, 9) -> (8, 9)."""
    parts = str(value).split(".") if isinstance(value, str) else list(value)
    try:
        major, minor = (int(p) for p in parts)
    except (TypeError, ValueError):
        raise ArtifactError(f"compute capability must look like '8.9', got {value!r}") from None
    return major, minor


def check_engine_compatible(metadata: dict[str, Any], *, trt_version: str, gpu_name: str, compute_capability: str) -> None:
    """Raise `ArtifactError` unless this machine can run the engine described by `metadata` (its sidecar).

    The rule (see the module docstring): same TensorRT major.minor.patch, and the same GPU model,
    i.e. the same device name and compute capability, as the engine was built with. The message
    names what differs, both values, and how to rebuild.
    """
    built_version, built_gpu, built_cc = _built_for(metadata)
    problems = []
    if parse_version(built_version) != parse_version(trt_version):
        problems.append(f"it was built with TensorRT {built_version}, this machine has TensorRT {trt_version}")
    same_gpu = built_gpu.strip() == str(gpu_name).strip()
    if not same_gpu or parse_compute_capability(built_cc) != parse_compute_capability(compute_capability):
        problems.append(
            f"it was built on {built_gpu} (compute capability {built_cc}), this GPU is {gpu_name} "
            f"(compute capability {compute_capability})"
        )
    if problems:
        raise ArtifactError(
            f"TensorRT engine does not fit this machine: {'; '.join(problems)}. Engines only run with the TensorRT "
            f"version and GPU model they were built with; {REBUILD_HINT}"
        )


def _built_for(metadata: dict[str, Any]) -> tuple[str, str, str]:
    """(TensorRT version, GPU name, compute capability) recorded in an engine sidecar."""
    try:
        return (str(metadata["tensorrt"]["version"]), str(metadata["gpu"]["name"]),
                str(metadata["gpu"]["compute_capability"]))  # fmt: skip
    except (KeyError, TypeError):
        raise ArtifactError(
            f"the engine's sidecar does not record the TensorRT version and GPU it was built with; {REBUILD_HINT}"
        ) from None


def current_gpu() -> tuple[str, str]:
    """(name, 'major.minor' compute capability) of the current CUDA device, read now (never at import)."""
    if not torch.cuda.is_available():
        raise BackendUnavailable(
            "TensorRT needs an NVIDIA GPU and torch sees no CUDA device; run on a machine with an NVIDIA GPU, "
            "its driver and a CUDA build of torch"
        )
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), f"{major}.{minor}"


@functools.lru_cache(maxsize=None)
def trt_logger(trt):
    """One logger per tensorrt module: TensorRT treats the logger as a process-wide singleton.
    trt.Logger writes to stderr, so `--json` output on stdout stays clean."""
    return trt.Logger(trt.Logger.WARNING)


class TensorRTEngine(Engine):
    """A serialized TensorRT engine run on the current CUDA device: vitfast's, with its sidecar, or another tool's
    (trtexec, polygraphy), whose input and output are read from the engine and whose preprocessing comes from
    `overrides` (ViTConfig fields: --config FILE, e.g. the sidecar of the ONNX it was built from, and the flags).
    `output`: which of another tool's engine's outputs to run, by name (see `vitfast.foreign.pick_output`).

    `engine(images)` -> float32 logits [B, classes] on the GPU. Inputs go to the engine's GPU in
    its input dtype. Runs are enqueued on the engine's own CUDA stream, ordered after the caller's:
    on the legacy default stream TensorRT synchronises the device around each run. `cuda_graph=True`
    captures one CUDA graph per input shape on first use and replays it afterwards; each graph keeps
    its own execution context (with it TensorRT's activation memory for the profile's largest shape)
    and static buffers, so graph a few batch sizes, not every one a server meets.
    """

    kind = "tensorrt"

    def __init__(self, path: str | os.PathLike, *, cuda_graph: bool = False, overrides: dict[str, Any] | None = None,
                 output: str | None = None):  # fmt: skip
        trt = require_tensorrt()
        gpu_name, compute_capability = current_gpu()
        path = Path(path)
        ours = sidecar_path(path).exists()
        if ours:
            meta = read_sidecar(path)
            check_engine_compatible(meta, trt_version=trt.__version__, gpu_name=gpu_name, compute_capability=compute_capability)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.cuda_graph = cuda_graph
        self._runtime = trt.Runtime(trt_logger(trt))
        self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise ArtifactError(f"TensorRT {trt.__version__} cannot load {path} (its log above says why); {REBUILD_HINT if ours else FOREIGN_HINT}")
        self.context = self._new_context(path)
        self.layout, self.missing_preprocessing = "NCHW", None  # another tool's engine: its layout; no mean/std given
        if ours:
            self.input_name, self.output_name = _io_names(trt, self.engine, path, (meta.get("output") or {}).get("name"))
            if output not in (None, self.output_name):
                raise InputError(f"{path} is vitfast's engine: it runs output {self.output_name!r}, as its sidecar says; drop --output {output}")
            config, precision, batch = ViTConfig.from_dict(meta["config"]), meta.get("precision", "fp16"), (meta.get("input") or {}).get("batch")
            if meta.get("foreign"):  # built from another tool's graph: what it takes and returns, as for such graphs
                self.io = dataclasses.replace(engine_io(trt, self.engine, path, self.output_name)[0], precision=precision)
        else:
            config, precision, batch, meta = self._read_foreign(trt, path, overrides, output, (gpu_name, compute_capability))
        super().__init__(config, precision=precision, batch=tuple(batch) if batch else None, metadata=meta, path=path)
        self.output_names = io_tensor_names(trt, self.engine)[1]  # TensorRT writes all of them
        self.input_dtype = _torch_dtype(trt, self.engine.get_tensor_dtype(self.input_name), path)
        self.output_dtypes = {n: _torch_dtype(trt, self.engine.get_tensor_dtype(n), path, other=n != self.output_name) for n in self.output_names}
        self.stream: torch.cuda.Stream | None = None  # made on the first run
        self._graphs: dict[Shape, tuple[Any, torch.cuda.CUDAGraph, torch.Tensor, dict[str, torch.Tensor]]] = {}  # context, graph, in, outs

    def _new_context(self, path: Path):
        """An execution context of the engine, which owns activation memory for the profile's largest shape."""
        context = self.engine.create_execution_context()
        if context is None:  # TensorRT logs why and returns None; the usual cause is device memory
            raise BackendUnavailable(f"TensorRT could not create an execution context for {path} (its log above says why; usually too "
                                     "little free GPU memory for its largest batch): free GPU memory, or rebuild the engine with a "
                                     "smaller max batch (--batch MIN:OPT:MAX)")  # fmt: skip
        return context

    def _read_foreign(self, trt, path: Path, overrides: dict[str, Any] | None, output: str | None,
                      gpu: tuple[str, str]) -> tuple[ViTConfig, str, tuple[int, int, int], dict[str, Any]]:  # fmt: skip
        """(config, precision, batch, metadata) of another tool's engine: its IO and profile from the engine,
        the rest from `overrides`; what had to be assumed is said in the metadata's warnings."""
        self.io, self.profile = engine_io(trt, self.engine, path, output)
        self.input_name, self.output_name, self.layout = self.io.input_name, self.io.output_name, self.io.layout
        self._check_output_shapes(trt, path)
        config, missing, assumed, guessed = foreign.foreign_config(path, self.io, overrides, probe=lambda h, w: self._output_dims(path, h, w))
        check_profile_size(path, self.io, self.profile, config.img_hw)
        self.missing_preprocessing = foreign.missing_preprocessing_message(path, missing) if missing else None
        self.context.set_input_shape(self.input_name, self.profile[1])  # the inspector reports formats at a set shape
        precision, label, warnings = judge_precision(built_precision(trt, self.engine, self.context))
        warnings += [f"{k}: {reason}" for k, reason in guessed.items()]
        self.io = dataclasses.replace(self.io, precision=label)
        if self.engine.num_optimization_profiles > 1:
            warnings.append(f"the engine has {self.engine.num_optimization_profiles} optimization profiles; vitfast runs the first")
        meta = {"foreign": True, "read_from": "engine", "graph": self.io.describe(), "precision": precision, "assumed": assumed,
                "warnings": warnings, "config_files": [], "gpu": {"name": gpu[0], "compute_capability": gpu[1]},
                "tensorrt": {"version": trt.__version__, "profile": {"input": self.input_name, **dict(zip(("min", "opt", "max"), map(list, self.profile)))}}}  # fmt: skip
        return config, precision, profile_batch(self.io, self.profile), meta

    def _check_output_shapes(self, trt, path: Path) -> None:
        """Refuse an engine with an output whose shape the input does not set: TensorRT writes every output, so each
        needs a buffer of a known size before the run."""
        if not self.context.set_input_shape(self.input_name, self.profile[1]):
            raise ArtifactError(f"{path}: TensorRT refused the engine's own profile shape {self.profile[1]} (its log above says why)")
        for name in io_tensor_names(trt, self.engine)[1]:
            if any(int(d) < 0 for d in self.context.get_tensor_shape(name)):
                raise ArtifactError(f"{path}: output {name!r} has a data-dependent shape (not set by the input's); vitfast runs "
                                    "engines whose outputs' shapes follow from the image batch")  # fmt: skip

    def _output_dims(self, path: Path, h: int, w: int) -> tuple[int, ...]:
        """The output's dims after the batch for h x w images, from TensorRT's shape inference (nothing runs)."""
        check_profile_size(path, self.io, self.profile, (h, w))
        shape = list(self.profile[1])
        axis = 2 if self.layout == "NCHW" else 1
        shape[axis : axis + 2] = [h, w]
        if not self.context.set_input_shape(self.input_name, tuple(shape)):
            raise ArtifactError(f"{path} does not take {h}x{w} images (TensorRT refused input shape {tuple(shape)})")
        return tuple(int(d) if int(d) >= 0 else None for d in self.context.get_tensor_shape(self.output_name))[1:]

    def prepare(self, images) -> torch.Tensor:
        if self.missing_preprocessing and not is_float_images(images):
            raise InputError(self.missing_preprocessing)
        return super().prepare(images)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        with torch.cuda.device(self.device):
            x = x.to(self.device, self.input_dtype)
            x = (x.permute(0, 2, 3, 1) if self.layout == "NHWC" else x).contiguous()
            if x.data_ptr() % TENSOR_ALIGN:  # a view into a larger batch may start anywhere
                x = x.clone()
            if self.cuda_graph:
                return self._replay(x).float()
            caller = torch.cuda.current_stream(self.device)
            self.stream = self.stream or torch.cuda.Stream(self.device)
            self.stream.wait_stream(caller)
            with torch.cuda.stream(self.stream):
                logits = self._enqueue(self.context, x)[self.output_name].float()
            caller.wait_stream(self.stream)
            logits.record_stream(caller)  # allocated on the engine's stream, read on the caller's
        return logits

    def _enqueue(self, context, x: torch.Tensor, outputs: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Run `context` on x (the engine's layout and dtype, on its GPU, contiguous) on the current stream.
        Writes every output of the engine into `outputs` when given, else into new tensors; returns them by name."""
        if not context.set_input_shape(self.input_name, tuple(x.shape)):
            raise InputError(f"TensorRT rejected input shape {tuple(x.shape)}; this engine's batch profile is {self.batch}")
        if outputs is None:
            outputs = {n: torch.empty(tuple(context.get_tensor_shape(n)), dtype=self.output_dtypes[n], device=x.device) for n in self.output_names}
        for name, tensor in ((self.input_name, x), *outputs.items()):
            if not context.set_tensor_address(name, tensor.data_ptr()):
                raise RuntimeError(f"TensorRT refused the address of {name!r} for {self.path} (its log above says why)")
        if not context.execute_async_v3(torch.cuda.current_stream(x.device).cuda_stream):
            raise RuntimeError(f"TensorRT failed to run {self.path} (its log above says why)")
        return outputs

    def _replay(self, x: torch.Tensor) -> torch.Tensor:
        key = tuple(x.shape)
        if key not in self._graphs:
            self._graphs[key] = self._capture(x)
        _, graph, static_in, static_out = self._graphs[key]
        static_in.copy_(x)
        graph.replay()
        return static_out[self.output_name].clone()  # the static buffer is overwritten by the next replay

    def _capture(self, x: torch.Tensor) -> tuple[Any, torch.cuda.CUDAGraph, torch.Tensor, dict[str, torch.Tensor]]:
        """A CUDA graph of one engine run for x.shape, with its own context and static in/out buffers. The context
        is kept with the graph: the graph's kernels use the activation memory it owns."""
        context = self._new_context(self.path)
        static_in = static_input(tuple(x.shape), x.dtype, x.device)  # not an inference tensor, whatever mode captures
        static_in.copy_(x)
        stream = torch.cuda.Stream(self.device)  # capture needs a non-default stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            # TensorRT finishes shape-dependent setup in the first enqueue after set_input_shape;
            # that work must not land in the graph, so run once before capturing.
            static_out = self._enqueue(context, static_in)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                self._enqueue(context, static_in, static_out)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return context, graph, static_in, static_out


def _io_names(trt, engine, path: Path, output: str | None) -> tuple[str, str]:
    """(input name, output name) of a vitfast engine: one input, and the output its sidecar names (else its only one)."""
    inputs, outputs = io_tensor_names(trt, engine)
    chosen = output if output in outputs else outputs[0] if len(outputs) == 1 else None
    if len(inputs) != 1 or chosen is None:
        raise ArtifactError(f"{path} has inputs {inputs} and outputs {outputs}, not one image input and the output its sidecar "
                            f"names ({output!r}); {REBUILD_HINT}")  # fmt: skip
    return inputs[0], chosen


def _torch_dtype(trt, dtype, path: Path, other: bool = False) -> torch.dtype:
    """The torch dtype of an IO tensor: floats for the image and the output vitfast reads; `other`: an output the engine
    writes beside it, which may also hold integers (a top-k index, a mask)."""
    names = ("FLOAT", "HALF", "BF16", *(("INT8", "INT32", "INT64", "BOOL", "UINT8") if other else ()))
    table = {getattr(trt.DataType, n): getattr(torch, t) for n, t in zip(names, ("float32", "float16", "bfloat16", "int8", "int32",
             "int64", "bool", "uint8")) if hasattr(trt.DataType, n)}  # fmt: skip
    if dtype not in table:
        raise ArtifactError(f"{path} has an IO tensor of type {dtype}; vitfast engines take and return floats; {REBUILD_HINT}")
    return table[dtype]
