"""Rewrite an exported ViT ONNX graph so attention computes q, k and v with three MatMuls instead of
one fused qkv MatMul followed by Reshape [B, N, 3, H, D] -> Transpose -> Slice/Squeeze x 3.

Same math (the qkv weight [C, 3C] and bias [3C] are cut into three [C, C] / [C] pieces), a graph
OpenVINO runs faster in int8: each of q/k/v comes out of its own MatMul already quantized (the int8
output fused into the MatMul), where the fused form costs a strided reference-kernel split of the
float [B, N, 3C] output and three separate quantize nodes per block (OpenVINO's performance counters
on ViT-S/16: about 7% of the time; `--int8-target openvino`, benchmarks/cpu_runtimes.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_split_qkv(src: Path, dst: Path, num_heads: int) -> int:
    """`src` (an fp32 ONNX file from `to_onnx`) with q/k/v split, written to `dst` (weights beside
    it in `dst.data` when over protobuf's 2 GB); returns how many attention blocks were rewritten."""
    import onnx  # optional dependency (the onnx extra)

    model = onnx.load(str(src))
    count = split_qkv(model, num_heads)
    large = model.ByteSize() > 1_800_000_000
    onnx.save(model, str(dst), save_as_external_data=large, location=dst.name + ".data" if large else None)
    return count


def split_qkv(model, num_heads: int) -> int:
    """Rewrite `model` (an `onnx.ModelProto` from `to_onnx`) in place; returns how many attention
    blocks were rewritten. A graph without the fused pattern is left as it is (returns 0)."""
    from onnx import helper, numpy_helper  # optional dependency (the onnx extra), needed only when a graph is rewritten

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    producer = {out: node for node in graph.node for out in node.output}
    rewritten, dead, new_nodes = 0, set(), {}
    for node in graph.node:
        parts = _fused_qkv(node, consumers, producer, inits)
        if parts is None:
            continue
        matmul, add, reshape, transpose, squeezes = parts
        weight = numpy_helper.to_array(inits[matmul.input[1]])  # [C, 3C]
        bias = numpy_helper.to_array(inits[add.input[1]]) if add is not None else None
        dim = weight.shape[0]
        if weight.shape[1] != 3 * dim or dim % num_heads:
            continue
        prefix = matmul.name or matmul.output[0]
        shape = numpy_helper.from_array(np.array([0, 0, num_heads, dim // num_heads], np.int64), f"{prefix}/qkv_split/heads")
        graph.initializer.append(shape)
        nodes = []
        for i, (part, out) in enumerate(zip("qkv", squeezes)):
            w = numpy_helper.from_array(np.ascontiguousarray(weight[:, i * dim : (i + 1) * dim]), f"{prefix}/{part}.weight")
            graph.initializer.append(w)
            y = f"{prefix}/{part}"
            nodes.append(helper.make_node("MatMul", [matmul.input[0], w.name], [y + "/matmul"], name=y + "/matmul"))
            if bias is not None:
                b = numpy_helper.from_array(np.ascontiguousarray(bias[i * dim : (i + 1) * dim]), f"{prefix}/{part}.bias")
                graph.initializer.append(b)
                nodes.append(helper.make_node("Add", [y + "/matmul", b.name], [y + "/linear"], name=y + "/linear"))
            nodes.append(helper.make_node("Reshape", [nodes[-1].output[0], shape.name], [y + "/heads"], name=y + "/reshape"))
            nodes.append(helper.make_node("Transpose", [y + "/heads"], [out.output[0]], name=y + "/transpose", perm=[0, 2, 1, 3]))
        new_nodes[id(matmul)] = nodes
        dead |= {id(n) for n in (add, reshape, transpose, *squeezes) if n is not None}
        dead |= {id(producer[s.input[0]]) for s in squeezes if s.input[0] in producer and producer[s.input[0]].op_type == "Slice"}
        rewritten += 1
    if rewritten:
        order = [n for node in graph.node for n in new_nodes.get(id(node), [node]) if id(n) not in dead]
        del graph.node[:]
        graph.node.extend(order)
        used = {name for node in graph.node for name in node.input}
        kept = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return rewritten


def _fused_qkv(matmul, consumers, producer, inits):
    """(MatMul, Add or None, Reshape, Transpose, [3 Squeeze]) when `matmul` starts the fused qkv
    pattern that `to_onnx` writes, else None."""
    if matmul.op_type != "MatMul" or matmul.input[1] not in inits:
        return None
    after = consumers.get(matmul.output[0], [])
    add = after[0] if len(after) == 1 and after[0].op_type == "Add" and after[0].input[1] in inits else None
    if add is not None:
        after = consumers.get(add.output[0], [])
    if len(after) != 1 or after[0].op_type != "Reshape":
        return None
    reshape = after[0]
    after = consumers.get(reshape.output[0], [])
    if len(after) != 1 or after[0].op_type != "Transpose" or list(_attr(after[0], "perm") or []) != [2, 0, 3, 1, 4]:
        return None
    transpose = after[0]
    slices = consumers.get(transpose.output[0], [])
    squeezes = []
    for s in slices:
        nxt = consumers.get(s.output[0], []) if s.op_type == "Slice" else []
        if len(nxt) != 1 or nxt[0].op_type != "Squeeze":
            return None
        squeezes.append((_slice_start(s, inits), nxt[0]))
    if len(squeezes) != 3 or sorted(i for i, _ in squeezes) != [0, 1, 2]:
        return None
    return matmul, add, reshape, transpose, [sq for _, sq in sorted(squeezes, key=lambda p: p[0])]


def _slice_start(node, inits) -> int | None:
    """Which of q/k/v (0/1/2) a Slice on axis 0 of the permuted qkv takes."""
    from onnx import numpy_helper  # optional dependency (the onnx extra)

    if node.op_type != "Slice" or len(node.input) < 4 or any(i not in inits for i in node.input[1:4]):
        return None
    start, end, axes = (numpy_helper.to_array(inits[i]).reshape(-1) for i in node.input[1:4])
    return int(start[0]) if axes.tolist() == [0] and end[0] - start[0] == 1 else None


def _attr(node, name):
    from onnx import helper  # optional dependency (the onnx extra)

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)

