"""TensorRT export and runtime, on CPU.

TensorRT is not installable here, so `build_engine` and `TensorRTEngine.__init__` run against a
recording fake `tensorrt` module whose names and signatures follow the TensorRT 10 Python
bindings (NVIDIA/TensorRT python/src: pyCore.cpp, pyGraph.cpp, pyOnnx.cpp). Its objects use
`__slots__` and plain enum namespaces, so a misspelt API name in the code under test fails here.
Tests that need the real library and a GPU are at the end and skip without them.
"""

from __future__ import annotations

import importlib.machinery
import io
import json
import shlex
import shutil
import subprocess
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import vitfast
from vitfast.errors import ArtifactError, BackendUnavailable, VitfastWarning
from vitfast.export import tensorrt as trt_export
from vitfast.export.artifacts import base_metadata, read_sidecar, write_sidecar

GPU = {"name": "NVIDIA L4", "compute_capability": "8.9"}


# ---------------------------------------------------------------------------- the fake tensorrt module


@dataclass
class Record:
    """What the code under test did to the fake TensorRT, and knobs to make it fail."""

    version: str = "10.7.0"
    parser_errors: list[str] = field(default_factory=list)
    extra_layers: list[str] = field(default_factory=list)  # LayerType names appended after parsing
    build_fails: bool = False
    context_fails: bool = False  # create_execution_context returns None (TensorRT's answer to too little device memory)
    calls: list[tuple] = field(default_factory=list)
    networks: list = field(default_factory=list)
    configs: list = field(default_factory=list)
    step_results: list[bool] = field(default_factory=list)
    fallback: set[str] = field(default_factory=set)  # pinned layers the builder runs in fp16 anyway (PREFER constraints)
    fusions: dict[str, list[str]] = field(default_factory=dict)  # engine layer name -> the network layers fused into it
    engine_layers: list | None = None  # the built engine's inspector listing (a detailed-verbosity build's)


ONNX_TO_LAYER = {"LayerNormalization": "NORMALIZATION", "QuantizeLinear": "QUANTIZE", "DequantizeLinear": "DEQUANTIZE",
                 "TRT_FP8QuantizeLinear": "QUANTIZE", "TRT_FP8DequantizeLinear": "DEQUANTIZE",  # onnx-tensorrt's importers
                 "MatMul": "MATRIX_MULTIPLY", "Gemm": "MATRIX_MULTIPLY", "Softmax": "SOFTMAX", "Conv": "CONVOLUTION"}  # fmt: skip


def enum(name: str, *members: str) -> types.SimpleNamespace:
    """A pybind11 enum stand-in: members are distinct strings; an unknown member is an AttributeError."""
    return types.SimpleNamespace(**{m: f"{name}.{m}" for m in members})


