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
from typing import Any, Callable

from .config import OUTPUT_MEANING_FIELDS, PREPROCESSING_FIELDS, ViTConfig
from .convert import Guesses, hf_labels, hf_preprocessing, hf_problem_type
from .errors import ArtifactError, BackendUnavailable, ConfigError, first_line

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
QUANT_OPS = QDQ_OPS | {"DynamicQuantizeLinear", "QLinearMatMul", "QLinearConv", "MatMulInteger", "ConvInteger"}  # + ONNX Runtime's integer ops
FP8_OPS = {"TRT_FP8QuantizeLinear", "TRT_FP8DequantizeLinear"}  # ModelOpt's torch export (domain trt), no zero point
WEIGHT_ONLY_OPS = {"MatMulNBits": 4, "MatMulBnb4": 4, "GatherBlockQuantized": 4}  # ONNX Runtime's, -> default bits
QUANTIZED_TYPES = {21: "int4", 22: "int4", 17: "fp8", 18: "fp8", 19: "fp8", 20: "fp8"}  # ONNX element types; else int8/16
UINT8, INT8, EXTERNAL = 2, 3, 1  # ONNX element types, and TensorProto.EXTERNAL (data in another file)
UNSIGNED_OR_WIDE = {UINT8, 4, 5}  # uint8, uint16, int16: Q/DQ types TensorRT does not take
ONNX_FLOAT_TYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64"}
FOREIGN_FIELDS = ("img_size", "num_classes", *OUTPUT_MEANING_FIELDS, *PREPROCESSING_FIELDS)  # what a foreign graph's config holds


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
    precision: str  # "fp32", "fp16", "int8", "fp8" or "int4", from the graph's ops and initializers
    note: str  # which output was taken, and why
    output: str  # what it holds: "logits" [batch, classes], "features" [batch, C] or "tokens" [batch, T, C]
    output_dims: tuple[int | None, ...]  # its dims after the batch (None: dynamic)
    patch: int | None  # the stride of the patch-embedding Conv the input feeds, when it is one (kernel = stride)
    output_dtype: str | None = None  # numpy name of the output's element type when it is a float (ONNX graphs)
    tensorrt_problem: str | None = None  # why TensorRT cannot build its quantization faithfully (None: it can)

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


def import_onnx():
    """The `onnx` package, which reading a graph's inputs, outputs and weights needs; ONNX Runtime does not bring it."""
    try:
        import onnx
    except ImportError:
        raise BackendUnavailable("reading an ONNX graph needs the onnx package: pip install 'vitfast[onnx]'") from None
    return onnx


def read_graph_io(path: str | os.PathLike, output_rank: int | None = 2, output: str | None = None) -> GraphIO:
    """Input name/layout/dtype/shape and the output of the ONNX file at `path`: logits [batch, classes] or
    transformers-named features (see `pick_output`), or of any rank with `output_rank=None` (a graph with a
    vitfast sidecar, which says the shape). `output`: the output to run, by name, instead of the rule's choice."""
    onnx = import_onnx()

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
    stem = _stem_conv(graph, inp.name)
    layout, chans, hw = image_layout(dims, path, inp.name, stem)
    out_name, out_dims, kind, note = pick_output([(o.name, _dims(o)) for o in graph.output], path, output_rank, output)
    out_type = next(o.type.tensor_type.elem_type for o in graph.output if o.name == out_name)
    constants = _constants(graph)
    return GraphIO(inp.name, layout, dtype, dims[0], hw, chans, out_name, _precision(graph, constants, dtype), note, kind,
                   tuple(out_dims[1:]), stem.patch if stem else None, ONNX_FLOAT_TYPES.get(out_type),
                   _tensorrt_quantization_problem(graph, constants))  # fmt: skip


@dataclass(frozen=True)
class _Stem:
    """The Conv an image input feeds: its layout, input channels and, for a patch embedding (kernel = stride), the patch."""

    layout: str
    in_chans: int
    patch: int | None


