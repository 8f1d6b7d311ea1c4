"""ONNX files vitfast did not export (`optimum-cli export onnx`, timm's `onnx_export.py`, a plain
`torch.onnx.export`): what the graph takes and returns, read from the graph itself, and the
preprocessing, which a graph does not record, from the user (`--mean/--std/...`, `--config FILE`)
or from an Optimum export folder (`model.onnx` + `config.json` + `preprocessor_config.json`).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import PREPROCESSING_FIELDS, ViTConfig
from .convert import hf_preprocessing
from .errors import ArtifactError, ConfigError, first_line

QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearMatMul", "QLinearConv", "MatMulInteger", "ConvInteger"}
ONNX_FLOAT_TYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64"}
FOREIGN_FIELDS = ("img_size", "num_classes", *PREPROCESSING_FIELDS)  # what a foreign graph's config holds


@dataclass(frozen=True)
class GraphIO:
    """What a foreign graph takes and returns. Shapes use None for a dynamic dimension."""

    input_name: str
    layout: str  # "NCHW" or "NHWC"
    dtype: str  # numpy name of the input's element type: "float32" / "float16"
    batch: int | None  # fixed batch size, or None for a dynamic batch axis
    hw: tuple[int | None, int | None]
    in_chans: int
    output_name: str
    num_classes: int | None
    precision: str  # "fp32", "fp16" or "int8", from the graph's ops and initializers
    note: str  # which output was taken as the logits, and why

    def describe(self) -> str:
        dims = [self.batch or "batch", self.in_chans, *(d or "?" for d in self.hw)]
        if self.layout == "NHWC":
            dims = [dims[0], dims[2], dims[3], dims[1]]
        return f"input {self.input_name!r} {self.dtype} [{', '.join(map(str, dims))}] ({self.layout}); {self.note}"


def _dims(value_info) -> list[int | None] | None:
    """Static dims of a graph input/output (None for dynamic ones), or None when its rank is unknown."""
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in t.shape.dim]


def read_graph_io(path: str | os.PathLike, output_rank: int | None = 2) -> GraphIO:
    """Input name/layout/dtype/shape and the logits output of the ONNX file at `path`: [batch, classes], or
    of any rank with `output_rank=None` (a graph with a vitfast sidecar, which says the shape)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and friends for files that are not ONNX
        raise ArtifactError(f"{path} is not a readable ONNX model: {first_line(exc)}") from None
    graph = model.graph
    weights = {init.name for init in graph.initializer}
    inputs = [i for i in graph.input if i.name not in weights]
    if len(inputs) != 1:
        names = ", ".join(i.name for i in inputs) or "none"
        raise ArtifactError(f"{path} has {len(inputs)} graph inputs ({names}); vitfast runs image classifiers with one image input")
    inp = inputs[0]
    dtype = ONNX_FLOAT_TYPES.get(inp.type.tensor_type.elem_type)
    if dtype not in ("float32", "float16"):
        raise ArtifactError(f"{path}: input {inp.name!r} is not float32/float16 (ONNX type {inp.type.tensor_type.elem_type}); "
                            "vitfast feeds normalised float images")  # fmt: skip
    dims = _dims(inp)
    if dims is None or len(dims) != 4:
        raise ArtifactError(f"{path}: input {inp.name!r} has shape {dims}; expected images [batch, 3, H, W] or [batch, H, W, 3]")
    layout, chans, hw = _layout(dims, path, inp.name)
    out_name, classes, note = _pick_logits(graph.output, path, output_rank)
    return GraphIO(inp.name, layout, dtype, dims[0], hw, chans, out_name, classes, _precision(graph, dtype), note)


