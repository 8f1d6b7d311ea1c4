"""Layer-by-layer comparison of two ONNX graphs (`vitfast check A.onnx --against B.onnx --mark-all`).

Like polygraphy's `--onnx-outputs mark all`: every float tensor a node produces becomes a graph
output, both graphs run on the same input, tensors are matched by name (names a fp16 or int8
graph derived from the same fp32 export added, e.g. `X_DequantizeLinear_Output` or a Cast's
`X_cast`, are mapped back to `X`), and the first tensor in A's node order whose error leaves the
tolerance is reported: where fp16/int8 starts to go wrong.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import InputError
from .foreign import import_onnx
from .parity import tolerance

# Suffixes quantizers and float16 converters append to the tensor they wrap (ORT's QDQ quantizer,
# onnxconverter-common, ModelOpt); stripped to find the original tensor in the other graph.
DERIVED_SUFFIXES = re.compile(r"(_DequantizeLinear_Output|_QuantizeLinear_Output|_DequantizeLinear|_QuantizeLinear"
                              r"|_output_cast\d*|_input_cast\d*|_cast\d*|_fp16|_fp32|_quantized|_dequantized)+$")  # fmt: skip
FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16
WORST_SHOWN = 5
LAYER_CHUNK = 1  # images per marked run: every float tensor of both graphs is held for it (ViT-B fp32: 0.5 GB a graph an image)


class MarkedGraph:
    """`engine`'s ONNX file with every float intermediate tensor marked as an output, in an ONNX Runtime session with
    graph optimisations off, so each tensor is what the graph says. `order`: {tensor: producing node's op} in the
    graph's node order; calling it on a checked float input x [B, C, H, W] -> {tensor: array}, in that order."""

    def __init__(self, engine):
        import onnxruntime as ort

        onnx = import_onnx()
        # The weights stay on disk: with them loaded, type inference serialises the model and a graph over protobuf's
        # 2 GiB cap (ViT-H fp32, whose weights are external data) could not be read. Only the graph is rewritten.
        model = onnx.load(str(engine.path), load_external_data=False)
        inferred = onnx.shape_inference.infer_shapes(model)
        types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
        existing = {o.name for o in model.graph.output}
        self.order: dict[str, str] = {}
        for node in model.graph.node:
            for name in node.output:
                if name and types.get(name) in FLOAT_TYPES:
                    self.order[name] = f"{node.op_type} {node.name}".strip()
                    if name not in existing:
                        model.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # a model given as bytes reads its external weights from the original file's folder
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(Path(engine.path).parent))
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs() if o.name in self.order]
        returned = set(self.names)
        self.tensors = [n for n in self.order if n in returned]  # what a call returns, in node order
        self.feed = engine.feed

    def __call__(self, x: torch.Tensor) -> dict[str, np.ndarray]:
        values = dict(zip(self.names, self.session.run(self.names, self.feed(x))))
        return {n: values[n] for n in self.tensors}


def match_tensors(names_a: list[str], names_b: set[str], ops_a: dict[str, str] | None = None,
                  ops_b: dict[str, str] | None = None) -> list[tuple[str, str]]:  # fmt: skip
    """(name in A, name in B) pairs: the same name, else A's name with derived suffixes stripped. With the producing
    ops ({tensor: "OpType node"}, `MarkedGraph.order`), a name both graphs have counts only if the same kind of op made
    it (or a Cast / Q / DQ, which relabel a tensor): the exporter numbers its `val_N` tensors in node order, so a graph
    with one node more or less (a fixed batch's shape ops) gives the same name to another tensor."""
    pairs = []
    for name in names_a:
        if name in names_b:
            if ops_a is None or ops_b is None or _same_kind(ops_a[name], ops_b[name]):
                pairs.append((name, name))
            continue
        base = DERIVED_SUFFIXES.sub("", name)
        if base != name and base in names_b:
            pairs.append((name, base))
    return pairs


RELABELLING_OPS = {"Cast", "QuantizeLinear", "DequantizeLinear", "Identity"}


def _same_kind(node_a: str, node_b: str) -> bool:
    op_a, op_b = node_a.split(" ", 1)[0], node_b.split(" ", 1)[0]
    return op_a == op_b or bool({op_a, op_b} & RELABELLING_OPS)


@dataclass
class TensorError:
    """One tensor's error over runs of a few images: max |a - b|, max |b| (the scale) and the sums of a * b, a^2 and b^2,
    so the cosine is the one over all the images at once. Equal infinities (a max-pool's -inf padding, in both graphs)
    count as no error and stay out of the sums, where inf - inf gave NaN; a non-finite value against any other (NaN
    against NaN too) is an infinite error, out of tolerance."""

    max_abs_err: float = 0.0
    scale: float = 0.0
    dot: float = 0.0
    sum_a2: float = 0.0
    sum_b2: float = 0.0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()  # one tensor at a time in float64
        keep = ~((a == b) & ~np.isfinite(b))  # equal infinities: the same in both graphs, and no number to sum
        a, b = a[keep], b[keep]
        if a.size:
            diff = np.abs(a - b)
            self.max_abs_err = max(self.max_abs_err, float(np.where(np.isnan(diff), np.inf, diff).max()))
            finite = np.abs(b[np.isfinite(b)])
            self.scale = max(self.scale, float(finite.max()) if finite.size else 0.0)
        with np.errstate(invalid="ignore"):  # a non-finite value left in makes them NaN or inf, and the cosine fail
            self.dot += float(a @ b)
            self.sum_a2 += float(a @ a)
            self.sum_b2 += float(b @ b)

    @property
    def cosine(self) -> float:
        norms = math.sqrt(self.sum_a2 * self.sum_b2)
        return self.dot / norms if norms > 0 else float(self.max_abs_err == 0)  # two zero tensors agree


