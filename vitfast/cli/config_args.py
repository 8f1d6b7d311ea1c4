"""CLI flags that correct a checkpoint's config: `--config FILE.json`, field overrides, `--labels FILE`.

Every command that loads a checkpoint takes them (DESIGN.md section 3). The JSON file holds any
ViTConfig fields (a whole config or a few); the flags win over it; both win over what was read
or guessed from the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from vitfast.config import ACT_LAYERS, CROP_MODES, GLOBAL_POOLS, INTERPOLATIONS, OUTPUT_FMTS, PROBLEM_TYPES, check_field_names
from vitfast.convert import Guesses
from vitfast.errors import ConfigError, GuessedConfigWarning, InputError
from vitfast.foreign import config_file_fields

# flag -> ViTConfig field
_FLAGS = {"num_heads": "--num-heads", "act_layer": "--act-layer", "norm_eps": "--norm-eps", "num_classes": "--num-classes",
          "global_pool": "--global-pool", "features_only": "--features-only", "out_indices": "--out-indices",
          "output_fmt": "--output-fmt", "feature_norm": "--feature-norm", "feature_prefix_tokens": "--feature-prefix-tokens",
          "dynamic_img_size": "--dynamic-img-size", "mean": "--mean", "std": "--std", "crop_pct": "--crop-pct", "crop_mode": "--crop-mode", "interpolation": "--interpolation",
          "problem_type": "--problem-type"}  # fmt: skip


def add_config_args(parser: argparse.ArgumentParser, labels: bool = True) -> None:
    """Add --config, the field overrides and (unless the command has its own) --labels to a subcommand's parser."""
    group = parser.add_argument_group("checkpoint config (what the checkpoint did not store, or stored wrong)")
    group.add_argument("--config", metavar="FILE.json",
                       help="ViTConfig fields as a JSON object (all or some), or an HF preprocessor_config.json / config.json, "
                            "a timm config.json or a vitfast sidecar")  # fmt: skip
    group.add_argument("--num-heads", type=int, metavar="N", help="attention heads (not stored in timm weights)")
    group.add_argument("--act-layer", choices=ACT_LAYERS, help="MLP activation: gelu (erf), gelu_tanh, quick_gelu (OpenAI CLIP), silu (SwiGLU's gate only); not stored in weights")
    group.add_argument("--norm-eps", type=float, metavar="E", help="LayerNorm epsilon (not stored in weights)")
    group.add_argument("--num-classes", type=int, metavar="N", help="classifier outputs (0: drop the classifier, output features)")
    group.add_argument("--global-pool", type=_pool, choices=GLOBAL_POOLS, metavar="{" + ",".join(p or "none" for p in GLOBAL_POOLS) + "}",
                       help="what the head reads: the class token, the mean patch token (avg), the attention pool (map), both (token_avg), "
                            "or none: every token out, [B, tokens, features] (with --num-classes 0: the final norm's tokens)")  # fmt: skip
    group.add_argument("--features-only", action="store_true", default=None,
                       help="output feature maps for dense prediction instead of logits: the patch tokens of the --out-indices "
                            "blocks, [B, n, C, H/patch, W/patch] (timm's features_only; no head, no blocks after the last index)")  # fmt: skip
    group.add_argument("--out-indices", type=int, nargs="+", metavar="I",
                       help="with --features-only: the blocks whose outputs to return, from 0 (negative: from the end), in "
                            "block order; default: the last 3")  # fmt: skip
    group.add_argument("--output-fmt", type=str.upper, choices=OUTPUT_FMTS,
                       help="with --features-only: NCHW feature maps [B, n, C, H, W] (default) or NLC tokens [B, n, H*W, C]")
    group.add_argument("--feature-norm", action="store_true", default=None,
                       help="with --features-only: apply the model's final norm to every feature map (timm's norm=True)")
    group.add_argument("--feature-prefix-tokens", action="store_true", default=None,
                       help="with --features-only --output-fmt NLC: every token of each block, the class and register tokens first "
                            "[B, n, prefix + H*W/patch^2, C] (transformers' DINOv2 backbones with reshape_hidden_states=false; "
                            "DPT-style heads read the class token)")  # fmt: skip
    group.add_argument("--dynamic-img-size", action="store_true", default=None,
                       help="take images of any height and width in whole patches (timm's dynamic_img_size): the position "
                            "embeddings are resized to each input's patch grid in the model and in its ONNX graph, by the "
                            "checkpoint's own rule (timm's or transformers'); raw images are still resized to the image size")  # fmt: skip
    group.add_argument("--mean", type=float, nargs="+", metavar="M", help="normalisation mean per channel, e.g. 0.485 0.456 0.406")
    group.add_argument("--std", type=float, nargs="+", metavar="S", help="normalisation std per channel, e.g. 0.229 0.224 0.225")
    group.add_argument("--crop-pct", type=float, metavar="P", help="centre-crop fraction (resize to img_size / P first)")
    group.add_argument("--crop-mode", choices=CROP_MODES, help="center: keep the aspect ratio, crop; squash: resize both sides; border: keep the aspect ratio, pad")
    group.add_argument("--interpolation", choices=INTERPOLATIONS, help="resize filter")
    group.add_argument("--problem-type", choices=PROBLEM_TYPES,
                       help="what the classifier's logits mean (transformers' config.json names; read from there when it says): "
                            "it sets how predict and serve score them (softmax, sigmoid per class, or the logits for regression) "
                            "and is kept in the export's sidecar")  # fmt: skip
    if labels:
        group.add_argument("--labels", metavar="FILE", help="class names: a text file (one per line) or a JSON list / {index: name}")


