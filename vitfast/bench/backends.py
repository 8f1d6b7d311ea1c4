"""The backends `vitfast bench` measures: why one cannot run on this machine, and how each is built.

Every backend runs the same model with the same random weights (`torch.manual_seed(RANDOM_SEED)`,
as `vitfast export --model` does), so their figures are comparable. A backend that cannot run
here is skipped with its reason (`skip_reason`); nothing is emulated or estimated.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

import vitfast
import vitfast.export
from vitfast._version import __version__
from vitfast.config import OUTPUT_MEANING_FIELDS, PREPROCESSING_FIELDS, ViTConfig
from vitfast.data import find_images, random_images
from vitfast.errors import ArtifactError, BackendUnavailable, InputError
from vitfast.foreign import is_onnx_artifact, read_graph_io, resolve_onnx_path
from vitfast.info import library_version
from vitfast.runtime.openvino_engine import openvino_core
from vitfast.export import quantize_int8, to_onnx
from vitfast.export.artifacts import read_sidecar, sidecar_path
from vitfast.export.tensorrt import require_tensorrt
from vitfast.model import HEAD_ROWS
from vitfast.optimize import optimize
from vitfast.precision import BENCH as PRECISIONS
from vitfast.precision import TORCH as TORCH_PRECISIONS
from vitfast.precision import TORCH_DTYPES
from vitfast.registry import create_model
from vitfast.runtime import ENGINE_SUFFIXES, Engine, TorchEngine, load_engine
from vitfast.sources import RANDOM_SEED

BACKENDS = ("eager", "eager-math", "compile", "vitfast", "vitfast-graphs", "vitfast-compile", "vitfast-approx-gelu", "vitfast-every-token",
            "onnxruntime", "openvino", "tensorrt")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
# the int8 QDQ form each CPU runtime runs fastest (benchmarks/cpu_runtimes.py measures them all)
INT8_TARGETS = {"onnxruntime": "cpu", "openvino": "openvino"}
TORCH_BACKENDS = ("eager", "eager-math", "compile", "vitfast", "vitfast-graphs", "vitfast-compile", "vitfast-approx-gelu", "vitfast-every-token")


@dataclass(frozen=True)
class Platform:
    """What this machine offers the backends; each field is a fact or the reason it is missing."""

    cuda: bool
    triton_interpret: bool
    triton: bool
    cxx: str | None  # the C++ compiler torch.compile's CPU code generator would call
    onnxruntime: str | None  # None when importable, else why not
    ort_providers: tuple[str, ...] = ()
    tensorrt: str | None = "not checked"  # None when importable, else why not
    openvino: str | None = "not checked"  # None when importable, else why not
    openvino_capabilities: tuple[str, ...] = ()  # the CPU plugin's OPTIMIZATION_CAPABILITIES (FP16: it computes in fp16)

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if self.cuda else "cpu")


def detect_platform(backends: list[str]) -> Platform:
    """Probe only what the requested backends need (importing TensorRT takes seconds)."""
    ort_reason, providers = None, ()
    try:
        import onnxruntime

        providers = tuple(onnxruntime.get_available_providers())
    except ImportError:
        ort_reason = "onnxruntime is not installed: pip install 'vitfast[onnx]'"
    trt_reason = "not checked"
    if "tensorrt" in backends:
        try:
            require_tensorrt()
            trt_reason = None
        except BackendUnavailable as exc:
            trt_reason = str(exc)
    ov_reason = None if importlib.util.find_spec("openvino") else "OpenVINO is not installed: pip install 'vitfast[openvino]'"
    ov_capabilities = ()
    if "openvino" in backends and ov_reason is None:
        ov_capabilities = tuple(openvino_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    return Platform(
        cuda=torch.cuda.is_available(),
        triton_interpret=os.environ.get("TRITON_INTERPRET") == "1",
        triton=importlib.util.find_spec("triton") is not None,
        cxx=os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++") or shutil.which("c++"),
        onnxruntime=ort_reason,
        ort_providers=providers,
        tensorrt=trt_reason,
        openvino=ov_reason,
        openvino_capabilities=ov_capabilities,
    )


@dataclass
class BackendOptions:
    """The knobs some backends take (the rest of the sweep settings do not concern them)."""

    compile_mode: str = "default"
    engines: list[str] = field(default_factory=list)
    ort_provider: str = "auto"
    threads: int | None = None
    ov_hint: str | None = None  # OpenVINO PERFORMANCE_HINT (latency / throughput); None = OpenVINO's default
    work_dir: Path = field(default_factory=lambda: user_cache_dir() / "bench")
    calib_samples: int = 16
    calib_dir: str | None = None  # real calibration images for int8 rows (default: seeded random pixels)


def user_cache_dir() -> Path:
    """$XDG_CACHE_HOME/vitfast, else ~/.cache/vitfast: the user's own, not a predictable shared /tmp path."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitfast"


