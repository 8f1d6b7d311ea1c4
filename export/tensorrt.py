"""ONNX -> TensorRT 10 engine (fp32 / fp16 / int8 / fp8) with its sidecar.

TensorRT is imported only when a function needs it, so importing this module needs neither TensorRT
nor CUDA. Everything that can be decided without the library (profile shapes, builder flags) is a
pure function. Running an engine, and the version / GPU compatibility rule, are the runtime's:
`vitfast.runtime.tensorrt_engine` (`TensorRTEngine` is re-exported here for the public API).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence


from vitfast.config import ViTConfig
from vitfast.errors import ArtifactError, BackendUnavailable, VitfastWarning
from vitfast.parity import looser_precision
from vitfast.precision import QUANTIZED, TENSORRT, require
from vitfast.runtime.tensorrt_engine import (  # noqa: F401  (TensorRTEngine, check_engine_compatible, parse_version: public names)
    REBUILD_HINT,
    TensorRTEngine,
    check_engine_compatible,
    current_gpu,
    parse_compute_capability,
    parse_version,
    require_tensorrt,
    trt_logger,
)
from vitfast.runtime.tensorrt_foreign import format_precision, inspected_layers

from vitfast.atomic import SIDECAR_SUFFIX, atomic_write, check_output_free, claim_output

from .artifacts import base_metadata, made_from, parse_batch, write_sidecar
from .engine_source import EngineSource, check_graph_precision, engine_source
from .scopes import graph_scopes, innermost_module

FP8_MIN_COMPUTE_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0) and newer
TENSORRT_MAJOR = 10
MAX_OPTIMIZATION_LEVEL = 5  # TensorRT's builder optimization levels are 0..5 (3 is its default)
# why a graph may have no norm layers to pin
NO_NORMS = "ONNX opset < 17 splits LayerNorm up, and a graph without torch.onnx's node metadata does not say which ops are RMSNorm's"
Shape = tuple[int, ...]


# ---------------------------------------------------------------------------- pure helpers


def profile_shapes(input_shape: Sequence[int], batch, image_sizes: Sequence[Sequence[int]] | None = None) -> tuple[Shape, Shape, Shape]:
    """Optimization-profile shapes (min, opt, max) for an input.

    input_shape: the input's shape as TensorRT reads it from the ONNX file, -1 for a dynamic dim,
    e.g. (-1, 3, 224, 224). batch: (min, opt, max) / 'MIN:OPT:MAX' / N, see `parse_batch`.
    Returns e.g. (1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224) for batch (1, 8, 32).
    The batch dim may be dynamic (a fixed batch N only accepts batch N:N:N), and so may H and W
    together, with `image_sizes` ((h, w) min, opt, max: `parse_image_sizes`), for a
    --dynamic-img-size export; `image_sizes` of a fixed-size input is refused.
    """
    lo, opt, hi = parse_batch(batch)
    shape = tuple(int(d) for d in input_shape)
    if not shape:
        raise ArtifactError("the ONNX input is a scalar; vitfast engines take images [B, C, H, W]")
    dynamic = [axis for axis, d in enumerate(shape) if d < 0 and axis > 0]
    if dynamic and (dynamic != [2, 3] or len(shape) != 4):
        raise ArtifactError(f"the ONNX input {list(shape)} has dynamic dims {dynamic} besides the batch; vitfast engines take images "
                            "[B, C, H, W] with a dynamic batch, and H and W dynamic together (--dynamic-img-size)")  # fmt: skip
    if dynamic and image_sizes is None:
        raise ArtifactError(f"the ONNX input {list(shape)} takes any image size (--dynamic-img-size); a TensorRT engine needs the range "
                            "of sizes it will take: pass --image-sizes MIN:OPT:MAX (e.g. 112:224:448)")  # fmt: skip
    if image_sizes is not None and not dynamic:
        raise ArtifactError(f"the ONNX input {list(shape)} takes one image size, so --image-sizes has nothing to set; "
                            "export with --dynamic-img-size for a range of sizes")  # fmt: skip
    if shape[0] >= 0 and (lo, opt, hi) != (shape[0],) * 3:
        raise ArtifactError(
            f"the ONNX input has a fixed batch of {shape[0]}, so batch {lo}:{opt}:{hi} is impossible; "
            f"pass --batch {shape[0]} or re-export the ONNX with a dynamic batch"
        )
    sizes = [tuple(hw) for hw in image_sizes] if dynamic else [shape[2:]] * 3
    return tuple((b, *shape[1:2], *hw) if dynamic else (b, *shape[1:]) for b, hw in zip((lo, opt, hi), sizes))


TRTEXEC_PRECISION = {"fp32": ["--noTF32"], "fp16": ["--fp16"], "int8": ["--int8", "--fp16"], "fp8": ["--fp8", "--fp16"]}


def trtexec_command(onnx_path: str | os.PathLike, engine_path: str | os.PathLike, *, precision: str, batch,
                    workspace_gib: float = 4.0, optimization_level: int = 3, timing_cache: str | os.PathLike | None = None,
                    image_sizes: str | tuple | None = None, fp32_layernorm: bool = True,
                    overrides: dict[str, Any] | None = None) -> str:  # fmt: skip
    """The `trtexec` line that builds what `build_engine` would from the ONNX at `onnx_path` (vitfast's, whose
    sidecar gives the input, or another tool's, read as `build_engine` reads it), for a machine where only trtexec
    is at hand. Refused where `build_engine` would refuse the ONNX (`check_quantization`). LayerNorm and RMSNorm are
    kept in fp32 as `build_engine` keeps them (`fp32_layernorm`), by layer name: `normalization_layer_names`. The engine it
    writes has no vitfast sidecar: `load_engine` runs it as another tool's engine, with `--config ONNX.json` for
    the preprocessing. It needs TensorRT 10's trtexec (11's has no --fp16 / --int8)."""
    require(precision, TENSORRT, "TensorRT")
    source = engine_source(onnx_path, overrides, image_sizes)
    int8 = source.meta.get("int8") or {}  # the sidecar of quantize_int8's Q/DQ ONNX; trtexec itself would invent int8 ranges
    quantized = bool(int8) or (source.graph is not None and source.graph.precision in QUANTIZED)
    check_graph_precision(source, precision)
    check_quantization(precision, quantized, source.path, int8_target=int8.get("target"))
    engine_precision(precision, source)  # said here too: the engine has no sidecar, its precision read off its layers at load
    onnx_path, name, shape = source.path, source.input_name, source.input_shape
    shapes = profile_shapes(shape, batch, source.sizes)
    dims = ["x".join(map(str, s)) for s in shapes]
    static = min(shape) >= 0  # trtexec refuses shapes for a graph without dynamic dims
    # --profilingVerbosity=detailed: the engine lists its layers' formats, from which load_engine reads its precision
    args = ["trtexec", f"--onnx={onnx_path}", f"--saveEngine={engine_path}", *TRTEXEC_PRECISION[precision],
            *(() if static else (f"--{which}Shapes={name}:{d}" for which, d in zip(("min", "opt", "max"), dims))),
            f"--memPoolSize=workspace:{round(workspace_gib * 1024)}M", f"--builderOptimizationLevel={optimization_level}",
            "--profilingVerbosity=detailed"]  # fmt: skip
    if fp32_layernorm and precision != "fp32":
        args += _trtexec_fp32_layers(normalization_layer_names(onnx_path))
    if timing_cache:
        args.append(f"--timingCacheFile={timing_cache}")
    return shlex.join(args)


def normalization_layer_names(onnx_path: str | os.PathLike) -> list[str]:
    """The names TensorRT 10's ONNX parser gives the norm layers of the ONNX at `onnx_path`, the layers kept in fp32: one
    NORMALIZATION layer per LayerNormalization node, then one per op of each RMSNorm (elementary ops in every opset
    vitfast writes, found by the module the exporter's node metadata says they came from; Casts set their own types).
    Each is named after its node (`node_of_<its output>` for an unnamed node; onnx-tensorrt's `getNodeName`), the names
    `trtexec --layerPrecisions` matches. Nodes sharing a name would get suffixed layer names; vitfast's exporter names
    each node once."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    scopes = graph_scopes(graph)
    norms = [n for n in graph.node if n.op_type == "LayerNormalization"]
    norms += [n for n in graph.node if n.op_type not in ("Cast", "Constant") and _from_rmsnorm(scopes.get(n.name, ""))]
    return list(dict.fromkeys(n.name or f"node_of_{n.output[0]}" for n in norms))


def _from_rmsnorm(scope: str) -> bool:
    """Whether a node's `namespace` says it came from an RMSNorm module (its innermost one; `scopes.innermost_module`)."""
    return innermost_module(scope)[1].lower().endswith("rmsnorm")


def _trtexec_fp32_layers(names: list[str]) -> list[str]:
    """trtexec flags that keep the layers `names` in fp32 with fp32 outputs, as `_pin_norms_fp32` does, under
    `prefer` constraints as `precision_flags` sets them. trtexec splits its specs at ',' (and each at its last ':'),
    reads quotes and takes '*' as a wildcard, so a name holding ',', a quote or '*' cannot be given; such layers stay
    unpinned, with a warning, as does a graph without norm layers."""
    usable = [n for n in names if not set(n) & set(",'\"*")]
    if len(usable) < len(names) or not names:
        left = [n for n in names if n not in usable]
        warnings.warn(f"the trtexec line keeps {len(usable)} of {len(names)} norm layers in fp32"
                      + (f" (trtexec cannot name {', '.join(map(repr, left))})" if left else f" ({NO_NORMS})")
                      + "; fp16 norms may overflow: build with vitfast export --format trt where TensorRT's Python package is at hand")  # fmt: skip
    if not usable:
        return []
    spec = ",".join(f"{n}:fp32" for n in usable)
    return ["--precisionConstraints=prefer", f"--layerPrecisions={spec}", f"--layerOutputTypes={spec}"]


def precision_flags(precision: str, compute_capability: str | Sequence[int], *, fp32_layernorm: bool = False) -> list[str]:
    """Names of the `tensorrt.BuilderFlag` members to set for `precision` on a GPU of `compute_capability`.

    fp32: none. fp16: FP16. int8: INT8 + FP16, for an explicitly quantized (Q/DQ) ONNX: the layers
    left unquantized then run in fp16 rather than fp32. fp8: FP16 for the layers left unquantized (the fp8 Q/DQ
    nodes set their own types), and FP8, which TensorRT documents as enabling plugins with fp8 I/O (harmless
    otherwise); only on compute capability >= 8.9. `fp32_layernorm` (reduced precisions only) adds
    PREFER_PRECISION_CONSTRAINTS so the norm layers pinned to fp32 keep it, while TensorRT may
    still fall back (with a warning) where no fp32 kernel fits a fusion, rather than fail the build.
    """
    require(precision, TENSORRT, "TensorRT")
    flags = {"fp32": [], "fp16": ["FP16"], "int8": ["INT8", "FP16"], "fp8": ["FP8", "FP16"]}[precision]
    if precision == "fp8" and parse_compute_capability(compute_capability) < FP8_MIN_COMPUTE_CAPABILITY:
        raise ArtifactError(
            f"fp8 engines need a GPU of compute capability >= 8.9 (Ada, Hopper or newer), this one is "
            f"{'.'.join(map(str, parse_compute_capability(compute_capability)))}; use --precision int8 or fp16"
        )
    if fp32_layernorm and precision != "fp32":
        flags = [*flags, "PREFER_PRECISION_CONSTRAINTS"]
    return flags


def check_quantization(precision: str, quantized: bool, source: str | os.PathLike, *, int8_target: str | None = None) -> None:
    """int8/fp8 engines need an explicitly quantized (Q/DQ) ONNX; a Q/DQ ONNX needs int8/fp8.

    vitfast never uses TensorRT's implicit INT8 calibrators (deprecated in TensorRT 10.1): the
    scales come from the Q/DQ nodes `vitfast.export.quantize_int8` writes. `int8_target` is the
    target recorded in that ONNX's sidecar: TensorRT takes only symmetric int8 Q/DQ, not the
    asymmetric uint8 activations of the "cpu" target.
    """
    if quantized and int8_target == "cpu":
        raise ArtifactError(
            f"{source} was quantized for ONNX Runtime's CPU kernels (asymmetric uint8 activations), which TensorRT "
            "cannot build; quantize the fp32 ONNX again with quantize_int8(..., target='tensorrt')"
        )
    if precision in QUANTIZED and not quantized:
        raise ArtifactError(
            f"{source} has no QuantizeLinear/DequantizeLinear nodes, so it cannot become a {precision} engine; "
            "quantize it first (vitfast.export.quantize_int8, `vitfast export --format onnx --precision int8 --calib-dir DIR`)"
        )
    if precision not in QUANTIZED and quantized:
        raise ArtifactError(f"{source} is quantized (QuantizeLinear/DequantizeLinear nodes); build it with --precision int8")


# ---------------------------------------------------------------------------- building


def build_engine(
    onnx_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    precision: str = "fp16",
    batch: tuple[int, int, int] | str | int = (1, 8, 32),
    workspace_gib: float = 4.0,
    optimization_level: int = 3,
    timing_cache: str | os.PathLike | None = None,
    fp32_layernorm: bool = True,
    image_sizes: str | tuple | None = None,
    overrides: dict[str, Any] | None = None,
    force: bool = False,
    intermediate: bool = False,
    progress: bool = True,
) -> Path:
    """Build a serialized TensorRT engine at `out_path` (+ `out_path.json` sidecar) from an ONNX file: vitfast's, or
    another tool's (e.g. ModelOpt's int8 / fp8 Q/DQ graph, an Optimum export folder) with `overrides`, the ViTConfig
    fields its graph does not hold: mean / std (required: the sidecar records them), resize / crop, class names, and
    img_size for a graph of any size, which is built for that one size (`vitfast.export.engine_source`).

    precision: fp32 | fp16 | int8 | fp8 (int8/fp8 need a Q/DQ ONNX; fp8 a GPU of compute capability
    >= 8.9). batch: the optimization profile's (min, opt, max) batch sizes. workspace_gib: TensorRT's
    workspace pool limit in GiB. optimization_level: builder optimization level 0..5. timing_cache:
    a file of tactic timings, read when it exists and written back (atomically) after the build.
    fp32_layernorm: keep LayerNorm and RMSNorm layers in fp32 in reduced-precision engines (an fp16 RMSNorm
    can overflow; the sidecar's `tensorrt.fp32_layers` names the layers, and those the engine says run in fp32:
    `_pinned_precisions`). image_sizes: for a --dynamic-img-size ONNX, the (min, opt, max) image sizes the engine
    takes ('MIN:OPT:MAX', each N or HxW; default half to twice img_size, optimised for img_size: see
    `parse_image_sizes`). The engine and sidecar are written atomically; `force` overwrites an existing
    engine. `intermediate`: `onnx_path` is the caller's temporary, not kept; the sidecar's `built_from` records it by
    its sha256 alone. `progress` shows a progress bar when stderr is a terminal. The sidecar's `parity` is
    left None for the caller to fill in. The sidecar's `precision` is the looser of `precision` and the graph's own, said
    in a warning where they differ (`engine_precision`: an fp16 graph built at fp32 gives an fp16 engine). Returns `out_path`.
    """
    out_path = Path(out_path)
    _check_build_args(precision, workspace_gib, optimization_level)
    batch = parse_batch(batch)
    source = engine_source(onnx_path, overrides, image_sizes)
    onnx_path, source_meta = source.path, source.meta
    if source.picked:
        warnings.warn(source.picked)
    check_output_free(out_path, force, beside=(SIDECAR_SUFFIX,))  # fail before a build that can take minutes, not after it
    trt = require_tensorrt()
    _require_tensorrt_10(trt.__version__)
    gpu_name, compute_capability = current_gpu()
    pin_layernorm = fp32_layernorm and precision != "fp32"
    flags = precision_flags(precision, compute_capability, fp32_layernorm=pin_layernorm)

    builder, network = _parse_onnx(trt, onnx_path)
    check_graph_precision(source, precision)  # first: it names the precision a quantized graph needs
    check_quantization(precision, _is_quantized(trt, network), onnx_path,
                       int8_target=(source_meta.get("int8") or {}).get("target"))  # fmt: skip
    achieved = engine_precision(precision, source)
    input_name, shapes, dynamic_batch = _input_profile(network, batch, source)
    config = builder.create_builder_config()
    _set_options(trt, config, precision, flags, workspace_gib, optimization_level)
    fp32_layers = _pin_norms_fp32(trt, network, normalization_layer_names(onnx_path)) if pin_layernorm else []
    _add_profile(builder, config, input_name, shapes)
    cache = _attach_timing_cache(config, timing_cache)
    serialized = _build(trt, builder, network, config, show_progress=progress and sys.stderr.isatty())
    fp32_layers = _pinned_precisions(trt, serialized, fp32_layers, input_name, shapes[1])

    meta = _engine_metadata(onnx_path, source_meta, achieved, batch, dynamic_batch, input_name, intermediate)
    if source.sizes and not source.graph:  # another tool's graph of any size is built for one: the config's
        meta["input"]["image_sizes"] = [list(hw) for hw in source.sizes]
    if source.graph:  # another tool's graph: its architecture is unknown, its output the one `load_engine` would run
        meta |= {"foreign": True, "graph": source.graph.describe(), "assumed": list(source.assumed), "config_files": list(source.config_files)}
        meta["input"]["dtype"] = source.graph.dtype
        meta["output"] |= {"name": source.graph.output_name, "dtype": source.graph.output_dtype}
    meta["gpu"] = {"name": gpu_name, "compute_capability": compute_capability}
    meta["tensorrt"] = {
        "version": trt.__version__,
        "precision": precision,  # the builder's; the sidecar's `precision` is what the engine achieves (`engine_precision`)
        "profile": {"input": input_name, "min": list(shapes[0]), "opt": list(shapes[1]), "max": list(shapes[2])},
        "builder_optimization_level": optimization_level,
        "workspace_gib": workspace_gib,
        "flags": flags,
        "fp32_layernorm": fp32_layernorm,
        "fp32_layers": fp32_layers,
        "timing_cache": str(timing_cache) if timing_cache is not None else None,
    }
    with claim_output(out_path, force) as out:
        out.tmp.write_bytes(serialized)
        write_sidecar(out.tmp, meta)
    if cache is not None:
        atomic_write(timing_cache, lambda tmp: tmp.write_bytes(memoryview(cache.serialize())))
    return out_path


def engine_precision(precision: str, source: EngineSource) -> str:
    """The precision an engine built at `precision` from `source` achieves: the looser of it and the graph's own (vitfast's
    sidecar, or what another tool's graph holds). An fp16 graph built at fp32 keeps its fp16 weights and casts, so calling
    it fp32 would have `check` judge it at fp32's tolerances and `bench` / `info` report fp32: it is recorded as fp16, and
    said (a warning), not refused, since the build itself is sound."""
    graph = source.meta.get("precision", "fp32")
    achieved = looser_precision(precision, graph)
    if achieved != precision:
        warnings.warn(VitfastWarning(f"{source.path} is {graph}, so an engine built from it at --precision {precision} is no "
                                     f"more accurate than {graph}, and is recorded and checked as {achieved} (at {achieved}'s tolerances); "
                                     f"build from an {precision} export for a {precision} engine"), stacklevel=3)  # fmt: skip
    return achieved


def _check_build_args(precision: str, workspace_gib: float, optimization_level: int) -> None:
    require(precision, TENSORRT, "TensorRT")
    if not workspace_gib > 0:
        raise ArtifactError(f"the TensorRT workspace must be > 0 GiB, got {workspace_gib}")
    if optimization_level not in range(MAX_OPTIMIZATION_LEVEL + 1):
        raise ArtifactError(
            f"the builder optimization level must be 0..{MAX_OPTIMIZATION_LEVEL} (3 is TensorRT's default), "
            f"got {optimization_level!r}"
        )


def _require_tensorrt_10(version: str) -> None:
    """The build is written against TensorRT 10's API: 11 drops the weakly typed networks it sets precisions on
    (BuilderFlag.FP16 / INT8, layer precisions)."""
    if parse_version(version)[0] != TENSORRT_MAJOR:
        raise BackendUnavailable(f"vitfast builds engines with TensorRT {TENSORRT_MAJOR}, found {version}: "
                                 f"run `pip install 'tensorrt>={TENSORRT_MAJOR},<{TENSORRT_MAJOR + 1}'`")  # fmt: skip


def _parse_onnx(trt, onnx_path: Path):
    """-> (builder, network) with the ONNX graph parsed in; every parser error in one `ArtifactError`."""
    builder = trt.Builder(trt_logger(trt))
    # TensorRT 10 networks are always explicit-batch (EXPLICIT_BATCH is deprecated and ignored);
    # no STRONGLY_TYPED flag, so the precision flags and per-layer constraints below apply.
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, trt_logger(trt))
    # From the file rather than bytes, so external weights (`*.data`) beside it are found.
    if not parser.parse_from_file(str(onnx_path)):
        errors = " | ".join(" ".join(str(parser.get_error(i)).split()) for i in range(parser.num_errors))
        raise ArtifactError(
            f"TensorRT cannot parse {onnx_path}: {errors or 'no details given'}; "
            "re-export it with `vitfast export --format onnx` or use a newer TensorRT"
        )
    return builder, network


def _layers(network) -> Iterator[Any]:
    return (network.get_layer(i) for i in range(network.num_layers))


def _is_quantized(trt, network) -> bool:
    qdq = (trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE)
    return any(layer.type in qdq for layer in _layers(network))


def _input_profile(network, batch: tuple[int, int, int], source: EngineSource) -> tuple[str, tuple[Shape, Shape, Shape], bool]:
    """(input name, profile shapes, whether the ONNX batch dim is dynamic) for the single image input. A dim the network
    leaves dynamic but the source knows is known (Optimum 1.x's channel axis: its patch Conv's weight says)."""
    if network.num_inputs != 1:
        raise ArtifactError(f"the ONNX graph has {network.num_inputs} inputs; vitfast engines take one image input")
    tensor = network.get_input(0)
    shape = tuple(tensor.shape)
    if len(shape) == len(source.input_shape):
        shape = tuple(d if d >= 0 else known for d, known in zip(shape, source.input_shape))
    return tensor.name, profile_shapes(shape, batch, source.sizes), shape[0] < 0


def _set_options(trt, config, precision: str, flags: list[str], workspace_gib: float, optimization_level: int) -> None:
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * 2**30))
    config.builder_optimization_level = optimization_level
    # the engine then lists its layers' formats: what the fp32 pins achieved (`_pinned_precisions`), what it runs at load
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if precision == "fp32":
        # TF32 is on by default; it rounds matmul inputs to 10-bit mantissas (~1e-3 relative
        # error), far past what an fp32 engine promises.
        config.clear_flag(trt.BuilderFlag.TF32)
    for name in flags:
        config.set_flag(getattr(trt.BuilderFlag, name))