def fake_tensorrt(rec: Record) -> types.ModuleType:  # noqa: C901 - one class per TensorRT type
    trt = types.ModuleType("tensorrt")
    trt.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)  # find_spec() reads it (tool versions)
    trt.__version__ = rec.version
    trt.DataType = enum("DataType", "FLOAT", "HALF", "BF16", "INT8", "INT32", "INT64", "BOOL", "FP8")
    trt.LayerType = enum("LayerType", "NORMALIZATION", "QUANTIZE", "DEQUANTIZE", "MATRIX_MULTIPLY", "SOFTMAX",
                         "CONVOLUTION", "ELEMENTWISE")  # fmt: skip
    trt.BuilderFlag = enum("BuilderFlag", "FP16", "BF16", "INT8", "FP8", "TF32", "OBEY_PRECISION_CONSTRAINTS",
                           "PREFER_PRECISION_CONSTRAINTS", "STRICT_NANS")  # fmt: skip
    trt.MemoryPoolType = enum("MemoryPoolType", "WORKSPACE", "TACTIC_SHARED_MEMORY")
    trt.TensorIOMode = enum("TensorIOMode", "NONE", "INPUT", "OUTPUT")
    trt.LayerInformationFormat = enum("LayerInformationFormat", "ONELINE", "JSON")
    trt.ProfilingVerbosity = enum("ProfilingVerbosity", "LAYER_NAMES_ONLY", "NONE", "DETAILED")

    class Logger:
        __slots__ = ("min_severity",)
        WARNING, ERROR, INFO = "Severity.WARNING", "Severity.ERROR", "Severity.INFO"

        def __init__(self, min_severity=WARNING):
            self.min_severity = min_severity

    class ITensor:
        __slots__ = ("name", "shape", "dtype")

        def __init__(self, name, shape, dtype):
            self.name, self.shape, self.dtype = name, shape, dtype

    class ILayer:
        __slots__ = ("name", "type", "num_outputs", "_precision", "output_types")

        def __init__(self, name, type_, num_outputs):
            self.name, self.type, self.num_outputs = name, type_, num_outputs
            self._precision, self.output_types = None, {}

        @property
        def precision(self):
            return self._precision or trt.DataType.FLOAT

        @precision.setter
        def precision(self, dtype):
            assert dtype in vars(trt.DataType).values(), dtype
            self._precision = dtype

        def set_output_type(self, index, dtype):
            assert 0 <= index < self.num_outputs and dtype in vars(trt.DataType).values()
            self.output_types[index] = dtype

    class INetworkDefinition:
        __slots__ = ("flags", "inputs", "layers")

        def __init__(self, flags):
            self.flags, self.inputs, self.layers = flags, [], []

        num_inputs = property(lambda self: len(self.inputs))
        num_layers = property(lambda self: len(self.layers))

        def get_input(self, index):
            return self.inputs[index]

        def get_layer(self, index):
            return self.layers[index]

    class ParserError:
        __slots__ = ("_node", "_desc")

        def __init__(self, node, desc):
            self._node, self._desc = node, desc

        def desc(self):
            return self._desc

        def __str__(self):  # the real binding's format: "In node N (func): CODE: desc"
            return f"In node {self._node} (importNode): UNSUPPORTED_NODE: {self._desc}"

    class OnnxParser:
        __slots__ = ("network", "logger", "_errors")

        def __init__(self, network, logger):
            self.network, self.logger, self._errors = network, logger, []

        def parse_from_file(self, model):
            assert isinstance(model, str), "the binding takes the path as str"
            rec.calls.append(("parse_from_file", model))
            if rec.parser_errors:
                self._errors = [ParserError(i, msg) for i, msg in enumerate(rec.parser_errors)]
                return False
            read_onnx_into(model, self.network)
            return True

        num_errors = property(lambda self: len(self._errors))

        def get_error(self, index):
            return self._errors[index]

    def read_onnx_into(path, network):
        import onnx

        graph = onnx.load(path, load_external_data=False).graph
        weights = {t.name for t in graph.initializer}
        for value in graph.input:
            if value.name not in weights:
                dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim)
                network.inputs.append(ITensor(value.name, dims, trt.DataType.FLOAT))
        for node in graph.node:
            kind = getattr(trt.LayerType, ONNX_TO_LAYER.get(node.op_type, "ELEMENTWISE"))
            network.layers.append(ILayer(node.name, kind, len(node.output)))
        for i, name in enumerate(rec.extra_layers):
            network.layers.append(ILayer(f"extra_{i}", getattr(trt.LayerType, name), 1))

    class IOptimizationProfile:
        __slots__ = ("shapes",)

        def __init__(self):
            self.shapes = {}

        def set_shape(self, input, min, opt, max):  # noqa: A002 - the binding's argument names
            self.shapes[input] = (tuple(min), tuple(opt), tuple(max))

    class ITimingCache:
        __slots__ = ("data",)

        def __init__(self, data):
            self.data = data

        def serialize(self):
            return self.data

    class IProgressMonitor:
        def __init__(self):
            pass

    class IBuilderConfig:
        __slots__ = ("flags", "cleared", "pool_limits", "builder_optimization_level", "profiles", "timing_cache",
                     "ignore_mismatch", "_monitor", "profiling_verbosity")  # fmt: skip

        def __init__(self):
            self.flags, self.cleared, self.pool_limits, self.profiles = set(), set(), {}, []
            self.profiling_verbosity = trt.ProfilingVerbosity.LAYER_NAMES_ONLY
            self.builder_optimization_level, self.timing_cache, self.ignore_mismatch, self._monitor = 3, None, None, None

        def set_memory_pool_limit(self, pool, pool_size):
            self.pool_limits[pool] = pool_size

        def set_flag(self, flag):
            assert flag in vars(trt.BuilderFlag).values()
            self.flags.add(flag)

        def clear_flag(self, flag):
            assert flag in vars(trt.BuilderFlag).values()
            self.cleared.add(flag)

        def add_optimization_profile(self, profile):
            assert isinstance(profile, IOptimizationProfile)
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def create_timing_cache(self, serialized_timing_cache):
            return ITimingCache(bytes(serialized_timing_cache))

        def set_timing_cache(self, cache, ignore_mismatch):
            self.ignore_mismatch = ignore_mismatch
            if cache.data.startswith(b"other-gpu"):
                return False
            self.timing_cache = cache
            return True

        def get_timing_cache(self):
            return self.timing_cache

        @property
        def progress_monitor(self):
            return self._monitor

        @progress_monitor.setter
        def progress_monitor(self, monitor):
            assert isinstance(monitor, IProgressMonitor)
            self._monitor = monitor

    class Builder:
        __slots__ = ()

        def __init__(self, logger):
            assert isinstance(logger, Logger)

        def create_network(self, flags=0):
            rec.networks.append(INetworkDefinition(flags))
            return rec.networks[-1]

        def create_builder_config(self):
            rec.configs.append(IBuilderConfig())
            return rec.configs[-1]

        def create_optimization_profile(self):
            return IOptimizationProfile()

        def build_serialized_network(self, network, config):
            rec.calls.append(("build_serialized_network",))
            monitor = config.progress_monitor
            if monitor is not None:
                call = trampoline(monitor)
                call("phase_start", "Building engine", None, 2)
                call("phase_start", "Tactic timing", "Building engine", 3)
                rec.step_results += [call("step_complete", "Tactic timing", s) for s in range(3)]
                call("phase_finish", "Tactic timing")
                rec.step_results += [call("step_complete", "Building engine", s) for s in range(2)]
                call("phase_finish", "Building engine")
                if False in rec.step_results:
                    return None  # cancelled
            if config.timing_cache is not None:
                config.timing_cache.data += b"+timings"
            if config.profiling_verbosity == trt.ProfilingVerbosity.DETAILED:
                rec.engine_layers = engine_layers(network, config)
            return None if rec.build_fails else b"fake-engine-plan"

    def trampoline(monitor):
        """pyCore.cpp's IProgressMonitor trampoline: whatever a callback raises is printed and swallowed, and a
        step_complete that raised answers False (cancel)."""
        def call(method, *args):
            try:
                return getattr(monitor, method)(*args)
            except BaseException as exc:  # noqa: BLE001 - as the C++ trampoline's catch-all
                print(f"[TRT] exception in {method}: {exc!r}", file=sys.__stderr__)
                return False if method == "step_complete" else None

        return call

    def engine_layers(network, config):
        """The inspector's JSON listing of the built engine, in TensorRT's form: one entry per engine layer, a fused one
        named after its members, each output's "Format/Datatype" FP32 where the layer was pinned (and kept) to fp32."""
        def fmt(layers):
            fp32 = all(layer.output_types.get(0) == trt.DataType.FLOAT and layer.name not in rec.fallback for layer in layers)
            return f"Row major linear {'FP32' if fp32 or trt.BuilderFlag.FP16 not in config.flags else 'FP16'} format"

        by_name = {layer.name: layer for layer in network.layers}
        fused = {member for members in rec.fusions.values() for member in members}
        groups = [(name, [by_name[m] for m in members]) for name, members in rec.fusions.items()]
        groups += [(layer.name, [layer]) for layer in network.layers if layer.name not in fused]
        return [{"Name": name, "Inputs": [{"Name": f"{name}_in", "Location": "Device", "Dimensions": [-1], "Format/Datatype": fmt(members)}],
                 "Outputs": [{"Name": f"{name}_out", "Location": "Device", "Dimensions": [-1], "Format/Datatype": fmt(members)}],
                 "TacticValue": "0x0", "StreamId": 0, "Metadata": ""} for name, members in groups]  # fmt: skip

    class IExecutionContext:
        __slots__ = ("engine", "shapes")

        def __init__(self, engine):
            self.engine, self.shapes = engine, {}

        def set_input_shape(self, name, shape):
            lo, _, hi = self.engine.spec["profile"]
            fits = len(shape) == len(lo) and all(a <= d <= b for a, d, b in zip(lo, shape, hi))
            if fits:
                self.shapes[name] = tuple(shape)
            return fits

        def get_tensor_shape(self, name):
            mode, _, shape = self.engine.spec["io"][name]
            if mode == "INPUT":
                return self.shapes.get(name, tuple(shape))
            (given,) = self.shapes.values()  # an output's shape needs the input's
            resolved = self.engine.spec.get("resolved", {}).get(name, shape)
            return (given[0], *(r if d < 0 else d for d, r in zip(shape[1:], resolved[1:])))

    class IEngineInspector:
        __slots__ = ("engine", "execution_context")

        def __init__(self, engine):
            self.engine, self.execution_context = engine, None

        def get_engine_information(self, format):  # noqa: A002 - the binding's argument name
            assert format == trt.LayerInformationFormat.JSON and self.execution_context is not None
            layers = self.engine.spec.get("layers")  # only a detailed-verbosity build lists formats
            return json.dumps({"Layers": layers if layers is not None else ["conv", "gemm"], "Bindings": list(self.engine.spec["io"])})

    VITFAST_PLAN = {"io": {"images": ["INPUT", "FLOAT", [-1, 3, 32, 32]], "logits": ["OUTPUT", "FLOAT", [-1, 10]]},
                    "profile": [[1, 3, 32, 32], [8, 3, 32, 32], [32, 3, 32, 32]], "profiles": 1}  # fmt: skip

    class ICudaEngine:
        """The plan of another tool's engine is a JSON spec (`foreign_plan`); build_engine's fake plan is vitfast's."""

        __slots__ = ("plan", "spec")

        def __init__(self, plan):
            self.plan = plan
            self.spec = json.loads(plan) if plan.startswith(b"{") else VITFAST_PLAN | {"layers": rec.engine_layers}

        num_io_tensors = property(lambda self: len(self.spec["io"]))
        num_optimization_profiles = property(lambda self: self.spec["profiles"])

        def get_tensor_name(self, index):
            return list(self.spec["io"])[index]

        def get_tensor_mode(self, name):
            return getattr(trt.TensorIOMode, self.spec["io"][name][0])

        def get_tensor_dtype(self, name):
            return getattr(trt.DataType, self.spec["io"][name][1])

        def get_tensor_shape(self, name):
            return tuple(self.spec["io"][name][2])

        def get_tensor_profile_shape(self, name, profile_index):
            assert self.spec["io"][name][0] == "INPUT" and profile_index < self.spec["profiles"]
            return [tuple(shape) for shape in self.spec["profile"]]

        def create_execution_context(self):
            return None if rec.context_fails else IExecutionContext(self)

        def create_engine_inspector(self):
            return IEngineInspector(self)

    class Runtime:
        __slots__ = ()

        def __init__(self, logger):
            assert isinstance(logger, Logger)

        def deserialize_cuda_engine(self, serialized_engine):
            plan = bytes(serialized_engine)
            return None if plan.startswith(b"other-tensorrt") else ICudaEngine(plan)  # TensorRT logs why and returns None

    for cls in (Logger, OnnxParser, Builder, IBuilderConfig, IOptimizationProfile, ITimingCache, IProgressMonitor, Runtime):
        setattr(trt, cls.__name__, cls)
    trt.record = rec
    return trt


@pytest.fixture
def rec(monkeypatch) -> Record:
    """Install a fresh fake `tensorrt` module; returns its record."""
    record = Record()
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(record))
    return record