def private_dir(path: Path) -> Path:
    """Create `path` (mode 0700) or check an existing one is the user's and not writable by others:
    files cached there are loaded later, so nobody else may put them there."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise InputError(f"the bench cache {path} belongs to another user or is writable by others; "
                         "remove it or pass --work-dir DIR with a folder of your own")  # fmt: skip
    return path


# ---------------------------------------------------------------------------- skip logic
def skip_reason(backend: str, precision: str, platform: Platform, options: BackendOptions, config: ViTConfig) -> str | None:
    """Why `backend` at `precision` cannot be measured here, or None when it can."""
    if backend in TORCH_BACKENDS and precision not in TORCH_PRECISIONS:
        return "PyTorch backends run fp32/fp16/bf16; int8 is measured through onnxruntime (quantize_int8) and tensorrt engines"
    if backend in ("vitfast", "vitfast-graphs", "vitfast-approx-gelu", "vitfast-every-token"):
        return _vitfast_reason(backend, platform)
    if backend == "vitfast-compile":  # torch.compile over the optimized model
        return _vitfast_reason(backend, platform) or _compile_reason(platform)
    if backend == "compile":
        return _compile_reason(platform)
    if backend == "onnxruntime":
        return _ort_reason(precision, platform, options)
    if backend == "openvino":
        if precision == "bf16":
            return "to_onnx exports fp32 and fp16 graphs (int8 through quantize_int8); there is no bf16 ONNX export"
        if platform.openvino or platform.onnxruntime:  # the int8 artifact is calibrated with onnxruntime
            return platform.openvino or platform.onnxruntime
        if precision == "fp16" and "FP16" not in platform.openvino_capabilities:
            return (f"OpenVINO's CPU plugin has no fp16 compute on this CPU (OPTIMIZATION_CAPABILITIES: "
                    f"{', '.join(platform.openvino_capabilities)}): it would run the fp16 graph in fp32")  # fmt: skip
    if backend == "tensorrt":
        return _tensorrt_reason(precision, platform, options, config)
    return None


def _vitfast_reason(backend: str, platform: Platform) -> str | None:
    if platform.triton_interpret:
        return ("TRITON_INTERPRET=1 is set: the Triton kernels would run in the CPU interpreter, "
                "so the figure would time the interpreter, not the kernels; unset it on a CUDA machine")  # fmt: skip
    if not platform.cuda:
        return "needs a CUDA GPU for its Triton kernels (on CPU they only run under TRITON_INTERPRET=1, which times the interpreter)"
    if not platform.triton:
        return "needs Triton: pip install 'vitfast[triton]'"
    return None


def _compile_reason(platform: Platform) -> str | None:
    if platform.cuda and not platform.triton:
        return "torch.compile on a GPU generates Triton kernels and Triton is not installed"
    if not platform.cuda and not platform.cxx:
        return "torch.compile on CPU generates C++ and no C++ compiler (g++, clang++ or $CXX) was found"
    return None


def ort_provider(platform: Platform, options: BackendOptions) -> str:
    """The execution provider to ask for: --ort-provider, or CUDA when both torch and ORT see a GPU."""
    if options.ort_provider != "auto":
        return ORT_PROVIDERS[options.ort_provider]
    return ORT_PROVIDERS["cuda" if platform.cuda and ORT_PROVIDERS["cuda"] in platform.ort_providers else "cpu"]


def _ort_reason(precision: str, platform: Platform, options: BackendOptions) -> str | None:
    if platform.onnxruntime:
        return platform.onnxruntime
    if precision == "bf16":
        return "to_onnx exports fp32 and fp16 graphs (int8 through quantize_int8); there is no bf16 ONNX export"
    provider = ort_provider(platform, options)
    if provider not in platform.ort_providers:
        return f"ONNX Runtime here has {', '.join(platform.ort_providers)}, not {provider} (install onnxruntime-gpu for CUDA)"
    if precision == "int8" and provider == ORT_PROVIDERS["cuda"]:
        return "ONNX Runtime's CUDA provider has no int8 kernels for QDQ models (it would dequantize to float); int8 on GPU is the tensorrt backend"
    return None


def _tensorrt_reason(precision: str, platform: Platform, options: BackendOptions, config: ViTConfig) -> str | None:
    if not platform.cuda:
        return "needs an NVIDIA GPU with CUDA; none is visible to torch"
    if platform.tensorrt:
        return platform.tensorrt
    if not options.engines:
        return "give --engine PATH: an engine built on this GPU with `vitfast export --format trt`"
    _, reason = match_engine(options.engines, config, precision)
    return reason


def match_engine(paths: list[str], config: ViTConfig, precision: str) -> tuple[Path | None, str | None]:
    """The --engine whose sidecar has this model config and precision, or (None, what the engines are)."""
    wanted = _arch(config.to_dict())
    seen = []
    for path in map(Path, paths):
        try:
            meta = read_sidecar(path, verify=False)  # matching only: loading the engine checks the pair
        except ArtifactError as exc:  # one unusable engine must not stop the others (or the sweep)
            seen.append(f"{exc}; an engine without a vitfast sidecar is measured with --artifact {path}")
            continue
        seen.append(f"{path.name}: {meta.get('config', {}).get('name')} {meta.get('precision')}")
        # the sidecar's config through ViTConfig (read_sidecar checked it): fields added since its export take their defaults
        if meta.get("precision") == precision and _arch(ViTConfig.from_dict(meta["config"]).to_dict()) == wanted:
            return path, None
    return None, f"no --engine is {config.name or 'this model'} at {config.img_hw[0]}px in {precision} (given: {'; '.join(seen)})"


def _arch(config: dict[str, Any]) -> dict[str, Any]:
    """The fields that decide the computation (the name, preprocessing and what the output means do not)."""
    return {k: v for k, v in config.items() if k not in ("name", *OUTPUT_MEANING_FIELDS, *PREPROCESSING_FIELDS)}


# ---------------------------------------------------------------------------- building
@dataclass
class Runner:
    """A ready backend: `call(x)` runs one batch, the call timed; inputs are `input_dtype` tensors on `device`,
    each passed through `prepare` once before any call when it is set."""

    call: Callable[[torch.Tensor], Any]
    device: torch.device
    input_dtype: torch.dtype
    timer: str  # "cuda-events" or "perf_counter_ns"
    runs_on: str
    details: dict[str, Any] = field(default_factory=dict)
    memory_outside_torch: str | None = None  # why the peak cannot be read, for allocators we cannot see
    batch_range: tuple[int, int] | None = None  # an engine's profile
    # an engine's input checks and casts, out of the timed call as they are out of the PyTorch rows' (see _engine_call)
    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None
    engine: Engine | None = None  # the artifact's engine (--artifact rows read its config and precision)


def seeded_model(config: ViTConfig) -> torch.nn.Module:
    """The reference model with the weights `vitfast export --model NAME` would give it."""
    torch.manual_seed(RANDOM_SEED)
    return create_model(config)


def prepare(backend: str, precision: str, config: ViTConfig, options: BackendOptions) -> tuple[Path | None, bool]:
    """One-off work before a backend is loaded -> (artifact, reused from the cache).

    Kept apart from `build_runner` so that exporting (and the exporter's imports) is not counted
    in the backend's memory or load time.
    """
    if backend in ("onnxruntime", "openvino"):
        return onnx_artifact(config, precision, options, INT8_TARGETS[backend])
    if backend in ("compile", "vitfast-compile"):
        importlib.import_module("torch._inductor.compile_fx")  # inductor's imports are the process's, not the row's
    return None, False


def build_runner(backend: str, precision: str, config: ViTConfig, platform: Platform, options: BackendOptions,
                 artifact: Path | None = None) -> Runner:  # fmt: skip
    """Load `backend` for `config` at `precision` (only when `skip_reason` is None; after `prepare`)."""
    if backend in TORCH_BACKENDS:
        return _torch_runner(backend, precision, config, platform, options)
    if backend == "onnxruntime":
        return _ort_runner(artifact, platform, options)
    if backend == "openvino":
        return _openvino_runner(artifact, precision, options)
    if backend == "tensorrt":
        return _tensorrt_runner(precision, config, options)
    raise ValueError(f"unknown backend {backend!r}")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _torch_runner(backend: str, precision: str, config: ViTConfig, platform: Platform, options: BackendOptions) -> Runner:
    device = platform.device
    engine = TorchEngine(seeded_model(config), device=str(device), dtype=TORCH_DTYPES[precision])
    model, details = engine.model, {"attention": "SDPA"}
    if backend == "eager-math":
        model.set_fused_attn(False)
        details["attention"] = "explicit softmax(QK^T)V"
    if backend.startswith("vitfast"):
        # vitfast-approx-gelu: GELU's tanh form in fc1's cuBLASLt epilogue, a different function for an erf-GELU model
        approximate = backend == "vitfast-approx-gelu"
        # vitfast-every-token: the last block over every token, as the reference computes it (optimize's head_only off)
        every_token = backend == "vitfast-every-token"
        optimize(model, cuda_graphs=backend == "vitfast-graphs", approximate_gelu=approximate, head_only=not every_token)
        details["attention"] = "vitfast Triton kernel, or SDPA where kernels/attention_dispatch.json measured it faster"
        rows = vars(model).get(HEAD_ROWS)  # what optimize set up: read, not worked out again
        details["last block"] = f"the head's {rows} token(s) only" if rows else "every token"
        if approximate:
            details["gelu"] = "tanh form in fc1's cuBLASLt epilogue" + (
                "" if config.act_layer == "gelu_tanh" else f"; the model's is {config.act_layer!r}: a different function")
    forward = model
    if backend in ("compile", "vitfast-compile"):
        mode = None if options.compile_mode == "default" else options.compile_mode
        # every ViT compiled in a process shares its forward's code object, and with it one recompile limit: a fresh
        # cache per backend (the H100 run of 18ef7c3 timed eager as "compile" once 8 entries had piled up)
        torch._dynamo.reset()
        # dynamic=False: one static graph per batch size, as a deployment at a fixed batch gets
        forward = torch.compile(model, mode=mode, dynamic=False)
        details |= {"compile_mode": options.compile_mode, "dynamic": False}
    timer = "cuda-events" if device.type == "cuda" else "perf_counter_ns"
    # the model is timed directly on inputs already in its dtype and device: no per-call cast
    details["timed"] = "the model's forward on inputs already in its dtype and on its device"
    return Runner(torch.inference_mode()(forward), device, engine.dtype, timer, _device_name(device), details)


def export_sources() -> list[Path]:
    """The source files that build the model and write the ONNX file: vitfast's own modules (the model, its
    layers and config, and what the exporter imports from them) and vitfast.export's. The runtimes, bench,
    CLI and Triton kernels (which an export never runs) are left out."""
    return sorted(p for module in (vitfast, vitfast.export) for p in Path(module.__file__).resolve().parent.glob("*.py"))


def sources_digest(files: list[Path]) -> str:
    """sha256 over the files' names and contents."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _artifact_path(config: ViTConfig, precision: str, options: BackendOptions, target: str) -> Path:
    """Cache path keyed by the architecture, precision, the exporter's sources and the tool versions that shape
    the file. The sources, not just the version: the cache is shared by every checkout, and two commits of one
    version (0.1.0 throughout development) export different graphs. ONNX writes the graph and ONNX Runtime's
    quantizer the int8 file; OpenVINO only runs the files, so its version is not part of the key."""
    recipe = {"arch": _arch(config.to_dict()), "precision": precision, "vitfast": __version__, "torch": torch.__version__,
              "onnx": library_version("onnx"), "onnxruntime": library_version("onnxruntime"),
              "sources": sources_digest(export_sources())}  # fmt: skip
    if precision == "int8":
        recipe |= {"target": target, "calib": _calib_recipe(options)}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    h, w = config.img_hw
    return Path(options.work_dir) / f"{config.name or 'vit'}-{h}x{w}-{precision}-{key}.onnx"