def layer_runs(images, engine_a, engine_b) -> list:
    """`images` (a batch tensor or a list of images) in runs of `LAYER_CHUNK`, or of the batch size both profiles
    take; a last short run is filled up with the first images again (they then weigh twice in the cosine, and change
    no maximum)."""
    low = max(e.batch[0] if e.batch else 1 for e in (engine_a, engine_b))
    high = min(e.batch[2] if e.batch else math.inf for e in (engine_a, engine_b))
    size = max(LAYER_CHUNK, low)
    if size > high:
        a, b = (f"{e.batch[0]}..{e.batch[2]}" if e.batch else "any" for e in (engine_a, engine_b))
        raise InputError(f"--mark-all runs both graphs on the same batch, and no batch size fits {engine_a.path}'s profile {a} "
                         f"and {engine_b.path}'s {b}")  # fmt: skip
    n = len(images)
    runs = []
    for start in range(0, n, size):
        index = [(start + k) % n for k in range(size)]
        runs.append(images[index] if isinstance(images, torch.Tensor) else [images[i] for i in index])
    return runs


def compare_layers(engine_a, engine_b, images, precision: str, *, atol: float | None = None,
                   rtol: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Every matched intermediate tensor of two ONNX engines on `images` (raw images or float [B, C, H, W]; both graphs
    take A's preprocessing of them) -> the first one out of tolerance (None when all pass), the worst ones, and how
    many were matched. The graphs run `LAYER_CHUNK` images at a time and each tensor's error is accumulated: every
    intermediate tensor of a batch of 16 held at once took 10 GB at ViT-Ti and 30 GB at ViT-B."""
    for engine in (engine_a, engine_b):
        if getattr(engine, "kind", None) != "onnxruntime":
            fix = "; load it with backend='onnxruntime' (marked outputs are an ONNX Runtime feature)" if engine.kind == "openvino" else ""
            raise InputError(f"--mark-all compares two ONNX graphs in ONNX Runtime; {engine.path} is a {engine.kind} artifact{fix}")
    runs = layer_runs(images, engine_a, engine_b)
    graph_a, graph_b = MarkedGraph(engine_a), MarkedGraph(engine_b)
    pairs = match_tensors(graph_a.tensors, set(graph_b.tensors), graph_a.order, graph_b.order)  # the same for every run
    errors: dict[tuple[str, str], TensorError] = {}  # in A's node order
    for part in runs:
        x = engine_a.prepare(part)
        out_a, out_b = graph_a(x), graph_b(x)
        for pair in pairs:
            a, b = out_a[pair[0]], out_b[pair[1]]
            if a.shape == b.shape:  # else the same name means another thing (a re-laid-out tensor): nothing to compare
                errors.setdefault(pair, TensorError()).add(a, b)
    layers = []
    for (name_a, name_b), err in errors.items():
        limit = tolerance(precision, err.scale, atol, rtol)
        passed = err.max_abs_err <= limit["limit_abs_err"] and err.cosine >= limit["cosine"]
        layers.append({"tensor": name_a, "matched": name_b, "node": graph_a.order[name_a], "max_abs_err": err.max_abs_err,
                       "max_rel_err": err.max_abs_err / max(err.scale, 1e-12), "cosine": err.cosine, "passed": passed})  # fmt: skip
    if not layers:
        raise InputError(f"no intermediate tensor names match between {engine_a.path} and {engine_b.path}; "
                         "--mark-all needs graphs exported from the same model by the same exporter")  # fmt: skip
    first = next((layer for layer in layers if not layer["passed"]), None)
    worst = sorted(layers, key=lambda layer: layer["max_rel_err"], reverse=True)[:WORST_SHOWN]
    return {"compared": len(layers), "tensors_a": len(graph_a.names), "tensors_b": len(graph_b.names), "first_failing": first,
            "worst": worst, "precision": precision}  # fmt: skip


def describe_layers(report: dict[str, Any]) -> str:
    """A few lines for the terminal: the first failing tensor and the worst ones."""
    first = report["first_failing"]
    lines = [f"  layer-wise: {report['compared']} tensors matched ({report['tensors_a']} marked in A, {report['tensors_b']} in B), "
             f"{report['precision']} tolerance"]  # fmt: skip
    if first:
        lines.append(f"  first out of tolerance: {first['tensor']} ({first['node']}): max_rel_err {first['max_rel_err']:.3g}, "
                     f"cosine {first['cosine']:.6f}")  # fmt: skip
    else:
        lines.append("  every matched tensor is within tolerance")
    for layer in report["worst"]:
        lines.append(f"    {layer['tensor']} ({layer['node']}): max_rel_err {layer['max_rel_err']:.3g}, cosine {layer['cosine']:.6f}")
    return "\n".join(lines)