@pytest.fixture
def gpu(monkeypatch) -> dict:
    """Pretend torch sees one CUDA device (GPU): only the calls `current_gpu` makes are patched."""
    major, minor = map(int, GPU["compute_capability"].split("."))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: GPU["name"])
    return GPU


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A real small ViT ONNX file (dynamic batch, opset 18, LayerNormalization nodes) with a vitfast
    sidecar, and the model it was exported from."""
    path = tmp_path_factory.mktemp("onnx") / "vit.onnx"
    model = vitfast.create_model("vit_cifar_patch4_32").set_fused_attn(False).eval()
    with warnings.catch_warnings(), torch.no_grad():  # torch 2.11's tracer refuses parameters that require grad
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer chatter
        torch.onnx.export(model, (torch.randn(1, 3, 32, 32),), str(path), dynamo=False, opset_version=18,
                          input_names=["images"], output_names=["logits"],
                          dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})  # fmt: skip
    write_sidecar(path, base_metadata("onnx", model.config, "fp32", batch=None, dynamic_batch=True))
    return path, model


@pytest.fixture(scope="module")
def onnx_file(exported) -> Path:
    return exported[0]


def build(onnx_file: Path, out: Path, **kwargs) -> Path:
    kwargs.setdefault("progress", False)
    return trt_export.build_engine(onnx_file, out, **kwargs)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------------------- without TensorRT


def test_import_needs_neither_tensorrt_nor_cuda():
    code = (
        "import sys; sys.modules['tensorrt'] = None\n"
        "import torch, vitfast.export.tensorrt as t\n"
        "assert not torch.cuda.is_initialized()\n"
        "assert t.TensorRTEngine and t.build_engine\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_require_tensorrt_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # makes `import tensorrt` fail even where it is installed
    with pytest.raises(BackendUnavailable) as info:
        trt_export.require_tensorrt()
    message = str(info.value)
    assert "\n" not in message and "not installed" in message
    assert "pip install 'tensorrt>=10,<11'" in message and "container" in message


def test_engine_without_tensorrt_is_backend_unavailable(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(BackendUnavailable, match="pip install 'tensorrt>=10,<11'"):
        trt_export.TensorRTEngine(tmp_path / "model.engine")


def test_engine_without_gpu_is_backend_unavailable(rec, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailable, match="NVIDIA GPU"):
        trt_export.TensorRTEngine(tmp_path / "model.engine")


def test_build_without_tensorrt_is_backend_unavailable(monkeypatch, onnx_file, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(BackendUnavailable, match="not installed"):
        build(onnx_file, tmp_path / "vit.engine")
    assert not (tmp_path / "vit.engine").exists()


# ---------------------------------------------------------------------------- pure helpers


def test_profile_shapes_replace_the_dynamic_batch():
    assert trt_export.profile_shapes((-1, 3, 224, 224), (1, 8, 32)) == ((1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224))
    assert trt_export.profile_shapes([-1, 3, 32, 32], "2:4:8")[2] == (8, 3, 32, 32)
    assert trt_export.profile_shapes((4, 3, 32, 32), 4) == ((4, 3, 32, 32),) * 3


@pytest.mark.parametrize(
    "shape, batch, match",
    [
        ((-1, 3, -1, -1), (1, 8, 32), r"takes any image size.*--image-sizes MIN:OPT:MAX"),
        ((-1, -1, 32, 32), (1, 8, 32), r"dynamic dims \[1\] besides the batch"),
        ((-1, 3, -1, 32), (1, 8, 32), r"dynamic dims \[2\] besides the batch.*H and W dynamic together"),
        ((4, 3, 32, 32), (1, 8, 32), "fixed batch of 4.*--batch 4"),
        ((-1, 3, 32, 32), (8, 4, 2), "MIN <= OPT <= MAX"),
        ((-1, 3, 32, 32), (0, 1, 2), "MIN <= OPT <= MAX"),
        ((-1, 3, 32, 32), "1:8", "MIN:OPT:MAX"),
        ((), (1, 1, 1), "scalar"),
    ],
)
def test_profile_shapes_refuses(shape, batch, match):
    with pytest.raises(ArtifactError, match=match):
        trt_export.profile_shapes(shape, batch)


def test_profile_shapes_take_image_sizes_for_any_height_and_width():
    sizes = ((16, 16), (32, 32), (64, 48))
    assert trt_export.profile_shapes((-1, 3, -1, -1), (1, 8, 32), sizes) == ((1, 3, 16, 16), (8, 3, 32, 32), (32, 3, 64, 48))
    with pytest.raises(ArtifactError, match=r"takes one image size, so --image-sizes has nothing to set.*--dynamic-img-size"):
        trt_export.profile_shapes((-1, 3, 32, 32), (1, 8, 32), sizes)


def test_parse_image_sizes():
    from vitfast.export.artifacts import default_image_sizes, parse_image_sizes

    dynamic = vitfast.get_config("vit_cifar_patch4_32", dynamic_img_size=True)  # 32x32 in 4-pixel patches
    assert parse_image_sizes(None, dynamic) == default_image_sizes(dynamic) == ((16, 16), (32, 32), (64, 64))
    assert parse_image_sizes("8:32x24:64X128", dynamic) == ((8, 8), (32, 24), (64, 128))
    assert parse_image_sizes(((4, 8), (32, 32), (40, 40)), dynamic) == ((4, 8), (32, 32), (40, 40))
    assert default_image_sizes(vitfast.get_config("vit_cifar_patch4_32", dynamic_img_size=True, img_size=(4, 12))) == (
        (4, 4), (4, 12), (8, 24))  # fmt: skip
    for spec, match in [("8:32", "MIN:OPT:MAX, each N or HxW"), ("8:32:6x4x4", "MIN:OPT:MAX"), ("a:b:c", "MIN:OPT:MAX"),
                        ("8:30:64", r"not whole 4-pixel patches; e.g. 8x8:28x28:64x64"), ("0:32:64", "not whole 4-pixel patches"),
                        ("16:8:64", "MIN <= OPT <= MAX in height and in width"), ("16x64:32x32:64x64", "MIN <= OPT <= MAX")]:  # fmt: skip
        with pytest.raises(ArtifactError, match=match):
            parse_image_sizes(spec, dynamic)
    with pytest.raises(ArtifactError, match=r"this model takes one \(32x32\); export with --dynamic-img-size"):
        parse_image_sizes("8:16:32", dynamic.replace(dynamic_img_size=False))


@pytest.mark.parametrize(
    "precision, cc, expected",
    [
        ("fp32", "7.5", []),
        ("fp16", "7.5", ["FP16"]),
        ("int8", "8.0", ["INT8", "FP16"]),
        ("fp8", "8.9", ["FP8", "FP16"]),
        ("fp8", (9, 0), ["FP8", "FP16"]),
        ("fp8", "12.0", ["FP8", "FP16"]),
    ],
)
def test_precision_flags(precision, cc, expected):
    assert trt_export.precision_flags(precision, cc) == expected


def test_precision_flags_layernorm_constraint_only_below_fp32():
    assert trt_export.precision_flags("fp16", "8.0", fp32_layernorm=True) == ["FP16", "PREFER_PRECISION_CONSTRAINTS"]
    assert trt_export.precision_flags("fp32", "8.0", fp32_layernorm=True) == []


def test_precision_flags_refuses_fp8_before_ada_and_unknown_precisions():
    with pytest.raises(ArtifactError, match=r"compute capability >= 8\.9.*this one is 8\.0"):
        trt_export.precision_flags("fp8", "8.0")
    with pytest.raises(ArtifactError, match="fp32, fp16, int8, fp8"):
        trt_export.precision_flags("fp64", "9.0")


@pytest.mark.parametrize(
    "precision, batch, flags",
    [
        ("fp16", (2, 3, 5), "--fp16"),
        ("int8", (1, 8, 32), "--int8 --fp16"),
        ("fp8", (4, 4, 4), "--fp8 --fp16"),
        ("fp32", (1, 1, 1), "--noTF32"),
    ],
)  # fmt: skip
def test_trtexec_command_matches_build_engine(onnx_file, tmp_path, precision, batch, flags):
    b1, b2, b3 = batch
    if precision in ("int8", "fp8"):  # from a Q/DQ ONNX, as build_engine requires: its sidecar records the quantization
        onnx_file = as_quantized(onnx_file, tmp_path)
    line = trt_export.trtexec_command(onnx_file, "out dir/vit.engine", precision=precision, batch=batch,
                                      workspace_gib=2.5, optimization_level=4, timing_cache="t.cache")  # fmt: skip
    norms = ",".join(f"{name}:fp32" for name in layernorm_nodes(onnx_file))
    pinned = "" if precision == "fp32" else f"--precisionConstraints=prefer --layerPrecisions={norms} --layerOutputTypes={norms} "
    assert line == (f"trtexec --onnx={onnx_file} '--saveEngine=out dir/vit.engine' {flags} "
                    f"--minShapes=images:{b1}x3x32x32 --optShapes=images:{b2}x3x32x32 --maxShapes=images:{b3}x3x32x32 "
                    f"--memPoolSize=workspace:2560M --builderOptimizationLevel=4 --profilingVerbosity=detailed "
                    f"{pinned}--timingCacheFile=t.cache")  # fmt: skip


def layernorm_nodes(onnx_file: Path) -> list[str]:
    import onnx

    return [n.name for n in onnx.load(str(onnx_file), load_external_data=False).graph.node if n.op_type == "LayerNormalization"]


def test_trtexec_command_pins_the_layers_build_engine_pins(rec, gpu, exported, tmp_path):
    """The line names, for --layerPrecisions, exactly the layers build_engine keeps in fp32: the parser's NORMALIZATION
    layers, named after their ONNX nodes (the fake parser names layers as onnx-tensorrt does)."""
    onnx_file, model = exported
    build(onnx_file, tmp_path / "vit.engine")
    network = rec.networks[-1]
    pinned = [layer.name for layer in network.layers if layer.output_types]
    assert len(pinned) == model.config.depth * 2 + 1  # two norms per block and the final one
    line = shlex.split(trt_export.trtexec_command(onnx_file, "vit.engine", precision="fp16", batch=(1, 8, 32)))
    spec = dict(arg[2:].split("=", 1) for arg in line if arg.startswith("--layer"))
    for flag in ("layerPrecisions", "layerOutputTypes"):
        assert [item.rsplit(":", 1) for item in spec[flag].split(",")] == [[name, "fp32"] for name in pinned]
    unpinned = trt_export.trtexec_command(onnx_file, "vit.engine", precision="fp16", batch=(1, 8, 32), fp32_layernorm=False)
    assert "--layerPrecisions" not in unpinned and "--precisionConstraints" not in unpinned


@pytest.fixture(scope="module")
def rmsnorm_onnx(tmp_path_factory) -> Path:
    """A one-block RMSNorm ViT exported by vitfast in fp32 (as --format trt hands TensorRT): each RMSNorm is Pow,
    ReduceMean, Add, Sqrt, Reciprocal and two Muls, without Casts."""
    from vitfast.export.onnx_export import to_onnx

    model = vitfast.create_model("vit_cifar_patch4_32", norm_layer="rmsnorm", depth=1).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(model, tmp_path_factory.mktemp("rms") / "rms.onnx", batch=(1, 2, 4), progress=False)


def rmsnorm_node_names(path: Path) -> list[str]:
    import onnx

    return [n.name for n in onnx.load(str(path), load_external_data=False).graph.node
            if any(p.key == "namespace" and "RMSNorm/" in p.value for p in n.metadata_props)]  # fmt: skip


def test_an_rmsnorm_engine_keeps_its_norms_ops_in_fp32(rmsnorm_onnx, rec, gpu, tmp_path):
    """An fp16 engine pins every op of each RMSNorm (x^2 overflows fp16 past |x| = 256), says which in its sidecar, and
    the trtexec line names the same layers; the GELU's own Pow stays free."""
    names = rmsnorm_node_names(rmsnorm_onnx)
    assert len(names) == 3 * 7 and not any("Cast" in n for n in names)  # norm1, norm2, the final norm
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no norm layers" warning: the norms are found
        path = build(rmsnorm_onnx, tmp_path / "rms.engine")
    layers = rec.networks[-1].layers
    pinned = [layer.name for layer in layers if layer.precision == "DataType.FLOAT" and layer.output_types == {0: "DataType.FLOAT"}]
    assert pinned == names and all(layer._precision is None for layer in layers if layer.name not in names)
    assert read_sidecar(path)["tensorrt"]["fp32_layers"]["requested"] == names
    line = shlex.split(trt_export.trtexec_command(rmsnorm_onnx, "rms.engine", precision="fp16", batch=(1, 2, 4)))
    assert f"--layerPrecisions={','.join(f'{n}:fp32' for n in names)}" in line and "--precisionConstraints=prefer" in line


