"""torch.onnx's node metadata `namespace`: the PyTorch module each ONNX node was exported from, e.g.
".../blocks.2.mlp.fc2: torch.nn.modules.linear.Linear/linear_11: aten.linear.default" ("path: class" parts, the op last).

ONNX Runtime's graph preparation and quantizer drop it (`keep_scopes` gives it back); int8's `--exclude` matches module
paths by it and TensorRT's build finds an RMSNorm's elementary ops by it.
"""

from __future__ import annotations

from pathlib import Path

KEY = "namespace"


def node_scopes(path: str | Path) -> dict[str, str]:
    """{node name: its `namespace`} of the ONNX graph at `path` (weights not read); empty for a graph without them."""
    import onnx

    return graph_scopes(onnx.load(str(path), load_external_data=False).graph)


def graph_scopes(graph) -> dict[str, str]:
    """{node name: its `namespace`} of an onnx GraphProto."""
    return {n.name: p.value for n in graph.node for p in n.metadata_props if p.key == KEY}


def innermost_module(scope: str) -> tuple[str, str]:
    """(module path, class name) of the innermost module a `namespace` names, ("", "") for none."""
    modules = scope.split("/")[:-1]  # the last part is the op
    if not modules:
        return "", ""
    path, _, cls = modules[-1].partition(":")
    return path.strip(), cls.strip().rsplit(".", 1)[-1]


def module_paths(scopes: dict[str, str]) -> dict[str, str]:
    """{node name: the module path it was exported from}, of `node_scopes`."""
    return {name: path for name, scope in scopes.items() if (path := innermost_module(scope)[0])}


def keep_scopes(path: Path, scopes: dict[str, str]) -> None:
    """Give the nodes of the graph at `path` (a quantized one) back the `namespace` of the same-named nodes in `scopes`,
    which ONNX Runtime's preparation and quantizer drop while keeping node names. Only the graph is rewritten."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)  # the weights stay where they are
    missing = [n for n in model.graph.node if n.name in scopes and not any(p.key == KEY for p in n.metadata_props)]
    for node in missing:
        node.metadata_props.add(key=KEY, value=scopes[node.name])
    if missing:
        onnx.save(model, str(path))