def _calib_recipe(options: BackendOptions) -> str:
    if not options.calib_dir:
        return f"{options.calib_samples} seeded random-pixel images"
    files = find_images(options.calib_dir)[: options.calib_samples]
    listing = hashlib.sha256("\n".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files).encode()).hexdigest()[:12]
    return f"{len(files)} images from {Path(options.calib_dir).resolve()} (listing {listing})"


def onnx_artifact(config: ViTConfig, precision: str, options: BackendOptions, target: str = "cpu") -> tuple[Path, bool]:
    """The ONNX file for (config, precision), exported now or reused from the work dir -> (path, reused);
    int8 files are quantized for `target` (the QDQ form that runtime runs fastest)."""
    path = _artifact_path(config, precision, options, target)
    private_dir(path.parent)
    if path.exists() and sidecar_path(path).exists():
        try:
            read_sidecar(path)  # reused only if the sidecar is sound and the file is the one it describes
            return path, True
        except ArtifactError:
            pass
    if precision == "int8":
        fp32, _ = onnx_artifact(config, "fp32", options)
        # without --calib-dir, random-pixel calibration images: the scales do not fit real data, but
        # int8 speed does not depend on them (the same kernels run whatever the scales are)
        calib = options.calib_dir or random_images(config, options.calib_samples, seed=0)
        quantize_int8(fp32, path, calib, samples=options.calib_samples, target=target, force=True, progress=False)
    else:
        source = {"model": config.name, "weights": "random init, torch.manual_seed(0)", "img_size": config.img_size}
        to_onnx(seeded_model(config), path, precision=precision, force=True, source=source)
    return path, False