def test_an_int8_graph_keeps_the_module_paths_that_find_its_rmsnorm_ops(rmsnorm_onnx, tmp_path):
    """ONNX Runtime's preparation and quantizer drop the exporter's node metadata; quantize_int8 gives it back by node
    name, so an int8 engine of an RMSNorm model pins the same ops as an fp16 one (it found none, and warned of no norm)."""
    pytest.importorskip("onnxruntime", reason="int8 quantization runs ONNX Runtime: pip install 'vitfast[onnx]'")
    from vitfast.export.quantize import quantize_int8

    calibration = torch.randn(20, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a random one-block model's parity is not the point here
        int8 = quantize_int8(rmsnorm_onnx, tmp_path / "rms.int8.onnx", calibration, samples=16, progress=False)
    fp32_names = trt_export.normalization_layer_names(rmsnorm_onnx)
    assert len(fp32_names) == 21 and trt_export.normalization_layer_names(int8) == fp32_names


def test_the_sidecar_records_which_pinned_layers_the_engine_runs_in_fp32(rmsnorm_onnx, rec, gpu, tmp_path):
    """PREFER_PRECISION_CONSTRAINTS may fall back: the sidecar records what the engine's inspector lists (detailed verbosity),
    a fused layer by its members' names, and warns of a pinned layer below fp32; layers fused out of sight (a Myelin
    ForeignNode) are in neither list."""
    names = rmsnorm_node_names(rmsnorm_onnx)
    rec.fallback = {names[1]}
    rec.fusions = {f"PWN(PWN({names[2]}, {names[3]}), {names[4]})": names[2:5], f"{names[5]} + {names[6]}": names[5:7],
                   f"{{ForeignNode[{names[7]}...{names[-1]}]}}": names[7:]}  # fmt: skip
    with pytest.warns(VitfastWarning, match=f"TensorRT ran 1 of the 21 norm layers pinned to fp32 in lower precision: {names[1]} \\(fp16\\)"):
        path = build(rmsnorm_onnx, tmp_path / "rms.engine")
    assert rec.configs[0].profiling_verbosity == "ProfilingVerbosity.DETAILED"
    assert read_sidecar(path)["tensorrt"]["fp32_layers"] == {"requested": names, "fp32": [names[0], *names[2:7]], "not_fp32": {names[1]: "fp16"}}


def test_without_a_layer_listing_the_sidecar_records_the_pins_only_as_requested(onnx_file, rec, gpu, monkeypatch, tmp_path):
    """An engine whose inspector lists no formats says nothing of what the pins achieved: nothing is claimed."""
    monkeypatch.setattr(trt_export, "inspected_layers", lambda trt, engine, context: [{"Name": "node_1", "Outputs": []}])
    meta = read_sidecar(build(onnx_file, tmp_path / "vit.engine"))
    assert meta["tensorrt"]["fp32_layers"] == {"requested": layernorm_nodes(onnx_file), "fp32": None, "not_fp32": None}


def test_trtexec_names_unnamed_norms_as_the_parser_does_and_warns_for_names_it_cannot_pass(onnx_file, tmp_path):
    import onnx

    model = onnx.load(str(onnx_file))
    norms = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    norms[0].name, norms[1].name, norms[2].name = "", "blocks.0/norm,2", "blocks:1/norm"  # trtexec splits at the last ':'
    renamed = tmp_path / "renamed.onnx"
    onnx.save(model, str(renamed))
    write_sidecar(renamed, read_sidecar(onnx_file, verify=False))
    assert trt_export.normalization_layer_names(renamed)[:3] == [f"node_of_{norms[0].output[0]}", "blocks.0/norm,2", "blocks:1/norm"]
    with pytest.warns(UserWarning, match=f"keeps {len(norms) - 1} of {len(norms)} norm layers in fp32 .*'blocks.0/norm,2'"):
        line = trt_export.trtexec_command(renamed, "vit.engine", precision="fp16", batch=(1, 8, 32))
    assert f"node_of_{norms[0].output[0]}:fp32" in line and "blocks:1/norm:fp32" in line and "norm,2" not in line


def test_trtexec_command_gives_no_shapes_for_a_static_graph(onnx_file, tmp_path):
    """A fixed-batch, fixed-size ONNX has nothing to profile: trtexec 10 stops on explicit shapes for it."""
    static = tmp_path / "static.onnx"
    shutil.copyfile(onnx_file, static)
    meta = read_sidecar(onnx_file)
    write_sidecar(static, meta | {"input": meta["input"] | {"shape": [4, 3, 32, 32]}})
    line = trt_export.trtexec_command(static, "vit.engine", precision="fp16", batch=(4, 4, 4))
    assert "Shapes=" not in line and "--fp16" in line


def as_quantized(onnx_file: Path, folder: Path, target: str = "tensorrt") -> Path:
    """A copy of the fp32 ONNX whose sidecar says quantize_int8 made it for `target` (what trtexec_command reads)."""
    copy = folder / f"vit-int8-{target}.onnx"
    shutil.copyfile(onnx_file, copy)
    write_sidecar(copy, read_sidecar(onnx_file) | {"precision": "int8", "int8": {"target": target}})
    return copy


def test_trtexec_command_refuses_what_build_engine_refuses(onnx_file, tmp_path):
    """Also the quantization build_engine checks: trtexec itself would build --int8 from an fp32 ONNX with made-up
    ranges (meaningless outputs) and take the CPU target's uint8 Q/DQ only to fail."""
    with pytest.raises(ArtifactError, match="TensorRT precision must be one of fp32, fp16, int8, fp8, got 'bf16'"):
        trt_export.trtexec_command(onnx_file, "vit.engine", precision="bf16", batch=(1, 1, 1))
    with pytest.raises(ArtifactError, match="MIN <= OPT <= MAX"):
        trt_export.trtexec_command(onnx_file, "vit.engine", precision="fp16", batch=(8, 4, 2))
    with pytest.raises(ArtifactError, match="has no QuantizeLinear/DequantizeLinear nodes"):
        trt_export.trtexec_command(onnx_file, "vit.engine", precision="int8", batch=(1, 1, 1))
    with pytest.raises(ArtifactError, match="quantized for ONNX Runtime's CPU kernels"):
        trt_export.trtexec_command(as_quantized(onnx_file, tmp_path, "cpu"), "vit.engine", precision="int8", batch=(1, 1, 1))
    with pytest.raises(ArtifactError, match="is quantized .* build it with --precision int8"):
        trt_export.trtexec_command(as_quantized(onnx_file, tmp_path), "vit.engine", precision="fp16", batch=(1, 1, 1))


def test_parse_version():
    assert trt_export.parse_version("10.7.0") == (10, 7, 0)
    assert trt_export.parse_version("10.7.0.23") == (10, 7, 0)
    assert trt_export.parse_version("10.13.3.post12") == (10, 13, 3)
    assert trt_export.parse_version("10") == (10, 0, 0)
    with pytest.raises(ArtifactError):
        trt_export.parse_version("unknown")


def engine_meta(version="10.7.0", name="NVIDIA L4", cc="8.9") -> dict:
    return {"tensorrt": {"version": version}, "gpu": {"name": name, "compute_capability": cc}}


def check(meta: dict, trt_version="10.7.0", gpu_name="NVIDIA L4", compute_capability="8.9") -> None:
    trt_export.check_engine_compatible(meta, trt_version=trt_version, gpu_name=gpu_name, compute_capability=compute_capability)


def test_compatible_engine_passes():
    check(engine_meta())
    check(engine_meta("10.7.0.23"))  # a build number or post-release tag does not change the engine format


def test_other_tensorrt_version_is_refused_naming_both():
    with pytest.raises(ArtifactError) as info:
        check(engine_meta("10.3.0"))
    message = str(info.value)
    assert "TensorRT 10.3.0" in message and "TensorRT 10.7.0" in message and "built on" not in message
    assert "vitfast export --format trt" in message and "\n" not in message


def test_other_gpu_is_refused_naming_both():
    with pytest.raises(ArtifactError) as info:
        check(engine_meta(), gpu_name="NVIDIA A100-SXM4-80GB", compute_capability="8.0")
    message = str(info.value)
    assert "NVIDIA L4" in message and "NVIDIA A100-SXM4-80GB" in message and "8.9" in message and "8.0" in message
    assert "10.7.0" not in message and "vitfast export --format trt" in message


def test_same_name_other_compute_capability_is_refused():
    with pytest.raises(ArtifactError, match="compute capability 8.9.*compute capability 9.0"):
        check(engine_meta(), compute_capability="9.0")


def test_sidecar_without_build_record_is_refused():
    with pytest.raises(ArtifactError, match="does not record"):
        check({"config": {}})


def test_check_quantization():
    trt_export.check_quantization("int8", True, "q.onnx")
    trt_export.check_quantization("fp16", False, "m.onnx")
    with pytest.raises(ArtifactError, match="quantize_int8"):
        trt_export.check_quantization("int8", False, "m.onnx")
    with pytest.raises(ArtifactError, match="--precision int8"):
        trt_export.check_quantization("fp16", True, "q.onnx")
    trt_export.check_quantization("int8", True, "q.onnx", int8_target="tensorrt")
    with pytest.raises(ArtifactError, match="target='tensorrt'"):
        trt_export.check_quantization("int8", True, "q.onnx", int8_target="cpu")


# ---------------------------------------------------------------------------- build_engine against the fake


def test_build_fp16_end_to_end(rec, gpu, onnx_file, tmp_path):
    out_dir = tmp_path / "out"
    cache_file = tmp_path / "cache" / "timing.cache"
    cache_file.parent.mkdir()
    cache_file.write_bytes(b"earlier")

    path = build(onnx_file, out_dir / "vit.engine", precision="fp16", batch=(1, 8, 32), workspace_gib=2.5,
                 optimization_level=4, timing_cache=cache_file)  # fmt: skip

    (network,), (config,) = rec.networks, rec.configs
    assert network.flags == 0  # explicit batch is implicit in TensorRT 10; not strongly typed
    assert rec.calls[0] == ("parse_from_file", str(onnx_file))
    assert config.flags == {"BuilderFlag.FP16", "BuilderFlag.PREFER_PRECISION_CONSTRAINTS"}
    assert config.pool_limits == {"MemoryPoolType.WORKSPACE": int(2.5 * 2**30)}
    assert config.builder_optimization_level == 4
    (profile,) = config.profiles
    assert profile.shapes == {"images": ((1, 3, 32, 32), (8, 3, 32, 32), (32, 3, 32, 32))}
    norms = [layer for layer in network.layers if layer.type == "LayerType.NORMALIZATION"]
    assert len(norms) == 2 * 4 + 1  # two per block, depth 4, plus the final norm
    assert all(n.precision == "DataType.FLOAT" and n.output_types == {0: "DataType.FLOAT"} for n in norms)
    assert all(layer._precision is None for layer in network.layers if layer not in norms)

    assert path == out_dir / "vit.engine" and path.read_bytes() == b"fake-engine-plan"
    assert sorted(p.name for p in out_dir.iterdir()) == ["vit.engine", "vit.engine.json"]
    assert config.ignore_mismatch is False and cache_file.read_bytes() == b"earlier+timings"
    assert leftovers(cache_file.parent) == []

    meta = read_sidecar(path)
    source = read_sidecar(onnx_file)
    assert meta["kind"] == "tensorrt" and meta["precision"] == "fp16"
    assert meta["config"] == source["config"] and meta["preprocessing"] == source["preprocessing"]
    assert meta["input"]["batch"] == [1, 8, 32] and meta["input"]["name"] == "images" and meta["input"]["shape"][0] == "batch"
    assert meta["built_from"]["path"] == str(onnx_file) and len(meta["built_from"]["sha256"]) == 64
    assert meta["gpu"] == GPU and meta["parity"] is None
    assert meta["tensorrt"] == {
        "version": "10.7.0",
        "precision": "fp16",
        "profile": {"input": "images", "min": [1, 3, 32, 32], "opt": [8, 3, 32, 32], "max": [32, 3, 32, 32]},
        "builder_optimization_level": 4,
        "workspace_gib": 2.5,
        "flags": ["FP16", "PREFER_PRECISION_CONSTRAINTS"],
        "fp32_layernorm": True,
        "fp32_layers": {"requested": [n.name for n in norms], "fp32": [n.name for n in norms], "not_fp32": {}},
        "timing_cache": str(cache_file),
    }


def test_build_fp32_clears_tf32_and_pins_nothing(rec, gpu, onnx_file, tmp_path):
    build(onnx_file, tmp_path / "vit.engine", precision="fp32", batch="1:1:4")
    (config,) = rec.configs
    assert config.flags == set() and config.cleared == {"BuilderFlag.TF32"}
    assert all(layer._precision is None for layer in rec.networks[0].layers)
    assert config.profiles[0].shapes["images"][2] == (4, 3, 32, 32)
    assert read_sidecar(tmp_path / "vit.engine")["tensorrt"]["fp32_layers"] == {"requested": [], "fp32": None, "not_fp32": None}


def test_build_without_fp32_layernorm_sets_no_constraints(rec, gpu, onnx_file, tmp_path):
    build(onnx_file, tmp_path / "vit.engine", fp32_layernorm=False)
    assert rec.configs[0].flags == {"BuilderFlag.FP16"}
    assert all(layer._precision is None for layer in rec.networks[0].layers)


def test_build_int8_needs_a_quantized_onnx(rec, gpu, onnx_file, tmp_path):
    with pytest.raises(ArtifactError, match="no QuantizeLinear/DequantizeLinear.*quantize_int8"):
        build(onnx_file, tmp_path / "vit.engine", precision="int8")
    assert not (tmp_path / "vit.engine").exists()
    assert ("build_serialized_network",) not in rec.calls


def test_build_int8_sets_int8_and_fp16(rec, gpu, onnx_file, tmp_path):
    rec.extra_layers = ["QUANTIZE", "DEQUANTIZE"]
    build(onnx_file, tmp_path / "vit.engine", precision="int8")
    assert rec.configs[0].flags == {"BuilderFlag.INT8", "BuilderFlag.FP16", "BuilderFlag.PREFER_PRECISION_CONSTRAINTS"}


def test_build_int8_refuses_the_cpu_quantization_target(rec, gpu, onnx_file, tmp_path):
    cpu_int8 = tmp_path / "cpu_int8.onnx"
    shutil.copy(onnx_file, cpu_int8)
    write_sidecar(cpu_int8, read_sidecar(onnx_file) | {"precision": "int8", "int8": {"target": "cpu"}})
    rec.extra_layers = ["QUANTIZE", "DEQUANTIZE"]
    with pytest.raises(ArtifactError, match="uint8"):
        build(cpu_int8, tmp_path / "vit.engine", precision="int8")
    assert not (tmp_path / "vit.engine").exists()


def test_build_fp8_refused_on_compute_capability_8_0(rec, gpu, monkeypatch, onnx_file, tmp_path):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ArtifactError, match=r"8\.9"):
        build(onnx_file, tmp_path / "vit.engine", precision="fp8")
    assert rec.calls == []