# ops that keep the image's layout; DynamicQuantizeLinear: what ONNX Runtime's dynamic quantization (Optimum's
# `optimum-cli onnxruntime quantize`) puts before a ConvInteger
PASS_THROUGH = {"Cast", "Identity", "Sub", "Div", "Mul", "Add", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
CONVS = {"Conv": (0, 1), "ConvInteger": (0, 1), "QLinearConv": (0, 3)}  # op -> (image input, weight input)


def _stem_conv(graph, input_name: str) -> _Stem | None:
    """The first Conv on the image's path (float, dynamically quantized ConvInteger or QOperator QLinearConv), through
    ops that keep its layout (casts, normalisation, Q/DQ) and a Transpose from NHWC; None when there is none.
    Optimum's 1.x exports leave even the channel axis dynamic, so the channels and the layout are read here from
    the Conv's weight."""
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    weights = {init.name: list(init.dims) for init in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    frontier, layout, seen = [input_name], "NCHW", set()
    while frontier:
        name = frontier.pop(0)
        for node in consumers.get(name, []):
            if id(node) in seen:
                continue
            seen.add(id(node))
            image, weight = CONVS.get(node.op_type, (None, None))
            if image is not None and node.input[image] == name:
                shape = _weight_shape(node.input[weight], weights, producers)
                if shape is None or len(shape) != 4:
                    return None
                attrs = {a.name: a for a in node.attribute}
                group = attrs["group"].i if "group" in attrs else 1
                kernel = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else shape[2:]
                strides = list(attrs["strides"].ints) if "strides" in attrs else [1, 1]
                patch = kernel[0] if kernel == strides and kernel[0] == kernel[1] else None
                return _Stem(layout, shape[1] * group, patch)
            if node.op_type == "Transpose":
                perm = [a.ints for a in node.attribute if a.name == "perm"]
                if not perm or list(perm[0]) != [0, 3, 1, 2]:
                    continue
                layout = "NHWC"
            elif node.op_type not in PASS_THROUGH:
                continue
            frontier.append(node.output[0])  # the image; not DynamicQuantizeLinear's scale and zero point
    return None


def _weight_shape(name: str, weights: dict[str, list[int]], producers: dict) -> list[int] | None:
    """The dims of the initializer behind `name`, through Identity / Cast / DequantizeLinear (int8 weights) or a Constant."""
    for _ in range(8):
        if name in weights:
            return weights[name]
        node = producers.get(name)
        if node is None:
            return None
        if node.op_type == "Constant":
            value = [a.t for a in node.attribute if a.name == "value"]
            return list(value[0].dims) if value else None
        if node.op_type not in ("Identity", "Cast", "DequantizeLinear"):
            return None
        name = node.input[0]
    return None


def image_layout(dims: list[int | None], path, name: str, stem: _Stem | None = None) -> tuple[str, int, tuple[int | None, int | None]]:
    """An image input's dims (None: dynamic) -> (layout "NCHW" | "NHWC", channels, (H, W)): the axis of 1 or 3
    channels, else what `stem`, the Conv it feeds, says."""
    if dims[1] in (1, 3):
        return "NCHW", dims[1], (dims[2], dims[3])
    if dims[3] in (1, 3):
        return "NHWC", dims[3], (dims[1], dims[2])
    if stem is not None:  # the channel axis is dynamic (or an unusual width): the patch Conv's weight says
        return (stem.layout, stem.in_chans, (dims[2], dims[3]) if stem.layout == "NCHW" else (dims[1], dims[2]))
    raise ArtifactError(f"{path}: cannot tell the channel axis of input {name!r} {dims} (neither axis 1 nor 3 is 1 or 3 channels, "
                        "and it feeds no Conv); re-export it with a static channel dimension")  # fmt: skip


MAX_PREFIX_TOKENS = 32  # class, distillation and register tokens a ViT puts before its patches (DINOv3: 5)
# transformers' and Optimum's names for a backbone's outputs, pooled ones first: CLIP's projected embedding, the pooled
# output, every token (Optimum's feature-extraction exports give last_hidden_state alone)
POOLED_OUTPUTS = ("image_embeds", "pooler_output")
TOKEN_OUTPUTS = ("last_hidden_state",)


def _what(kind: str, name: str) -> str:
    """What an output of `kind` named `name` holds, in words: CLIP's image_embeds are an embedding, not pooled features."""
    if kind == "features":
        return "the image embedding" if name == "image_embeds" else "pooled features"
    return {"tokens": "every token", "logits": "logits"}[kind]


def pick_output(described: list[tuple[str, list[int | None] | None]], path, rank: int | None = 2,
                wanted: str | None = None) -> tuple[str, list[int | None], str, str]:  # fmt: skip
    """The output to run, of the (name, dims) of a graph's or engine's outputs (dims None: rank unknown; a dim None:
    dynamic) -> (name, dims, "logits" | "features" | "tokens", note). Logits [batch, classes]: named
    `logits` (Optimum), else the only 2-D one when no output has a feature name; features: `image_embeds` /
    `pooler_output` [batch, C], else every token, `last_hidden_state` (or a lone 3-D output) [batch, T, C].
    `rank` None: a graph with a sidecar, which says the shape: any output of rank 2 or more. `wanted`: the output the
    user named, taken as tokens when 3-D, as pooled features when 2-D with a feature name, else as logits."""
    listing = ", ".join(f"{n} [{', '.join('?' if v is None else str(v) for v in d) if d is not None else '?'}]" for n, d in described)
    of = f" (of {listing})" if len(described) > 1 else ""
    shaped = [(n, d) for n, d in described if d is not None]
    if wanted is not None:
        return _named_output(wanted, described, path, rank, listing, of)
    if rank is None:
        fitting = [(n, d) for n, d in shaped if len(d) >= 2]
        named = _named_logits(fitting)
        chosen = named[0] if named else (fitting[0] if len(fitting) == 1 else None)
        if chosen is None:
            raise ArtifactError(f"{path}: cannot tell which output holds the logits ({listing}); "
                                "export the model with its output named 'logits'")  # fmt: skip
        return chosen[0], chosen[1], "logits", f"logits from output {chosen[0]!r}{of}"
    two_d = [(n, d) for n, d in shaped if len(d) == 2]
    named = _named_logits(two_d)
    if named:
        return named[0][0], named[0][1], "logits", f"logits from output {named[0][0]!r}{of}"
    for names, want_rank, kind in ((POOLED_OUTPUTS, 2, "features"), (TOKEN_OUTPUTS, 3, "tokens")):
        for name in names:
            for n, d in shaped:
                if n == name and len(d) == want_rank:
                    return n, d, kind, f"{_what(kind, n)} from output {n!r}{of}"
    if len(two_d) == 1:
        return two_d[0][0], two_d[0][1], "logits", f"logits from output {two_d[0][0]!r}{of}"
    if len(shaped) == 1 and len(shaped[0][1]) == 3:
        return shaped[0][0], shaped[0][1], "tokens", f"every token from output {shaped[0][0]!r} (its only output, [batch, tokens, channels])"
    why = "several are 2-D and none is named 'logits'" if two_d else "none is 2-D [batch, classes]"
    raise ArtifactError(f"{path}: cannot tell which output holds the logits or the features ({why}: {listing}); name the "
                        "classifier's output 'logits', or the features 'pooler_output' [batch, C] or 'last_hidden_state' "
                        "[batch, tokens, C] as transformers does")  # fmt: skip


def _named_output(wanted: str, described: list, path, rank: int | None, listing: str, of: str) -> tuple[str, list[int | None], str, str]:
    """The output the user asked for by name (`--output`) -> (name, dims, kind, note)."""
    dims = dict(described).get(wanted, False)
    if dims is False:
        raise ArtifactError(f"{path} has no output {wanted!r} (it has {listing}): pass one of its names to --output")
    if dims is None or len(dims) < 2 or (rank is not None and len(dims) > 3):
        raise ArtifactError(f"{path}: output {wanted!r} is not [batch, classes], [batch, C] or [batch, tokens, C] ({listing})")
    if rank is None:
        return wanted, dims, "logits", f"output {wanted!r} (chosen){of}"
    kind = "tokens" if len(dims) == 3 else "features" if wanted in POOLED_OUTPUTS else "logits"
    return wanted, dims, kind, f"{_what(kind, wanted)} from output {wanted!r} (chosen){of}"


def _named_logits(outputs: list[tuple[str, list]]) -> list[tuple[str, list]]:
    """The (name, dims) of outputs named `logits` (Optimum's name), else of those with "logit" in their name."""
    return [(n, d) for n, d in outputs if n == "logits"] or [(n, d) for n, d in outputs if "logit" in n.lower()]


def _precision(graph, constants: dict[str, Any], input_dtype: str) -> str:
    quantized = _quantized_precision(graph, constants)
    if quantized:
        return quantized
    float_inits = [init.data_type for init in graph.initializer if init.data_type in ONNX_FLOAT_TYPES]
    if input_dtype == "float16" or (float_inits and float_inits.count(10) > len(float_inits) / 2):
        return "fp16"
    return "fp32"


def _constants(graph) -> dict[str, Any]:
    """The graph's constant tensors (TensorProto) by name: its initializers and its Constant nodes' values."""
    constants = {init.name: init for init in graph.initializer}
    return constants | {n.output[0]: a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"}


def _qdq_operands(node, constants: dict[str, Any]) -> tuple[int | None, Any]:
    """(the ONNX element type of a QuantizeLinear / DequantizeLinear node's quantized side where the graph says it:
    QuantizeLinear-21's output_dtype, DequantizeLinear's constant input, else the zero point's; the zero-point constant)."""
    zero_point = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    declared = next((a.i for a in node.attribute if a.name == "output_dtype"), None)
    quantized = constants.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
    element = declared or next((t.data_type for t in (quantized, zero_point) if t is not None), None)
    return element, zero_point


def _quantized_precision(graph, constants: dict[str, Any]) -> str | None:
    """"int4", "int8" or "fp8" for a quantized graph (the coarsest form any of its tensors takes), None for a float one.

    Weight-only 4-bit ops say so by name or by their `bits`; Q/DQ nodes by the element type of their quantized side
    (`_qdq_operands`), which is uint8 when the graph does not say."""
    found = set()
    for node in graph.node:
        if node.op_type in WEIGHT_ONLY_OPS:
            bits = next((a.i for a in node.attribute if a.name == "bits"), WEIGHT_ONLY_OPS[node.op_type])
            found.add("int4" if bits <= 4 else "int8")
        elif node.op_type in QDQ_OPS:
            found.add(QUANTIZED_TYPES.get(_qdq_operands(node, constants)[0], "int8"))
        elif node.op_type in FP8_OPS:
            found.add("fp8")
        elif node.op_type in QUANT_OPS:
            found.add("int8")
    return next((p for p in ("int4", "int8", "fp8") if p in found), None)


def _tensorrt_quantization_problem(graph, constants: dict[str, Any]) -> str | None:
    """Why TensorRT cannot build this graph's quantization faithfully, or None. ONNX Runtime runs all of these;
    TensorRT 10's ONNX parser imports only signed 8-bit (and fp8 / int4) Q/DQ around a zero point of 0: it refuses a
    non-zero zero point, reads a uint8 one as int8 (onnx-tensorrt's QuantDequantLinearHelper: the upper half of the
    range would clip) and has no importer for ONNX Runtime's integer ops."""
    numpy_helper = import_onnx().numpy_helper

    integer_ops = sorted({n.op_type for n in graph.node if n.op_type in QUANT_OPS - QDQ_OPS})
    if integer_ops:
        return (f"holds ONNX Runtime's integer ops ({', '.join(integer_ops)}: `onnxruntime quantize`'s dynamic or QOperator "
                "format), which TensorRT's ONNX parser does not import")  # fmt: skip
    for node in (n for n in graph.node if n.op_type in QDQ_OPS):
        element, zero_point = _qdq_operands(node, constants)
        if element in UNSIGNED_OR_WIDE:
            return (f"quantizes to {'uint8' if element == UINT8 else '16-bit integers'} (node {node.name or node.output[0]!r}; "
                    "uint8 is ONNX Runtime's default QUInt8 activation type), which TensorRT reads as int8 or refuses")  # fmt: skip
        if zero_point is not None and zero_point.data_type == INT8 and zero_point.data_location != EXTERNAL:
            if numpy_helper.to_array(zero_point).any():
                return f"is quantized around non-zero zero points (node {node.name or node.output[0]!r}), which TensorRT refuses"
    return None


# ---------------------------------------------------------------------------- preprocessing
def config_file_fields(data: dict[str, Any]) -> tuple[dict[str, Any], Guesses] | None:
    """ViTConfig fields from another tool's JSON: an HF `preprocessor_config.json` or `config.json`,
    a timm Hub `config.json` (`pretrained_cfg`), or a vitfast sidecar, with what reading them had to guess
    ({field: reason}: an HF `resample` vitfast has no filter for, ...); None for anything else."""
    if "pretrained_cfg" in data:  # timm Hub config.json
        pre = data["pretrained_cfg"] or {}
        fields = {k: pre[k] for k in ("mean", "std", "crop_pct", "interpolation", "crop_mode") if pre.get(k) is not None}
        if isinstance(pre.get("input_size"), (list, tuple)) and len(pre["input_size"]) == 3:
            h, w = (int(v) for v in pre["input_size"][1:])
            fields["img_size"] = h if h == w else (h, w)
        return fields | ({"num_classes": int(data["num_classes"])} if "num_classes" in data else {}), {}
    if any(k in data for k in ("image_mean", "image_processor_type", "feature_extractor_type")):  # HF preprocessor_config.json
        chans = len(data["image_mean"]) if isinstance(data.get("image_mean"), list) else 3
        # the processor's own output size ({height, width} or the crop's, both sides), the shortest edge's without a crop
        size = data.get("size")
        size = size.get("height") or size.get("shortest_edge") if isinstance(size, dict) else size
        img_size = int(size) if size else 224
        fields, guesses = hf_preprocessing(data, chans, img_size, follow_size=True)
        return {"img_size": img_size} | fields, guesses
    if "model_type" in data:  # HF config.json: the input size, and what a classifier's logits mean
        model = data.get("vision_config") or data  # CLIPConfig nests the image tower's
        return {k: v for k, v in (("img_size", model.get("image_size")), ("problem_type", hf_problem_type(data))) if v is not None}, {}
    if isinstance(data.get("config"), dict) and "vitfast_version" in data:  # a vitfast sidecar
        return dict(data["config"]), {}
    return None


OPTIMUM_FILES = ("config.json", "preprocessor_config.json")
PYTORCH_WEIGHTS = ("*.safetensors", "*.bin", "*.pth", "*.pt")


def optimum_folder_fields(folder: Path) -> tuple[dict[str, Any], Guesses]:
    """Fields from the `config.json` / `preprocessor_config.json` Optimum writes beside `model.onnx`: the input size and
    preprocessing, and a classifier's class names (`id2label` of a `*ForImageClassification`); and what reading the
    processor had to guess ({field: reason})."""
    fields: dict[str, Any] = {}
    guesses: Guesses = {}
    for name in OPTIMUM_FILES:
        if (folder / name).is_file():
            try:
                data = json.loads((folder / name).read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ConfigError(f"{folder / name} is not readable JSON: {exc}") from None
            if isinstance(data, dict):  # preprocessor_config.json last: the size its processor feeds the graph wins
                read, guessed = config_file_fields(data) or ({}, {})
                fields |= read
                guesses |= {k: f"{name}: {reason}" for k, reason in guessed.items()}
                classifier = any(str(a).endswith("ForImageClassification") for a in data.get("architectures") or ())
                labels, label_guesses = hf_labels(data) if name == "config.json" and classifier else (None, {})
                if labels:
                    fields["labels"] = labels
                    guesses |= {k: f"{name}: {reason}" for k, reason in label_guesses.items()}
    return fields, guesses


def folder_graphs(folder: Path) -> list[Path]:
    """The ONNX graphs of an export folder: Optimum's (`model.onnx`, and `model_quantized.onnx` / `model_optimized.onnx`
    from its quantizer and optimizer) or, in a folder without PyTorch weights, those of the Hub's transformers.js
    layout (config files at the top, `onnx/model.onnx`, `onnx/model_quantized.onnx`, ...). [] for anything else."""
    if not folder.is_dir():
        return []
    if (folder / "model.onnx").is_file():
        return sorted(folder.glob("*.onnx"))
    if any(next(folder.glob(pattern), None) for pattern in PYTORCH_WEIGHTS):
        return []  # a checkpoint folder
    return sorted(folder.glob("*.onnx")) or sorted((folder / "onnx").glob("*.onnx"))


def is_onnx_artifact(path: str | os.PathLike) -> bool:
    """An ONNX file or an export folder holding ONNX graphs (what `load_engine` runs with ONNX Runtime or OpenVINO)."""
    path = Path(path)
    return path.suffix.lower() == ".onnx" or bool(folder_graphs(path))


def resolve_onnx_path(path: Path) -> tuple[Path, str | None]:
    """An export folder -> (the graph to run, a note naming the ones left when it held several); a file stays itself.
    Of several graphs, `model.onnx` runs, as Optimum's `ORTModel.from_pretrained` picks it; with no `model.onnx`
    among several, the user names one."""
    if not path.is_dir():
        return path, None
    found = folder_graphs(path)
    if not found:
        raise ArtifactError(f"{path} is a folder without ONNX graphs; expected an Optimum export folder (model.onnx, "
                            "config.json, preprocessor_config.json)")  # fmt: skip
    standard = [p for p in found if p.name == "model.onnx"]
    if len(found) > 1 and not standard:
        raise ArtifactError(f"{path} holds {len(found)} ONNX graphs and none is model.onnx ({', '.join(p.name for p in found)}): "
                            f"pass the one to run, e.g. {found[0]}")  # fmt: skip
    chosen = (standard or found)[0]
    others = [p.name for p in found if p != chosen]
    return chosen, (f"{path} holds {len(found)} ONNX graphs; running {chosen.relative_to(path)}, not {', '.join(others)} "
                    f"(pass {chosen.with_name(others[0])} to run another)" if others else None)  # fmt: skip


def config_files(path: Path) -> list[str]:
    """The Optimum / transformers.js settings files `foreign_config` reads for the graph at `path` (see `config_folder`)."""
    folder = config_folder(path)
    return [str(folder / n) for n in OPTIMUM_FILES if (folder / n).is_file()] if folder else []


def config_folder(path: Path) -> Path | None:
    """The folder whose `config.json` / `preprocessor_config.json` describe the graph at `path`, for the names Optimum
    and transformers.js give graphs (`model.onnx`, `model_*.onnx`): beside it, or above `onnx/` (the Hub's layout)."""
    if not (path.name == "model.onnx" or (path.name.startswith("model_") and path.suffix == ".onnx")):
        return None
    above = [path.parent.parent] if path.parent.name == "onnx" else []
    return next((f for f in (path.parent, *above) if any((f / name).is_file() for name in OPTIMUM_FILES)), None)


def foreign_config(path: Path, io: GraphIO, overrides: dict[str, Any] | None,
                   probe: Callable[[int, int], tuple[int, ...]] | None = None) -> tuple[ViTConfig, list[str], list[str], Guesses]:  # fmt: skip
    """The `ViTConfig` an engine needs for a foreign graph -> (config, what is missing, what was assumed, what reading
    the Optimum files beside it had to guess: {field: reason}, which no flag or --config settled).

    Precedence: the graph's own shapes, then `overrides` (--config and the flags), then the Optimum
    files beside the ONNX. Missing mean/std only matter for raw images; a missing resize/crop rule
    takes timm's defaults, which the caller reports. `probe(h, w)`: the output's dims after the batch in a
    run at that size, for the ones the graph leaves dynamic (a fully dynamic export leaves even the classes)."""
    folder = config_folder(path)
    fields, guessed = optimum_folder_fields(folder) if folder else ({}, {})
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    guessed = {k: reason for k, reason in guessed.items() if k not in given}  # a flag or --config settles it
    fields |= given
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
    size = fields["img_size"]
    h, w = (size, size) if isinstance(size, int) else size
    dims = io.output_dims
    if None in dims and probe is not None:
        dims = probe(h, w)
    if None in dims:
        raise ArtifactError(f"{path}: the shape of output {io.output_name!r} is not fixed in the graph and was not measured")
    if io.output == "logits":
        if fields.get("num_classes") not in (None, dims[-1]):
            raise ConfigError(f"{path} outputs {dims[-1]} classes (fixed in the graph), not the {fields['num_classes']} given; "
                              "drop --num-classes")  # fmt: skip
        fields["num_classes"] = dims[-1]
    else:
        fields = {k: v for k, v in fields.items() if k not in OUTPUT_MEANING_FIELDS} | _feature_fields(path, io, dims, h, w)
    missing = [k for k in ("mean", "std") if k not in fields]
    # patch_size 1 unless the output is tokens: the graph's architecture is unknown; this config only describes its input and output
    config = ViTConfig(**({"patch_size": 1} | fields), in_chans=io.in_chans, name=path.stem)
    assumed = [f"{k} {getattr(config, k)}" for k in ("crop_pct", "crop_mode", "interpolation") if k not in fields]
    return config, missing, assumed, guessed


def _feature_fields(path: Path, io: GraphIO, dims: tuple[int, ...], h: int, w: int) -> dict[str, Any]:
    """Config fields that describe a feature output `dims` (after the batch): no classes, its width, and for every
    token as many tokens as the graph returns at h x w (its patch-embedding Conv's grid plus the tokens before it)."""
    fields = {"num_classes": 0, "embed_dim": dims[-1], "num_heads": 1, "global_pool": "token" if io.output == "features" else ""}
    if io.output == "features":
        return fields
    tokens, patches = dims[0], (h // io.patch) * (w // io.patch) if io.patch else None
    if patches is None or not 0 <= tokens - patches <= MAX_PREFIX_TOKENS:
        raise ArtifactError(f"{path}: cannot tell the patch grid of output {io.output_name!r} ({tokens} tokens at {h}x{w}"
                            f"{f', patch {io.patch}' if io.patch else ', no patch-embedding Conv found'}); vitfast runs foreign "
                            "token outputs of ViTs whose image feeds a patch Conv (kernel = stride)")  # fmt: skip
    prefix = tokens - patches  # class, distillation and register tokens, which come first
    return fields | {"patch_size": io.patch, "class_token": prefix > 0, "reg_tokens": max(prefix - 1, 0)}


def missing_preprocessing_message(path: Path, missing: list[str]) -> str:
    return (f"{path} has no vitfast sidecar and no {'/'.join(missing)} for raw images: pass --mean M M M --std S S S "
            "(or --config preprocessor_config.json / config.json), or feed normalised float images")  # fmt: skip


def report_choice(path: Path, io: GraphIO, meta: dict[str, Any]) -> None:
    """Say on stderr what was read from a foreign graph or engine and what was assumed (stdout stays clean for --json)."""
    said = (f"was built by vitfast from another tool's ONNX graph; read from it: {meta.get('graph')}" if "vitfast_version" in meta
            else f"has no vitfast sidecar; read from the {meta.get('read_from', 'graph')}: {io.describe()}")  # fmt: skip
    print(f"vitfast: note: {path} {said}, precision {io.precision}", file=sys.stderr)
    for note in meta.get("warnings", ()):
        print(f"vitfast: warning: {path}: {note}", file=sys.stderr)
    report_settings(path, meta)


def report_settings(path: Path, meta: dict[str, Any]) -> None:
    """Say on stderr which files gave a foreign graph's settings, and which resize/crop defaults were assumed."""
    if meta.get("config_files"):
        print(f"vitfast: note: {path}: settings (input size, preprocessing, class names) from {', '.join(meta['config_files'])}", file=sys.stderr)
    if meta.get("assumed"):
        print(f"vitfast: warning: {path}: resize/crop not given, timm's defaults assumed ({', '.join(meta['assumed'])}); "
              "pass --config preprocessor_config.json or --crop-pct/--crop-mode/--interpolation", file=sys.stderr)  # fmt: skip