def _engine_call(engine: Engine, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Runner fields that time `engine`'s backend run (`Engine._run`) alone, as the PyTorch rows time the forward
    alone: `Engine.prepare` (a full isfinite scan of the batch, with a blocking device-to-host sync on a GPU) and the
    cast to `dtype` run once per input buffer before timing, not in every timed call."""
    prepare = engine.prepare if dtype is None else lambda x: engine.prepare(x).to(dtype)
    return {"call": engine._run, "prepare": prepare, "engine": engine}


def _ort_runner(path: Path, platform: Platform, options: BackendOptions) -> Runner:
    provider = ort_provider(platform, options)
    engine = load_engine(path, backend="onnxruntime", providers=[provider], threads=options.threads)
    if engine.providers[0] != provider:  # ORT falls back silently when a provider's libraries are missing
        raise BackendUnavailable(f"ONNX Runtime could not start {provider} (session has {engine.providers})")
    on_gpu = provider == ORT_PROVIDERS["cuda"]
    details = {"provider": provider, "artifact": str(path),
               "input": "float32 host tensor" + (" (host-to-device copy and logits copy back are timed)" if on_gpu else ""),
               "timed": "the session's run: the tensor's conversion to the graph's input array, the run, the logits as a tensor"}  # fmt: skip
    if engine.precision == "int8":
        details["int8"] = engine.metadata.get("int8")
    if engine.batch:  # a graph with a fixed batch (or a recorded profile) refuses other sizes
        details["profile"] = list(engine.batch)
    return Runner(
        device=torch.device("cpu"), input_dtype=torch.float32, timer="perf_counter_ns",
        runs_on=_device_name(torch.device("cuda")) if on_gpu else "cpu", details=details, **_engine_call(engine),
        memory_outside_torch="ONNX Runtime's CUDA provider allocates outside PyTorch's allocator" if on_gpu else None,
        batch_range=(engine.batch[0], engine.batch[2]) if engine.batch else None,
    )  # fmt: skip


def _openvino_runner(path: Path, precision: str, options: BackendOptions) -> Runner:
    # the engine computes in fp32 unless told otherwise (INFERENCE_PRECISION_HINT f32): the fp16 row asks for f16,
    # else it would time fp32 compute under an fp16 label (skip_reason refuses it where the CPU has no fp16)
    properties = {"INFERENCE_PRECISION_HINT": "f16"} if precision == "fp16" else None
    engine = load_engine(path, backend="openvino", threads=options.threads, hint=options.ov_hint, properties=properties)
    details = {"artifact": str(path), "input": "float32 host tensor", "properties": engine.compiled_properties(),
               "timed": "the infer request's run: the tensor's conversion to an array, the run, the logits as a tensor"}  # fmt: skip
    if precision == "int8":
        details["int8"] = engine.metadata.get("int8")
    return Runner(device=torch.device("cpu"), input_dtype=torch.float32, timer="perf_counter_ns", runs_on="cpu", details=details,
                  memory_outside_torch="OpenVINO allocates outside PyTorch's allocator", **_engine_call(engine))  # fmt: skip


def _tensorrt_runner(precision: str, config: ViTConfig, options: BackendOptions) -> Runner:
    path, reason = match_engine(options.engines, config, precision)
    if path is None:
        raise BackendUnavailable(reason)
    return _engine_runner(path)


def _engine_runner(path: Path) -> Runner:
    engine = load_engine(path)
    device = torch.device("cuda", torch.cuda.current_device())
    lo, _, hi = engine.batch or (1, 1, 1 << 30)
    details = {"engine": str(path), "profile": engine.batch,
               "timed": f"the engine's run on an input already on the GPU in its {str(engine.input_dtype).removeprefix('torch.')}, "
                        "the logits' cast to float32 included"}  # fmt: skip
    return Runner(
        device=device, input_dtype=torch.float32, timer="cuda-events", runs_on=_device_name(device), details=details,
        memory_outside_torch="TensorRT allocates its activations outside PyTorch's allocator", batch_range=(lo, hi),
        **_engine_call(engine, engine.input_dtype),
    )  # fmt: skip


# ---------------------------------------------------------------------------- user artifacts
def onnx_precision(path: Path) -> str:
    """An ONNX artifact's precision, as loading it would say: its vitfast sidecar's, else read from the graph."""
    graph = resolve_onnx_path(path)[0]
    if sidecar_path(graph).exists():
        return read_sidecar(graph).get("precision", "fp32")
    return read_graph_io(graph, output_rank=None).precision


def artifact_runner(path: Path, platform: Platform, options: BackendOptions) -> Runner:
    """A user's artifact (`bench --artifact`) as it is: ONNX file or Optimum folder, TensorRT engine or
    checkpoint; BackendUnavailable when this machine cannot run it. `Runner.engine` is its `Engine`."""
    if is_onnx_artifact(path):
        reason = _ort_reason(onnx_precision(path), platform, options)  # int8 is refused on ORT's CUDA provider, as for --backends
        if reason:
            raise BackendUnavailable(reason)
        return _ort_runner(path, platform, options)
    if path.suffix.lower() in ENGINE_SUFFIXES:
        reason = "needs an NVIDIA GPU with CUDA; none is visible to torch" if not platform.cuda else platform.tensorrt
        if reason:
            raise BackendUnavailable(reason)
        return _engine_runner(path)
    engine = load_engine(path, device=str(platform.device))
    timer = "cuda-events" if platform.cuda else "perf_counter_ns"
    details = {"checkpoint": str(path), "attention": "SDPA", "timed": "the model's forward on inputs already in its dtype and on its device"}
    return Runner(device=platform.device, input_dtype=torch.float32, timer=timer, runs_on=_device_name(platform.device),
                  details=details, **_engine_call(engine, engine.dtype))  # fmt: skip