def _pool(value: str) -> str:
    return "" if value == "none" else value  # timm's name for no pooling is the empty string


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ViTConfig fields set by --config and the override flags (flags win), labels included."""
    return config_overrides_and_guesses(args)[0]


def config_overrides_and_guesses(args: argparse.Namespace) -> tuple[dict[str, Any], Guesses]:
    """`config_overrides`, and what reading --config's file had to guess ({field: reason}; e.g. an HF `resample` vitfast
    has no filter for) less the fields a flag sets: warned about here (`GuessedConfigWarning`, one stderr line), and
    for export to record in the sidecar."""
    out: dict[str, Any] = {}
    guesses: Guesses = {}
    if getattr(args, "config", None):
        fields, guesses = _read_config_file(Path(args.config))
        out.update(fields)
    for field in _FLAGS:
        value = getattr(args, field, None)
        if value is not None:
            out[field] = tuple(value) if isinstance(value, list) else value
            guesses.pop(field, None)
    if getattr(args, "labels", None):
        out["labels"] = read_labels(args.labels)
    if guesses:
        said = "; ".join(f"{field}: {reason}" for field, reason in guesses.items())
        flags = ", ".join(_FLAGS.get(field, "--" + field.replace("_", "-")) for field in guesses)
        warnings.warn(GuessedConfigWarning(f"--config {args.config}: guessed {said} (to set it, pass {flags})"), stacklevel=2)
    return out, guesses


def _read_config_file(path: Path) -> tuple[dict[str, Any], Guesses]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read --config {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--config {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path} must hold a JSON object of ViTConfig fields, got {type(data).__name__}")
    converted = config_file_fields(data)  # HF preprocessor_config.json / config.json, timm config.json, a sidecar
    data, guesses = converted if converted is not None else (data, {})
    data.pop("name", None)  # a registry name is informational; it does not select a model here
    check_field_names(data)
    return data, guesses


def read_labels(path: str | Path) -> tuple[str, ...]:
    """Class names from a labels file (`read_label_file`)."""
    return read_label_file(path)[0]


def read_label_file(path: str | Path) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """(class names, class ids or None) from a text file (one name per line) or JSON: a list, or {index: name} as HF's
    id2label, whose entries may be [id, name] pairs, as ImageNet's imagenet_class_index.json has ({"0": ["n01440764",
    "tench"]}): the name is the label, the id (a WordNet id) what `eval` also matches folders by."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read --labels {path}: {exc}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"--labels {path} is not valid JSON: {exc}") from None
        if isinstance(data, dict):
            try:
                ordered = sorted(((int(k), v) for k, v in data.items()), key=lambda item: item[0])
            except ValueError:
                raise InputError(f"--labels {path}: a JSON object must map class indices to names") from None
            if [i for i, _ in ordered] != list(range(len(ordered))):
                raise InputError(f"--labels {path}: class indices must be 0..{len(ordered) - 1} without gaps")
            data = [v for _, v in ordered]
        if not isinstance(data, list):
            raise InputError(f"--labels {path} must hold a JSON list or an {{index: name}} object")
        pairs = [isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v) for v in data]
        bad = next((i for i, (v, pair) in enumerate(zip(data, pairs)) if not (pair or isinstance(v, str))), None)
        if bad is not None:
            raise InputError(f"--labels {path}: class {bad} is {json.dumps(data[bad])[:60]}; give each class a name, or an "
                             '[id, name] pair as imagenet_class_index.json does (["n01440764", "tench"])')  # fmt: skip
        if any(pairs) and not all(pairs):
            raise InputError(f"--labels {path}: class {pairs.index(not pairs[0])} differs from class 0 in form; give every class "
                             "a name, or every class an [id, name] pair")  # fmt: skip
        if any(pairs):
            return tuple(name for _, name in data), tuple(ident for ident, _ in data)
        return tuple(data), None
    labels = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not labels:
        raise InputError(f"--labels {path} has no class names; write one per line")
    return labels, None


def warn_guesses(message: str | None) -> None:
    """Print what a checkpoint load had to guess, as one warning line on stderr."""
    if message:
        print(f"vitfast: warning: {message}", file=sys.stderr)
