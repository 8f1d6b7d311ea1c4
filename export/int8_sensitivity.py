"""Which quantized layers of an INT8 QDQ graph cost the most accuracy: each one in turn is put back in float
(its input Q/DQ pairs bypassed, its fp32 weight restored) and the graph's error against the fp32 graph remeasured.

This is the per-layer sensitivity sweep of NVIDIA ModelOpt's AutoQuantize and Intel Neural Compressor's
accuracy-aware tuning, at its simplest: one ONNX Runtime run per quantized layer on a few calibration images
(never the held-out ones the parity is reported on, so choosing layers does not flatter the reported numbers).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitfast.errors import ArtifactError
from vitfast.progress import Reporter, reporting

QUANTIZED_SUFFIX = "_quantized"  # ONNX Runtime's name for a quantized weight initializer: <name>_quantized
FLOAT_SUFFIX = "_vitfast_float"  # the fp32 weight put back while a layer is measured in float


@dataclass(frozen=True)
class Sensitivity:
    """One quantized layer: the share of the int8 graph's output error (squared, vs fp32) left with it in float.
    0 means that layer alone made all the error; 1 means keeping it in float changes nothing."""

    node: str
    op_type: str
    module: str | None  # the PyTorch module it was exported from (e.g. "blocks.2.mlp.fc2"), when the graph records it
    error_left: float


def rank_layers(int8_path: Path, fp32_path: Path, images: np.ndarray, op_types: list[str], *, workdir: Path,
                modules: dict[str, str] | None = None, progress: Reporter | None = None) -> list[Sensitivity]:  # fmt: skip
    """Every `op_types` node of the QDQ graph `int8_path` whose inputs are quantized, most sensitive first
    (least error left when it alone runs in float). `fp32_path`: the float graph it was quantized from (its
    weights are restored from there). `images`: float32 [n, C, H, W] inputs of both graphs. `workdir`: an empty
    scratch folder for the graphs measured. `modules`: {node name: module path} (`scopes.module_paths`).

    Each measured graph is a file whose weights stay in one external file written once, so only the changed
    node and its restored fp32 weight are written per layer, and graphs over protobuf's 2 GiB cap (ViT-H and
    larger in fp32) are measured as any other."""
    import onnx
    import onnxruntime as ort

    int8 = onnx.load(str(int8_path))
    fp32 = onnx.load(str(fp32_path), load_external_data=False)  # its weights are read one by one, when restored
    float_weights = {init.name: init for init in fp32.graph.initializer}
    measured = workdir / "measured.onnx"
    onnx.save(int8, str(measured), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.data")
    # (saving moved int8's weights into weights.data: the proto kept in memory is now only the graph)
    reference = _run(fp32_path, images, ort)
    base = _squared_error(_run(measured, images, ort), reference)
    candidates = quantized_layers(int8.graph, op_types)  # the nodes stay; only a measured node's inputs change
    ranked = []
    title = f"int8 sensitivity: {len(candidates)} layers in float one at a time"
    for node, sources in reporting(progress).track(candidates, title, total=len(candidates)):
        with _in_float(int8, node, sources, float_weights, fp32_path.parent):
            onnx.save(int8, str(measured))
        error = _squared_error(_run(measured, images, ort), reference)
        ranked.append(Sensitivity(node.name, node.op_type, (modules or {}).get(node.name), error / base if base > 0 else 1.0))
    return sorted(ranked, key=lambda s: s.error_left)


def quantized_layers(graph, op_types: list[str]) -> list[tuple]:
    """(node, `_dequantized_inputs`) of every `op_types` node of the QDQ `graph` whose inputs are quantized: the layers
    `rank_layers` measures."""
    producers = {out: n for n in graph.node for out in n.output}
    return [(node, sources) for node in graph.node if node.op_type in op_types and (sources := _dequantized_inputs(producers, node))]


def _run(path: Path, images: np.ndarray, ort) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # a bypassed Q/DQ pair left without consumers is removed with a warning
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])  # a file: external weights resolve
    return session.run(None, {session.get_inputs()[0].name: images})[0].astype(np.float64)


def _squared_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(((out - ref) ** 2).sum())


def _dequantized_inputs(producers: dict, node) -> dict[int, tuple[str, bool]]:
    """{input index: (the float tensor behind it, whether it is a weight)} for each input of `node` that a
    DequantizeLinear feeds: the QuantizeLinear's input for an activation, the fp32 weight's name for a
    quantized initializer. `producers`: {tensor name: the node that writes it}."""
    found = {}
    for i, name in enumerate(node.input):
        dq = producers.get(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        q = producers.get(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            found[i] = (q.input[0], False)
        elif dq.input[0].endswith(QUANTIZED_SUFFIX):
            found[i] = (dq.input[0][: -len(QUANTIZED_SUFFIX)], True)
    return found


@contextmanager
def _in_float(model, node, sources: dict[int, tuple[str, bool]], float_weights: dict, float_dir: Path):
    """`node` of `model` reads its float inputs `sources` (`_dequantized_inputs`; fp32 weights added as initializers,
    read from `float_dir` when the float graph keeps them in external files) inside the block; put back after."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    saved, added = list(node.input), 0
    try:
        for i, (source, weight) in sources.items():
            if weight:
                if source not in float_weights:
                    raise ArtifactError(f"the fp32 weight {source!r} of {node.name} is not in the float graph; "
                                        "cannot measure that layer in float")  # fmt: skip
                restored = onnx.TensorProto()
                restored.CopyFrom(float_weights[source])
                if uses_external_data(restored):  # inline in the measured graph: one layer's weight
                    load_external_data_for_tensor(restored, str(float_dir))
                    restored.data_location = onnx.TensorProto.DEFAULT
                    del restored.external_data[:]
                # a fresh name: ONNX Runtime may have given the quantized weight's DequantizeLinear output the original one
                restored.name = source = f"{source}{FLOAT_SUFFIX}"
                model.graph.initializer.append(restored)
                added += 1
            node.input[i] = source
        yield
    finally:
        del node.input[:]
        node.input.extend(saved)
        for _ in range(added):
            model.graph.initializer.pop()
