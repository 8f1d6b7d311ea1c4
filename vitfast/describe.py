"""What an artifact is and what vitfast will do with it (`vitfast info ARTIFACT`): the runtime, precision, input and
output, how raw images are preprocessed and outputs scored, and what its sidecar recorded (source, parity, build)."""

from __future__ import annotations

from typing import Any

from .config import PREPROCESSING_FIELDS, ViTConfig
from .flops import count_macs, count_params
from .runtime import Engine
from .scores import default_scores


def describe(engine: Engine) -> dict[str, Any]:
    """A loaded artifact, as one JSON-able dict."""
    meta, foreign = engine.metadata, bool(engine.metadata.get("foreign"))
    out = {"artifact": str(engine.path) if engine.path else None, "made_by": _made_by(engine.kind, meta),
           "runs_on": engine.kind, "runtime_choice": getattr(engine, "backend_choice", None), "precision": engine.precision}  # fmt: skip
    if foreign:
        out["graph"] = engine.io.describe()
        out["read_from"] = meta.get("config_files") or []
        out["assumed"] = meta.get("assumed") or []
        out["warnings"] = meta.get("warnings") or []
    if guesses := getattr(getattr(engine, "model", None), "config_guesses", None):  # a checkpoint's
        out["guessed"] = guesses
    out |= shape_and_meaning(engine.config, engine.batch, architecture=not foreign) | recorded(meta)
    if missing := getattr(engine, "missing_preprocessing", None):  # float inputs run; raw images cannot
        out["preprocessing_missing"] = missing  # and the config's mean and std are placeholders, not the graph's
        out["preprocessing"] = {k: v for k, v in out["preprocessing"].items() if k not in ("mean", "std")}
    return out


def describe_sidecar(path: str, meta: dict[str, Any], why: str) -> dict[str, Any]:
    """An artifact this machine cannot load (a TensorRT engine without TensorRT), from its sidecar alone."""
    config = ViTConfig.from_dict(meta["config"])
    batch = (meta.get("input") or {}).get("batch")
    return ({"artifact": path, "made_by": _made_by(meta.get("kind", "tensorrt"), meta), "runs_on": None, "not_loaded": why,
             "precision": meta.get("precision")}  # fmt: skip
            | shape_and_meaning(config, tuple(batch) if batch else None, architecture=not meta.get("foreign")) | recorded(meta))


def shape_and_meaning(config: ViTConfig, batch: tuple[int, ...] | None, *, architecture: bool) -> dict[str, Any]:
    """Input, output and preprocessing of `config`; the model's size where its architecture is known (not another
    tool's graph, whose config only describes its input and output)."""
    h, w = config.img_hw
    out: dict[str, Any] = {}
    if architecture:
        out["model"] = {"name": config.name, "params": count_params(config), "gflops_per_image": round(2 * count_macs(config) / 1e9, 3)}
    out["input"] = {"shape": ["batch", config.in_chans, *(("height", "width") if config.dynamic_img_size else (h, w))],
                    "batch": list(batch) if batch else "any", "dtype": "float32, normalised",
                    "image_size": f"any multiple of {config.patch_size} (raw images resized to {h}x{w})" if config.dynamic_img_size else [h, w]}  # fmt: skip
    out["output"] = {"shape": ["batch", *(d if d is not None else "dynamic" for d in config.output_shape)], "is": output_meaning(config)}
    if config.classifies:
        scores, why = default_scores(config.num_classes, config.problem_type)
        out["output"] |= {"classes": config.num_classes, "labels": len(config.labels) if config.labels else None,
                          "problem_type": config.problem_type, "scores": scores, "scores_rule": why}  # fmt: skip
    elif config.embedding_head and not config.features_only:
        out["output"] |= {"embedding_dim": config.num_classes, "classes": None}  # nothing scores, ranks or labels it
    out["preprocessing"] = {k: list(v) if isinstance(v, tuple) else v for k, v in ((k, getattr(config, k)) for k in PREPROCESSING_FIELDS)}
    return out


def output_meaning(config: ViTConfig) -> str:
    """What one image's output holds, in words."""
    if config.features_only:
        tokens = "every token (prefix tokens first)" if config.feature_prefix_tokens else "patch tokens"
        return f"feature maps ({config.output_fmt}, {tokens}) of blocks {list(config.feature_indices)}"
    if config.global_pool == "":
        return f"every token's {'projection into the image embedding space' if config.embedding_head else 'logits' if config.num_classes else 'features'}"
    if config.embedding_head:
        return f"image embedding (CLIP's image_embeds: the pooled features projected to {config.num_classes} dimensions, not classes)"
    return "class logits" if config.num_classes else f"pooled features ({config.global_pool})"


def recorded(meta: dict[str, Any]) -> dict[str, Any]:
    """What a vitfast sidecar recorded about how the artifact was made and checked."""
    keys = ("source", "parity", "int8", "tensorrt", "gpu", "tools")
    return {"recorded": {k: meta[k] for k in keys if meta.get(k) is not None}} if "vitfast_version" in meta else {}


def _made_by(kind: str, meta: dict[str, Any]) -> str:
    if meta.get("foreign"):
        if "vitfast_version" in meta:
            return (f"vitfast {meta['vitfast_version']} ({meta.get('kind', kind)}) from another tool's ONNX graph: input and output "
                    "read from the graph, preprocessing given at the build")  # fmt: skip
        if meta.get("read_from") == "engine":
            return "another tool (no vitfast sidecar): input and output read from the TensorRT engine, preprocessing from --config and the flags"
        return "another tool (no vitfast sidecar): input, output and preprocessing read from the graph and the files beside it"
    if "vitfast_version" in meta:
        return f"vitfast {meta['vitfast_version']} ({meta.get('kind', kind)})"
    return "a checkpoint (run by the PyTorch reference model)" if kind == "pytorch" else kind