def _pin_norms_fp32(trt, network, names: list[str]) -> list[str]:
    """Run every NORMALIZATION layer (ONNX LayerNormalization, opset >= 17) and the layers named `names` (an RMSNorm's
    elementary ops: `normalization_layer_names`) in fp32 with fp32 outputs. onnx-tensorrt computes a LayerNormalization's
    statistics in its stash_type (fp32 by default) whatever the flags, but its input and output may become fp16; an
    RMSNorm's fp16 x^2 overflows past |x| = 256. Returns the names of the layers pinned."""
    wanted, pinned = set(names), []
    for layer in _layers(network):
        if layer.type == trt.LayerType.NORMALIZATION or layer.name in wanted:
            layer.precision = trt.DataType.FLOAT
            for index in range(layer.num_outputs):
                layer.set_output_type(index, trt.DataType.FLOAT)
            pinned.append(layer.name)
    if not pinned:
        warnings.warn(f"no norm layers to keep in fp32 ({NO_NORMS}); fp16 norms may overflow")
    return pinned


def _pinned_precisions(trt, serialized, pinned: list[str], input_name: str, shape: Shape) -> dict[str, Any]:
    """What the engine says of the layers pinned to fp32 (PREFER_PRECISION_CONSTRAINTS lets TensorRT fall back): {"requested":
    their names, "fp32": those its inspector lists with fp32 outputs, "not_fp32": {name: the precision listed}}, the last
    two None when it lists no formats. A requested layer in neither was fused out of sight (a Myelin ForeignNode lists
    only its own I/O). Warns of each pinned layer listed below fp32."""
    record = {"requested": pinned, "fp32": None, "not_fp32": None}
    engine = trt.Runtime(trt_logger(trt)).deserialize_cuda_engine(serialized) if pinned else None
    context = engine.create_execution_context() if engine is not None else None
    if context is None or not context.set_input_shape(input_name, shape):  # the inspector names formats at a set shape
        return record
    formats = {}
    for layer in inspected_layers(trt, engine, context):
        outputs = " ".join(str(t.get("Format/Datatype", "")) for t in layer.get("Outputs", ()) if isinstance(t, dict))
        for name in re.split(r" \+ |PWN\(|\)|, ", str(layer.get("Name", ""))):  # fused layers: "a + b", "PWN(PWN(a, b), c)"
            formats[name] = format_precision(outputs)
    listed = {name: formats[name] for name in pinned if formats.get(name)}
    if not listed:
        return record
    record |= {"fp32": [n for n, p in listed.items() if p == "fp32"], "not_fp32": {n: p for n, p in listed.items() if p != "fp32"}}
    if record["not_fp32"]:
        below = ", ".join(f"{n} ({p})" for n, p in record["not_fp32"].items())
        warnings.warn(VitfastWarning(f"TensorRT ran {len(record['not_fp32'])} of the {len(pinned)} norm layers pinned to fp32 in lower "
                                     f"precision: {below}; large activations may overflow there: check the engine's parity, or "
                                     "build it with --precision fp32"), stacklevel=3)  # fmt: skip
    return record


