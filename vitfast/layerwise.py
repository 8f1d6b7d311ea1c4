"""Layer-by-layer comparison of two ONNX graphs (`vitfast check A.onnx --against B.onnx --mark-all`).

Like polygraphy's `--onnx-outputs mark all`: every float tensor a node produces becomes a graph
output, both graphs run on the same input, tensors are matched by name (names a fp16 or int8
graph derived from the same fp32 export added, e.g. `X_DequantizeLinear_Output` or a Cast's
`X_cast`, are mapped back to `X`), and the first tensor in A's node order whose error leaves the
tolerance is reported: where fp16/int8 starts to go wrong.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import InputError
from .parity import tolerance

# Suffixes quantizers and float16 converters append to the tensor they wrap (ORT's QDQ quantizer,
# onnxconverter-common, ModelOpt); stripped to find the original tensor in the other graph.
DERIVED_SUFFIXES = re.compile(r"(_DequantizeLinear_Output|_QuantizeLinear_Output|_DequantizeLinear|_QuantizeLinear"
                              r"|_output_cast\d*|_input_cast\d*|_cast\d*|_fp16|_fp32|_quantized|_dequantized)+$")  # fmt: skip
FLOAT_TYPES = {1, 10, 11, 16}  # float, float16, double, bfloat16
WORST_SHOWN = 5


def marked_outputs(engine, x: torch.Tensor) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Run `engine`'s ONNX file with every float intermediate tensor marked as an output, on the
    checked float input x [B, C, H, W] -> ({tensor: float64 array}, {tensor: producing node's op}),
    in the graph's node order. Graph optimisations are off so each tensor is what the graph says."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(engine.path))
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    existing = {o.name for o in model.graph.output}
    order: dict[str, str] = {}
    for node in model.graph.node:
        for name in node.output:
            if name and types.get(name) in FLOAT_TYPES:
                order[name] = f"{node.op_type} {node.name}".strip()
                if name not in existing:
                    model.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with tempfile.TemporaryDirectory() as tmp:  # external data keeps graphs over protobuf's 2 GiB cap loadable
        marked = Path(tmp) / "marked.onnx"
        onnx.save(model, str(marked), save_as_external_data=True, all_tensors_to_one_file=True, location="marked.data")
        session = ort.InferenceSession(str(marked), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs() if o.name in order]
        values = dict(zip(names, session.run(names, engine.feed(x))))
    return {n: values[n].astype(np.float64) for n in order if n in values}, order  # in node order


def match_tensors(names_a: list[str], names_b: set[str]) -> list[tuple[str, str]]:
    """(name in A, name in B) pairs: the same name, else A's name with derived suffixes stripped."""
    pairs = []
    for name in names_a:
        if name in names_b:
            pairs.append((name, name))
            continue
        base = DERIVED_SUFFIXES.sub("", name)
        if base != name and base in names_b:
            pairs.append((name, base))
    return pairs


def tensor_error(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    diff = np.abs(a - b)
    scale = float(np.abs(b).max()) if b.size else 0.0
    flat_a, flat_b = a.ravel(), b.ravel()
    norms = np.linalg.norm(flat_a) * np.linalg.norm(flat_b)
    cosine = float(flat_a @ flat_b / norms) if norms > 0 else float(np.array_equal(flat_a, flat_b))
    return {"max_abs_err": float(diff.max()) if diff.size else 0.0, "scale": scale, "cosine": cosine}


def compare_layers(engine_a, engine_b, x: torch.Tensor, precision: str, *, atol: float | None = None,
                   rtol: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Every matched intermediate tensor of two ONNX engines on input x -> the first one out of
    tolerance (None when all pass), the worst ones, and how many were matched."""
    for engine in (engine_a, engine_b):
        if getattr(engine, "kind", None) != "onnxruntime":
            fix = "; load it with backend='onnxruntime' (marked outputs are an ONNX Runtime feature)" if engine.kind == "openvino" else ""
            raise InputError(f"--mark-all compares two ONNX graphs in ONNX Runtime; {engine.path} is a {engine.kind} artifact{fix}")
    out_a, ops_a = marked_outputs(engine_a, x)
    out_b, _ = marked_outputs(engine_b, x)
    layers = []
    for name_a, name_b in match_tensors(list(out_a), set(out_b)):
        a, b = out_a[name_a], out_b[name_b]
        if a.shape != b.shape:
            continue  # same name, different meaning (a re-laid-out tensor): nothing to compare
        err = tensor_error(a, b)
        limit = tolerance(precision, err["scale"], atol, rtol)
        passed = err["max_abs_err"] <= limit["limit_abs_err"] and err["cosine"] >= limit["cosine"]
        layers.append({"tensor": name_a, "matched": name_b, "node": ops_a[name_a], "max_abs_err": err["max_abs_err"],
                       "max_rel_err": err["max_abs_err"] / max(err["scale"], 1e-12), "cosine": err["cosine"], "passed": passed})  # fmt: skip
    if not layers:
        raise InputError(f"no intermediate tensor names match between {engine_a.path} and {engine_b.path}; "
                         "--mark-all needs graphs exported from the same model by the same exporter")  # fmt: skip
    first = next((layer for layer in layers if not layer["passed"]), None)
    worst = sorted(layers, key=lambda layer: layer["max_rel_err"], reverse=True)[:WORST_SHOWN]
    return {"compared": len(layers), "tensors_a": len(out_a), "tensors_b": len(out_b), "first_failing": first,
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