def test_fp8_engine_builds_and_its_sidecar_is_read_back(rec, gpu, onnx_file, tmp_path):
    rec.extra_layers = ["QUANTIZE", "DEQUANTIZE"]  # fp8 engines come from a Q/DQ ONNX
    path = build(onnx_file, tmp_path / "vit.engine", precision="fp8")
    assert rec.configs[0].flags == {"BuilderFlag.FP8", "BuilderFlag.FP16", "BuilderFlag.PREFER_PRECISION_CONSTRAINTS"}
    assert read_sidecar(path)["precision"] == "fp8"
    engine = trt_export.TensorRTEngine(path)  # the runtime's sidecar reader used to refuse fp8
    assert engine.precision == "fp8" and vitfast.parity.tolerance("fp8", 1.0)["cosine"] == 0.97


def test_parser_errors_become_one_artifact_error(rec, gpu, onnx_file, tmp_path):
    rec.parser_errors = ["Unsupported operator FancyAttention", "Assertion failed:\n  weights are empty"]
    with pytest.raises(ArtifactError) as info:
        build(onnx_file, tmp_path / "vit.engine")
    message = str(info.value)
    assert "\n" not in message and str(onnx_file) in message
    assert "Unsupported operator FancyAttention" in message and "Assertion failed: weights are empty" in message
    assert list(tmp_path.iterdir()) == []