def _add_profile(builder, config, input_name: str, shapes: tuple[Shape, Shape, Shape]) -> None:
    profile = builder.create_optimization_profile()
    profile.set_shape(input_name, *shapes)
    if config.add_optimization_profile(profile) < 0:
        raise ArtifactError(f"TensorRT rejected the optimization profile {shapes} for input {input_name!r}; check --batch and --image-sizes")


def _attach_timing_cache(config, path: str | os.PathLike | None):
    """The ITimingCache the build reads and extends: loaded from `path` when it exists, else empty."""
    if path is None:
        return None
    path = Path(path)
    cache = config.create_timing_cache(path.read_bytes() if path.is_file() else b"")
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        # made by another TensorRT version or GPU: its timings do not apply here, so start afresh
        warnings.warn(f"timing cache {path} does not match this TensorRT version / GPU; starting a new one")
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
    return cache


def _build(trt, builder, network, config, *, show_progress: bool):
    """builder.build_serialized_network, with a progress bar on a terminal -> the engine bytes (IHostMemory)."""
    with _build_progress(trt, config, show_progress) as monitor:
        serialized = builder.build_serialized_network(network, config)
    if monitor is not None and monitor.error is not None:
        raise monitor.error  # Ctrl-C, or the progress display's own failure: not TensorRT's
    if serialized is None:
        raise ArtifactError(
            "TensorRT could not build the engine (its log above says why); try a larger workspace, "
            "--precision fp32 or a newer TensorRT"
        )
    return serialized


