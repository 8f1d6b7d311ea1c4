"""The ONNX graph a TensorRT engine is built from: vitfast's export (config and preprocessing in its sidecar) or
another tool's (NVIDIA ModelOpt's int8 / fp8 Q/DQ graphs, Optimum's export folders, a plain `torch.onnx.export`),
whose input and output are read from the graph as `load_engine` reads them and whose preprocessing comes from the
caller's `overrides` (--config and the flags): the engine's sidecar records it, so it is required, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitfast.config import ViTConfig
from vitfast.errors import ArtifactError, ConfigError, InputError
from vitfast.foreign import GraphIO, config_files, foreign_config, read_graph_io, resolve_onnx_path
from vitfast.precision import QUANTIZED

from .artifacts import parse_image_sizes, read_sidecar, sidecar_path

Sizes = tuple[tuple[int, int], tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class EngineSource:
    """path: the ONNX file (an export folder resolved to its graph). meta: vitfast's sidecar, or for another tool's
    graph the same fields (config, source). sizes: the profile's (min, opt, max) image sizes, None for the graph's one
    size. graph: what was read from another tool's graph (None for vitfast's). assumed: the resize/crop defaults taken.
    picked: which graph of a folder holding several is built, and the others (None for a file). config_files: the
    settings files read beside another tool's graph."""

    path: Path
    meta: dict[str, Any]
    sizes: Sizes | None
    graph: GraphIO | None = None
    assumed: tuple[str, ...] = ()
    picked: str | None = None
    config_files: tuple[str, ...] = ()  # the settings files read beside another tool's graph

    @property
    def input_name(self) -> str:
        return self.graph.input_name if self.graph else self.meta["input"]["name"]

    @property
    def input_shape(self) -> list[int]:
        """The input's dims as TensorRT reads them, -1 for a dynamic one (the channels of another tool's graph known)."""
        if self.graph:
            return [self.graph.batch or -1, self.graph.in_chans, *(d or -1 for d in self.graph.hw)]
        return [d if isinstance(d, int) else -1 for d in self.meta["input"]["shape"]]


def engine_source(onnx_path: str | Path, overrides: dict[str, Any] | None, image_sizes: str | tuple | None) -> EngineSource:
    """What a build needs of the ONNX at `onnx_path`; `overrides` (ViTConfig fields: preprocessing, class names,
    img_size for a graph of any size) only for another tool's graph; `image_sizes` only for vitfast's
    --dynamic-img-size export (another tool's graph of any size is built for the one --img-size)."""
    path, picked = resolve_onnx_path(Path(onnx_path))
    if not path.is_file():
        raise ArtifactError(f"no such ONNX file: {path}; export one with `vitfast export --format onnx`")
    if sidecar_path(path).exists():
        if overrides:
            raise InputError(f"{path} is vitfast's export: its sidecar records the config and preprocessing; drop "
                             f"{', '.join('--' + k.replace('_', '-') for k in overrides)}")  # fmt: skip
        meta = read_sidecar(path)
        config = ViTConfig.from_dict(meta["config"])
        sizes = parse_image_sizes(image_sizes, config) if config.dynamic_img_size or image_sizes is not None else None
        return EngineSource(path, meta, sizes, picked=picked)
    return _other_tools(path, overrides, image_sizes, picked)


def _other_tools(path: Path, overrides: dict[str, Any] | None, image_sizes, picked: str | None) -> EngineSource:
    io = read_graph_io(path)
    config, missing, assumed, guessed = foreign_config(path, io, overrides)
    if missing:
        raise ConfigError(f"{path} has no vitfast sidecar and no {'/'.join(missing)}: the engine's sidecar records how raw images "
                          "are preprocessed, so give it: --mean M M M --std S S S, or --config preprocessor_config.json / "
                          "config.json (beside an Optimum model.onnx it is read)")  # fmt: skip
    if io.layout != "NCHW":
        raise ArtifactError(f"{path} takes {io.layout} images; vitfast builds TensorRT engines that take NCHW: export the graph "
                            "with an NCHW input (or run it with ONNX Runtime: vitfast runs NHWC graphs there)")  # fmt: skip
    if io.precision == "int4":
        raise ArtifactError(f"{path} has 4-bit weights; vitfast builds TensorRT engines from float graphs and int8 / fp8 Q/DQ ones")
    if io.tensorrt_problem:
        raise ArtifactError(f"{path} {io.tensorrt_problem}; run it with ONNX Runtime, or quantize it again as symmetric int8 "
                            "Q/DQ (quantize_static(..., quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, "
                            "weight_type=QuantType.QInt8, extra_options={'ActivationSymmetric': True}), or vitfast's "
                            "quantize_int8(..., target='tensorrt'))")  # fmt: skip
    if image_sizes is not None:
        raise InputError(f"--image-sizes sets the range of a vitfast --dynamic-img-size export; {path} is another tool's graph, "
                         "built for the one size --img-size gives")  # fmt: skip
    if io.output_dtype is None:
        raise ArtifactError(f"{path}: output {io.output_name!r} is not a float tensor; vitfast engines return scores or features")
    sizes = (config.img_hw,) * 3 if None in io.hw else None
    # the engine's sidecar records the ONNX file and its sha256 (`built_from`); "source" says who made it
    meta = {"config": config.to_dict(), "precision": io.precision,
            "source": {"onnx": str(path.resolve()), "made_by": "another tool", "guessed": guessed}}  # fmt: skip
    return EngineSource(path, meta, sizes, io, tuple(assumed), picked, tuple(config_files(path)))


def check_graph_precision(source: EngineSource, precision: str) -> None:
    """Another tool's quantized graph builds only at its own precision: TensorRT needs the flag (INT8 / FP8) of the
    type its Q/DQ nodes hold. (`check_quantization` refuses a float graph at int8 / fp8.)"""
    quantized = source.graph.precision if source.graph and source.graph.precision in QUANTIZED else None
    if quantized and precision != quantized:
        raise ArtifactError(f"{source.path} is {quantized}-quantized (its Q/DQ nodes): build it with --precision {quantized}")