def test_failed_build_writes_nothing(rec, gpu, onnx_file, tmp_path):
    rec.build_fails = True
    cache_file = tmp_path / "timing.cache"
    cache_file.write_bytes(b"earlier")
    with pytest.raises(ArtifactError, match="could not build"):
        build(onnx_file, tmp_path / "vit.engine", timing_cache=cache_file)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timing.cache"] and cache_file.read_bytes() == b"earlier"


def test_new_timing_cache_is_created(rec, gpu, onnx_file, tmp_path):
    cache_file = tmp_path / "new" / "timing.cache"
    build(onnx_file, tmp_path / "vit.engine", timing_cache=cache_file)
    assert cache_file.read_bytes() == b"+timings"


def test_mismatched_timing_cache_is_replaced(rec, gpu, onnx_file, tmp_path):
    cache_file = tmp_path / "timing.cache"
    cache_file.write_bytes(b"other-gpu timings")
    with pytest.warns(UserWarning, match="does not match"):
        build(onnx_file, tmp_path / "vit.engine", timing_cache=cache_file)
    assert cache_file.read_bytes() == b"+timings"


def test_existing_engine_needs_force(rec, gpu, onnx_file, tmp_path):
    out = tmp_path / "vit.engine"
    out.write_bytes(b"old")
    with pytest.raises(ArtifactError, match="--force"):
        build(onnx_file, out)
    assert rec.calls == [] and out.read_bytes() == b"old"  # refused before any TensorRT work
    build(onnx_file, out, force=True)
    assert out.read_bytes() == b"fake-engine-plan"


@pytest.mark.parametrize(
    "kwargs, match",
    [({"precision": "bf16"}, "fp32, fp16, int8, fp8"), ({"workspace_gib": 0}, "> 0 GiB"),
     ({"optimization_level": 6}, "0..5"), ({"batch": "8:1:2"}, "MIN <= OPT")],
)  # fmt: skip
def test_bad_build_arguments(rec, gpu, onnx_file, tmp_path, kwargs, match):
    with pytest.raises(ArtifactError, match=match):
        build(onnx_file, tmp_path / "vit.engine", **kwargs)
    assert rec.calls == []


def test_an_unreadable_or_missing_onnx_is_refused(rec, gpu, tmp_path):
    bare = tmp_path / "bare.onnx"
    bare.write_bytes(b"not really onnx")  # no sidecar: read as another tool's graph
    with pytest.raises(ArtifactError, match="is not a readable ONNX model"):
        build(bare, tmp_path / "vit.engine")
    with pytest.raises(ArtifactError, match="no such ONNX file"):
        build(tmp_path / "missing.onnx", tmp_path / "vit.engine")