def _layout(dims: list[int | None], path, name: str) -> tuple[str, int, tuple[int | None, int | None]]:
    if dims[1] in (1, 3):
        return "NCHW", dims[1], (dims[2], dims[3])
    if dims[3] in (1, 3):
        return "NHWC", dims[3], (dims[1], dims[2])
    raise ArtifactError(f"{path}: cannot tell the channel axis of input {name!r} {dims} (neither axis 1 nor 3 is 1 or 3 channels); "
                        "re-export it with a static channel dimension")  # fmt: skip


def _pick_logits(outputs, path, rank: int | None = 2) -> tuple[str, int | None, str]:
    """The output holding [batch, classes] logits (`rank` None: of any rank, e.g. [batch, tokens, features]):
    named `logits` (Optimum), else the only one of that rank."""
    described = [(o.name, _dims(o)) for o in outputs]
    fitting = [(n, d) for n, d in described if d is not None and (len(d) == rank if rank else len(d) >= 2)]
    named = [(n, d) for n, d in fitting if n == "logits"] or [(n, d) for n, d in fitting if "logit" in n.lower()]
    chosen = named[0] if named else (fitting[0] if len(fitting) == 1 else None)
    listing = ", ".join(f"{n} [{', '.join('?' if v is None else str(v) for v in d) if d is not None else '?'}]" for n, d in described)
    if chosen is None:
        if fitting:
            why = f"several are {'2-D' if rank == 2 else 'outputs'} and none is named 'logits'"
        else:
            why = f"none is {'2-D [batch, classes]' if rank == 2 else '[batch, ...]'}"
        raise ArtifactError(f"{path}: cannot tell which output holds the logits ({why}: {listing}); "
                            "export the classifier with its logits as an output named 'logits'")  # fmt: skip
    name, dims = chosen
    note = f"logits from output {name!r}" + (f" (of {listing})" if len(described) > 1 else "")
    return name, dims[-1], note


def _precision(graph, input_dtype: str) -> str:
    if any(node.op_type in QUANT_OPS for node in graph.node):
        return "int8"
    float_inits = [init.data_type for init in graph.initializer if init.data_type in ONNX_FLOAT_TYPES]
    if input_dtype == "float16" or (float_inits and float_inits.count(10) > len(float_inits) / 2):
        return "fp16"
    return "fp32"


# ---------------------------------------------------------------------------- preprocessing
def config_file_fields(data: dict[str, Any], img_size: int | None = None) -> dict[str, Any] | None:
    """ViTConfig fields from another tool's JSON: an HF `preprocessor_config.json` or `config.json`,
    a timm Hub `config.json` (`pretrained_cfg`), or a vitfast sidecar; None for anything else."""
    if "pretrained_cfg" in data:  # timm Hub config.json
        pre = data["pretrained_cfg"] or {}
        fields = {k: pre[k] for k in ("mean", "std", "crop_pct", "interpolation", "crop_mode") if pre.get(k) is not None}
        if isinstance(pre.get("input_size"), (list, tuple)) and len(pre["input_size"]) == 3:
            h, w = (int(v) for v in pre["input_size"][1:])
            fields["img_size"] = h if h == w else (h, w)
        return fields | ({"num_classes": int(data["num_classes"])} if "num_classes" in data else {})
    if any(k in data for k in ("image_mean", "image_processor_type", "feature_extractor_type")):  # HF preprocessor_config.json
        size = data.get("crop_size") if data.get("do_center_crop") else data.get("size")
        size = size.get("height") or size.get("shortest_edge") if isinstance(size, dict) else size
        img_size = img_size or (int(size) if size else 224)
        chans = len(data["image_mean"]) if isinstance(data.get("image_mean"), list) else 3
        fields, _ = hf_preprocessing(data, chans, img_size)
        return fields | {"img_size": img_size}
    if "model_type" in data:  # HF config.json: only the input size concerns an exported graph
        model = data.get("vision_config") or data  # CLIPConfig nests the image tower's
        return {"img_size": model["image_size"]} if "image_size" in model else {}
    if isinstance(data.get("config"), dict) and "vitfast_version" in data:  # a vitfast sidecar
        return dict(data["config"])
    return None