@contextlib.contextmanager
def _build_progress(trt, config, enabled: bool):
    """Attach a rich progress bar fed by an IProgressMonitor to `config` for the duration; yields the monitor."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        monitor = _progress_monitor(trt, bar)
        config.progress_monitor = monitor
        yield monitor


def _progress_monitor(trt, bar):
    """A `trt.IProgressMonitor` showing each builder phase as a task of `bar` (a rich Progress),
    nested phases indented. TensorRT calls it from several threads, hence the lock. TensorRT's trampoline
    prints and swallows whatever a callback raises (a raising step_complete cancels the build), so each
    callback keeps its exception in `error` (Ctrl-C included) and cancels; `_build` raises it afterwards."""

    class RichProgressMonitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)  # pybind11 trampolines need the explicit base __init__
            self._tasks: dict[str, tuple[Any, int]] = {}  # phase -> (task id, nesting depth)
            self._lock = threading.Lock()
            self.error: BaseException | None = None

        def phase_start(self, phase_name, parent_phase, num_steps):
            try:
                with self._lock:
                    depth = self._tasks[parent_phase][1] + 1 if parent_phase in self._tasks else 0
                    self._tasks[phase_name] = (bar.add_task("  " * depth + phase_name, total=num_steps), depth)
            except BaseException as exc:  # noqa: BLE001 - kept for _build, see the docstring
                self.error = self.error or exc

        def step_complete(self, phase_name, step):
            try:
                with self._lock:
                    task = self._tasks.get(phase_name)
                if task is not None:
                    bar.update(task[0], completed=step + 1)  # steps count from 0
            except BaseException as exc:  # noqa: BLE001
                self.error = self.error or exc
            return self.error is None  # False cancels the build

        def phase_finish(self, phase_name):
            try:
                with self._lock:
                    task = self._tasks.pop(phase_name, None)
                if task is not None:
                    bar.remove_task(task[0])
            except BaseException as exc:  # noqa: BLE001
                self.error = self.error or exc

    return RichProgressMonitor()


def _engine_metadata(onnx_path: Path, source_meta: dict[str, Any], precision: str, batch: tuple[int, int, int],
                     dynamic_batch: bool, input_name: str, intermediate: bool) -> dict[str, Any]:  # fmt: skip
    """The sidecar fields shared with other artifacts; config and preprocessing copied from the ONNX's sidecar."""
    meta = base_metadata("tensorrt", ViTConfig.from_dict(source_meta["config"]), precision, batch=batch, dynamic_batch=dynamic_batch)
    meta["built_from"] = made_from(onnx_path, intermediate=intermediate)  # the ONNX file; "source" stays the model it came from
    meta["source"] = source_meta.get("source")
    meta["config"] = source_meta["config"]
    meta["preprocessing"] = source_meta.get("preprocessing", meta["preprocessing"])
    meta["input"]["name"] = input_name
    meta["parity"] = None  # measured on this GPU by the caller
    return meta