@pytest.mark.parametrize("version", ["8.6.1", "11.4.0.106"])
def test_a_tensorrt_other_than_10_is_refused(rec, gpu, monkeypatch, onnx_file, tmp_path, version):
    """8 lacks the tensor API, 11 the weakly typed networks the build sets precisions on (PyPI's default is 11 now)."""
    monkeypatch.setattr(sys.modules["tensorrt"], "__version__", version)
    with pytest.raises(BackendUnavailable, match=f"builds engines with TensorRT 10, found {version}: run `pip install 'tensorrt>=10,<11'`"):
        build(onnx_file, tmp_path / "vit.engine")
    assert not (tmp_path / "vit.engine").exists()


def test_progress_monitor_on_a_terminal(rec, gpu, monkeypatch, onnx_file, tmp_path):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    build(onnx_file, tmp_path / "vit.engine", progress=True)
    assert isinstance(rec.configs[0].progress_monitor, sys.modules["tensorrt"].IProgressMonitor)
    assert rec.step_results == [True] * 5  # True = keep building


@pytest.mark.parametrize("method, error", [("update", RuntimeError("the display broke")), ("add_task", KeyboardInterrupt()),
                                           ("remove_task", KeyboardInterrupt())])  # fmt: skip
def test_an_error_in_the_progress_monitor_cancels_the_build_and_is_raised_as_itself(rec, gpu, monkeypatch, onnx_file, tmp_path,
                                                                                   method, error):  # fmt: skip
    """TensorRT's trampoline swallows what a callback raises: the monitor keeps it, cancels at the next step and the
    build raises it, a display failure as itself (not "could not build the engine... larger workspace"), Ctrl-C in any
    callback as an interrupt."""
    from rich.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setattr(Progress, method, fail)
    with pytest.raises(type(error), match=str(error) or None):
        build(onnx_file, tmp_path / "vit.engine", progress=True)
    assert False in rec.step_results  # cancelled at the next step
    assert not (tmp_path / "vit.engine").exists()


def test_no_progress_monitor_off_a_terminal(rec, gpu, onnx_file, tmp_path):
    build(onnx_file, tmp_path / "vit.engine", progress=True)  # pytest captures stderr: not a terminal
    assert rec.configs[0].progress_monitor is None


# ---------------------------------------------------------------------------- TensorRTEngine.__init__ against the fake


def test_engine_loads_a_compatible_build(rec, gpu, onnx_file, tmp_path):
    path = build(onnx_file, tmp_path / "vit.engine", batch=(1, 4, 16))
    engine = trt_export.TensorRTEngine(path)
    assert engine.batch == (1, 4, 16) and engine.precision == "fp16" and engine.kind == "tensorrt"
    assert (engine.input_name, engine.output_name) == ("images", "logits")
    assert engine.input_dtype == torch.float32 and engine.device == torch.device("cuda", 0)
    assert engine.config == vitfast.create_model("vit_cifar_patch4_32").config
    names = [f"c{i}" for i in range(10)]  # what the output means and the preprocessing are taken, not ignored
    given = vitfast.load_engine(path, overrides={"mean": [0.5] * 3, "labels": names, "problem_type": "multi_label_classification"})
    assert (given.config.mean, given.config.labels, given.config.problem_type) == ((0.5,) * 3, tuple(names), "multi_label_classification")
    with pytest.raises(vitfast.InputError, match=r"fixes what these override: global_pool 'avg' \(it has 'token'\); drop --global-pool"):
        vitfast.load_engine(path, overrides={"global_pool": "avg"})


def test_an_engine_without_device_memory_for_its_context_says_so(rec, gpu, onnx_file, tmp_path):
    path = build(onnx_file, tmp_path / "vit.engine")
    rec.context_fails = True
    with pytest.raises(BackendUnavailable, match=r"could not create an execution context for .*free GPU memory, or rebuild the engine with a smaller max batch"):
        trt_export.TensorRTEngine(path)


@pytest.fixture(scope="module")
def unpooled_onnx(tmp_path_factory) -> dict[str, Path]:
    """vit_cifar_patch4_32 with global_pool="" and no head, and as feature maps of 2 blocks, exported (before `gpu`
    fakes a CUDA device)."""
    pytest.importorskip("onnxruntime", reason="the ONNX export checks parity in ONNX Runtime: pip install 'vitfast[onnx]'")
    from vitfast.export import to_onnx

    root = tmp_path_factory.mktemp("tokens")
    tokens = vitfast.create_model("vit_cifar_patch4_32", global_pool="", num_classes=0)
    maps = vitfast.create_model("vit_cifar_patch4_32", features_only=True, out_indices=(1, 3))
    return {"tokens": to_onnx(tokens, root / "tokens.onnx"), "maps": to_onnx(maps, root / "maps.onnx")}


@pytest.mark.parametrize("kind, shape", [("tokens", [65, 48]), ("maps", [2, 48, 8, 8])])
def test_an_unpooled_model_builds_an_engine_that_says_its_output_shape(unpooled_onnx, rec, gpu, tmp_path, kind, shape):
    """global_pool="" or features_only: the engine's sidecar (what serve and triton-repo read) has the whole shape,
    [batch, tokens, features] or [batch, maps, C, H, W]."""
    path = build(unpooled_onnx[kind], tmp_path / f"{kind}.engine")
    assert read_sidecar(path)["output"]["shape"] == ["batch", *shape]
    assert trt_export.TensorRTEngine(path).config.output_shape == tuple(shape)


@pytest.fixture(scope="module")
def fp16_onnx(tmp_path_factory) -> Path:
    """vit_cifar_patch4_32 exported by vitfast in fp16 (before `gpu` fakes a CUDA device)."""
    pytest.importorskip("onnxruntime", reason="the ONNX export checks parity in ONNX Runtime: pip install 'vitfast[onnx]'")
    from vitfast.export import to_onnx

    torch.manual_seed(0)
    return to_onnx(vitfast.create_model("vit_cifar_patch4_32"), tmp_path_factory.mktemp("fp16") / "m16.onnx", precision="fp16")