def optimum_folder_fields(folder: Path) -> dict[str, Any]:
    """Fields from the `config.json` / `preprocessor_config.json` Optimum writes beside `model.onnx`."""
    fields: dict[str, Any] = {}
    for name in ("config.json", "preprocessor_config.json"):
        if (folder / name).is_file():
            try:
                data = json.loads((folder / name).read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ConfigError(f"{folder / name} is not readable JSON: {exc}") from None
            if isinstance(data, dict):
                size = fields.get("img_size")
                fields |= config_file_fields(data, size if isinstance(size, int) else None) or {}
    return fields


def resolve_onnx_path(path: Path) -> Path:
    """An Optimum export folder -> its `model.onnx`; a file stays itself."""
    if not path.is_dir():
        return path
    model = path / "model.onnx"
    if not model.is_file():
        found = sorted(p.name for p in path.glob("*.onnx"))
        hint = f" (it has {', '.join(found)}: pass one of them)" if found else ""
        raise ArtifactError(f"{path} is a folder without model.onnx; expected an Optimum export folder{hint}")
    return model


def foreign_config(path: Path, io: GraphIO, overrides: dict[str, Any] | None) -> tuple[ViTConfig, list[str], list[str]]:
    """The `ViTConfig` an engine needs for a foreign graph -> (config, what is missing, what was assumed).

    Precedence: the graph's own shapes, then `overrides` (--config and the flags), then the Optimum
    files beside the ONNX. Missing mean/std only matter for raw images; a missing resize/crop rule
    takes timm's defaults, which the caller reports."""
    fields = optimum_folder_fields(path.parent) if path.name == "model.onnx" else {}
    fields |= {k: v for k, v in (overrides or {}).items() if v is not None}
    fields = {k: v for k, v in fields.items() if k in FOREIGN_FIELDS}
    h, w = io.hw
    if h and w:
        given = fields.get("img_size")
        given_hw = (given, given) if isinstance(given, int) else tuple(given or (h, w))
        if given_hw != (h, w):
            raise ConfigError(f"{path} takes {h}x{w} images (fixed in the graph) but the preprocessing says {given_hw[0]}x{given_hw[1]}; "
                              "drop --img-size or fix the config")  # fmt: skip
        fields["img_size"] = (h, w) if h != w else h
    elif "img_size" not in fields:
        raise ConfigError(f"{path} has a dynamic image size and no vitfast sidecar: pass --img-size N "
                          "(or --config preprocessor_config.json)")  # fmt: skip
    if io.num_classes is not None:
        fields["num_classes"] = io.num_classes
    missing = [k for k in ("mean", "std") if k not in fields]
    # patch_size 1: the graph's architecture is unknown; this config only describes its input and output
    config = ViTConfig(patch_size=1, in_chans=io.in_chans, name=path.stem, **fields)
    assumed = [f"{k} {getattr(config, k)}" for k in ("crop_pct", "crop_mode", "interpolation") if k not in fields]
    return config, missing, assumed


def missing_preprocessing_message(path: Path, missing: list[str]) -> str:
    return (f"{path} has no vitfast sidecar and no {'/'.join(missing)} for raw images: pass --mean M M M --std S S S "
            "(or --config preprocessor_config.json / config.json), or feed normalised float images")  # fmt: skip


def report_choice(path: Path, io: GraphIO, assumed: list[str]) -> None:
    """Say on stderr what was read from a foreign graph and what was assumed (stdout stays clean for --json)."""
    print(f"vitfast: note: {path} has no vitfast sidecar; read from the graph: {io.describe()}, precision {io.precision}", file=sys.stderr)
    if assumed:
        print(f"vitfast: warning: {path}: resize/crop not given, timm's defaults assumed ({', '.join(assumed)}); "
              "pass --config preprocessor_config.json or --crop-pct/--crop-mode/--interpolation", file=sys.stderr)  # fmt: skip