def test_an_fp32_engine_from_an_fp16_graph_is_recorded_as_fp16_and_said(fp16_onnx, rec, gpu, tmp_path):
    """--precision fp32 from an fp16 graph was labelled fp32: check judged it at fp32's tolerances, bench and info said
    fp32. The sidecar records the looser of the two (the builder's own precision under `tensorrt`), with a warning;
    the trtexec line says the same. At the graph's own precision nothing is said."""
    with pytest.warns(VitfastWarning, match=r"m16.onnx is fp16, so an engine built from it at --precision fp32 is no more "
                                            r"accurate than fp16, and is recorded and checked as fp16"):  # fmt: skip
        path = build(fp16_onnx, tmp_path / "e32.engine", precision="fp32")
    meta = read_sidecar(path)
    assert (meta["precision"], meta["tensorrt"]["precision"], meta["tensorrt"]["flags"]) == ("fp16", "fp32", [])
    assert trt_export.TensorRTEngine(path).precision == "fp16"
    with pytest.warns(VitfastWarning, match="no more accurate than fp16"):
        trt_export.trtexec_command(fp16_onnx, "e32.engine", precision="fp32", batch=(1, 8, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", VitfastWarning)
        assert read_sidecar(build(fp16_onnx, tmp_path / "e16.engine", precision="fp16"))["precision"] == "fp16"


@pytest.fixture(scope="module")
def dynamic_onnx(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    """vit_cifar_patch4_32 with dynamic_img_size, exported (any H and W in whole 4-pixel patches), and the model."""
    pytest.importorskip("onnxruntime", reason="the ONNX export checks parity in ONNX Runtime: pip install 'vitfast[onnx]'")
    from vitfast.export import to_onnx

    torch.manual_seed(0)
    model = vitfast.create_model("vit_cifar_patch4_32", dynamic_img_size=True)
    return model, to_onnx(model, tmp_path_factory.mktemp("dynamic") / "any.onnx")


def test_a_triton_repository_refuses_an_engine_without_the_models_own_size(dynamic_onnx, rec, gpu, tmp_path):
    """Its warm-up and uint8 preprocessing send the model's own size (32x32 here); tritonserver fails to load a model
    whose warm-up shape the engine's profile rejects, so the repository is refused, by name, and nothing written."""
    from vitfast.export import triton_repository

    _, onnx_path = dynamic_onnx
    path = build(onnx_path, tmp_path / "large.engine", batch=(1, 2, 4), image_sizes="48:64:96")
    with pytest.raises(ArtifactError, match="takes images of 48x48 to 96x96, not the model's own 32x32.*--image-sizes covering 32x32"):
        triton_repository(path, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()
    covering = build(onnx_path, tmp_path / "covering.engine", batch=(1, 2, 4), image_sizes="16:48:96")
    assert (triton_repository(covering, tmp_path / "repo") / "vit" / "config.pbtxt").exists()


def test_serve_refuses_an_engine_without_the_models_own_size(dynamic_onnx, rec, gpu, tmp_path):
    """`serve`'s uint8 model resizes every image to the model's own size, so such an engine is refused at start, by
    name and with the fix, the rule a repository follows; not bound to answer every uint8 request with an error."""
    pytest.importorskip("pytriton", reason="serving needs PyTriton: pip install 'vitfast[serve]'")
    from serve_helpers import free_ports
    from vitfast.serve import start

    path = build(dynamic_onnx[1], tmp_path / "large.engine", batch=(1, 2, 4), image_sizes="48:64:96")
    http, grpc, metrics = free_ports()
    with pytest.raises(ArtifactError, match="takes images of 48x48 to 96x96, not the model's own 32x32, which the vit_uint8 "
                                            "model resizes every image to; rebuild it with --image-sizes covering 32x32"):  # fmt: skip
        start(path, port=http, grpc_port=grpc, metrics_port=metrics)


def test_a_dynamic_size_onnx_builds_an_engine_for_a_range_of_sizes(dynamic_onnx, rec, gpu, tmp_path):
    """The profile spans the image sizes (default half to twice img_size, optimised for it; or as stated), the sidecar
    records them, and the engine refuses a size outside them, by name, before TensorRT sees it."""
    _, onnx_path = dynamic_onnx
    path = build(onnx_path, tmp_path / "default.engine", batch=(1, 2, 4))
    assert rec.configs[-1].profiles[0].shapes == {"images": ((1, 3, 16, 16), (2, 3, 32, 32), (4, 3, 64, 64))}
    meta = read_sidecar(path)
    assert meta["input"]["image_sizes"] == [[16, 16], [32, 32], [64, 64]] and meta["input"]["shape"] == ["batch", 3, "height", "width"]
    assert meta["tensorrt"]["profile"]["max"] == [4, 3, 64, 64]
    path = build(onnx_path, tmp_path / "stated.engine", batch=(1, 2, 4), image_sizes="8x16:32:48x96")
    assert rec.configs[-1].profiles[0].shapes == {"images": ((1, 3, 8, 16), (2, 3, 32, 32), (4, 3, 48, 96))}
    engine = trt_export.TensorRTEngine(path)
    assert engine.image_sizes == ((8, 16), (32, 32), (48, 96)) and engine.parity_sizes() == [(8, 16), (48, 96)]
    assert engine.prepare(torch.zeros(2, 3, 48, 16)).shape == (2, 3, 48, 16)
    for h, w in [(4, 16), (52, 32), (32, 100)]:
        with pytest.raises(vitfast.InputError, match=f"images of {h}x{w} are outside the sizes this engine was built for, 8x16 to 48x96 "
                                                     f".*--image-sizes covering {h}x{w}"):  # fmt: skip
            engine.prepare(torch.zeros(1, 3, h, w))
    with pytest.raises(vitfast.InputError, match="not whole 4x4 patches"):
        engine.prepare(torch.zeros(1, 3, 33, 32))
    line = trt_export.trtexec_command(onnx_path, "any.engine", precision="fp16", batch=(1, 2, 4), image_sizes="8x16:32:48x96")
    assert "--minShapes=images:1x3x8x16 --optShapes=images:2x3x32x32 --maxShapes=images:4x3x48x96" in line
    assert "--maxShapes=images:4x3x64x64" in trt_export.trtexec_command(onnx_path, "any.engine", precision="fp16", batch=(1, 2, 4))


def test_image_sizes_for_a_fixed_size_onnx_are_refused_before_the_build(rec, gpu, onnx_file, tmp_path):
    with pytest.raises(ArtifactError, match=r"this model takes one \(32x32\); export with --dynamic-img-size"):
        build(onnx_file, tmp_path / "vit.engine", image_sizes="16:32:64")
    assert not rec.calls and list(tmp_path.iterdir()) == []
    with pytest.raises(ArtifactError, match="takes one"):
        trt_export.trtexec_command(onnx_file, "vit.engine", precision="fp16", batch=(1, 1, 1), image_sizes="16:32:64")


def test_engine_parity_of_a_dynamic_size_engine_covers_both_ends_of_its_profile(dynamic_onnx, rec, gpu, monkeypatch, tmp_path):
    """record_engine_parity runs img_size and the profile's smallest and largest sizes (here through a stand-in that runs
    the model, as the fake TensorRT runs nothing); a wrong size fails the parity, and says so in a ParityWarning."""
    from vitfast import pipeline
    from vitfast.runtime.engine import Engine

    model, onnx_path = dynamic_onnx
    path = build(onnx_path, tmp_path / "any.engine", batch=(1, 2, 4), image_sizes="8x16:32:48x96")

    class RunsTheModel(Engine):
        def _run(self, x):
            out = model(x)
            return out + (x.shape[-1] == 96)  # wrong at the largest width only

    monkeypatch.setattr(pipeline, "load_engine", lambda p: RunsTheModel(model.config, precision="fp16", batch=(1, 2, 4),
                                                                        metadata=read_sidecar(p), path=p))  # fmt: skip
    with pytest.warns(vitfast.errors.ParityWarning, match=r"parity FAILED: at 48x96: max_abs_err .*any.engine is kept for inspection"):
        parity = pipeline.record_engine_parity(path, model)  # the engine stays, its sidecar saying so
    assert read_sidecar(path)["parity"] == parity
    assert [o["img_size"] for o in parity["other_sizes"]] == [[8, 16], [48, 96]]
    assert [o["passed"] for o in parity["other_sizes"]] == [True, False] and not parity["passed"]
    assert parity["max_abs_err"] < 1e-6


def test_engine_from_another_tensorrt_is_refused(rec, gpu, monkeypatch, onnx_file, tmp_path):
    path = build(onnx_file, tmp_path / "vit.engine")
    monkeypatch.setattr(sys.modules["tensorrt"], "__version__", "10.8.0")
    with pytest.raises(ArtifactError, match="TensorRT 10.7.0.*TensorRT 10.8.0"):
        trt_export.TensorRTEngine(path)


def test_engine_from_another_gpu_is_refused(rec, gpu, monkeypatch, onnx_file, tmp_path):
    path = build(onnx_file, tmp_path / "vit.engine")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    with pytest.raises(ArtifactError, match="NVIDIA L4.*NVIDIA H100 80GB HBM3"):
        trt_export.TensorRTEngine(path)


# ---------------------------------------------------------------------------- real TensorRT on a GPU


@pytest.fixture
def real_tensorrt():
    pytest.importorskip("tensorrt", reason="needs TensorRT 10 (pip install 'tensorrt>=10,<11', Linux + NVIDIA GPU)")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_real_engine_matches_the_reference(real_tensorrt, exported, tmp_path, precision):
    from vitfast.parity import compare

    onnx_path, model = exported
    path = build(onnx_path, tmp_path / "vit.engine", precision=precision, batch=(1, 4, 8), optimization_level=2)
    images = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(images)
    for cuda_graph in (False, True):
        engine = trt_export.TensorRTEngine(path, cuda_graph=cuda_graph)
        logits = engine(images)
        assert logits.is_cuda and logits.dtype == torch.float32 and logits.shape == (5, 10)
        assert compare(logits.cpu(), expected, precision)["passed"]
        assert torch.equal(engine(images), logits)  # the same context (or replayed graph) gives the same answer
        assert engine(images[:1]).shape == (1, 10)  # another shape: another graph
