"""Translating other checkpoint formats into vitfast's (= timm's) parameter names and configs.

- Hugging Face `transformers` ViT / DeiT: separate query/key/value Linears are fused into one
  qkv Linear; `config.json` (+ `preprocessor_config.json`) becomes a `ViTConfig`.
- timm (or an HF state dict without its config.json): the config is inferred from tensor shapes.
  The number of heads cannot be read from weights: it is taken from the registry variant with
  the same width/depth/tokens, else head_dim 64, with a warning.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

import torch

from .config import INCEPTION_MEAN, INCEPTION_STD, ViTConfig
from .errors import CheckpointError

StateDict = dict[str, torch.Tensor]

HF_PATCH_KEY = "embeddings.patch_embeddings.projection.weight"
TIMM_PATCH_KEYS = ("patch_embed.proj.weight", "patch_embed.backbone.stem.conv.weight")

# Hugging Face `hidden_act` names -> ours. gelu_new / gelu_fast / gelu_pytorch_tanh are all the
# tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
HF_ACTS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
# PIL resample codes used in HF image processors.
PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}


def detect_format(sd: StateDict) -> str:
    """'hf' or 'timm'; raises `CheckpointError` for anything that is not a ViT state dict."""
    if any(k.endswith(HF_PATCH_KEY) for k in sd):
        return "hf"
    if any(k in sd for k in TIMM_PATCH_KEYS):
        return "timm"
    sample = ", ".join(list(sd)[:5]) or "(no tensors)"
    raise CheckpointError(
        "this checkpoint is not a Vision Transformer vitfast can read: found neither timm keys "
        f"('patch_embed.proj.weight') nor Hugging Face ViT keys ('...{HF_PATCH_KEY}'); its first keys are: {sample}"
    )


# ---------------------------------------------------------------------------- Hugging Face
def hf_to_timm(sd: StateDict) -> StateDict:
    """Rename a `ViTModel` / `ViTForImageClassification` / DeiT state dict to timm names.

    The pooler (`ViTModel`'s tanh dense on the class token) and the masked-image-modeling
    `mask_token` are not part of classification inference and are dropped.
    """
    prefix = next(k[: -len(HF_PATCH_KEY)] for k in sd if k.endswith(HF_PATCH_KEY))
    out: StateDict = {}
    qkv: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    simple = {
        "embeddings.cls_token": "cls_token",
        "embeddings.distillation_token": "dist_token",
        "embeddings.position_embeddings": "pos_embed",
        "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
        "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
        "layernorm.weight": "norm.weight",
        "layernorm.bias": "norm.bias",
    }
    # per-layer names: the on-disk / transformers 4.x names, then transformers 5.x in-memory names
    layer_map = {
        "attention.output.dense": "attn.proj",
        "intermediate.dense": "mlp.fc1",
        "output.dense": "mlp.fc2",
        "attention.o_proj": "attn.proj",
        "mlp.fc1": "mlp.fc1",
        "mlp.fc2": "mlp.fc2",
        "layernorm_before": "norm1",
        "layernorm_after": "norm2",
    }
    qkv_parts = {
        "attention.attention.query": "query", "attention.attention.key": "key", "attention.attention.value": "value",
        "attention.q_proj": "query", "attention.k_proj": "key", "attention.v_proj": "value",
    }  # fmt: skip
    heads = {"classifier": "head", "cls_classifier": "head", "distillation_classifier": "head_dist"}
    layer_re = re.compile(r"(?:encoder\.layer|layers)\.(\d+)\.(.+)\.(weight|bias)$")
    for key, value in sd.items():
        if key.startswith(prefix):
            inner = key[len(prefix) :]
        elif key.split(".")[0] in heads:
            inner = key
        else:
            out[key] = value  # unknown: reported as unexpected by the loader
            continue
        if inner in simple:
            out[simple[inner]] = value
        elif inner.split(".")[0] in heads and inner.count(".") == 1:
            name, kind = inner.split(".")
            out[f"{heads[name]}.{kind}"] = value
        elif inner.startswith("pooler.") or inner == "embeddings.mask_token":
            continue
        elif m := layer_re.match(inner):
            idx, sub, kind = int(m.group(1)), m.group(2), m.group(3)
            if sub in qkv_parts:
                qkv.setdefault(idx, {}).setdefault(kind, {})[qkv_parts[sub]] = value
            elif sub in layer_map:
                out[f"blocks.{idx}.{layer_map[sub]}.{kind}"] = value
            else:
                out[key] = value
        else:
            out[key] = value
    for idx, kinds in qkv.items():
        for kind, parts in kinds.items():
            if set(parts) != {"query", "key", "value"}:
                raise CheckpointError(f"layer {idx} has an incomplete attention {kind}: found only {sorted(parts)}")
            out[f"blocks.{idx}.attn.qkv.{kind}"] = torch.cat([parts["query"], parts["key"], parts["value"]], dim=0)
    return out


def hf_config_to_vit(cfg: dict[str, Any], preprocessor: dict[str, Any] | None, sd: StateDict) -> ViTConfig:
    """A `ViTConfig` from HF `config.json` (and `preprocessor_config.json` when present)."""
    model_type = cfg.get("model_type", "vit")
    if model_type not in ("vit", "deit"):
        raise CheckpointError(f"config.json describes a {model_type!r} model; vitfast reads ViT and DeiT (model_type 'vit' or 'deit')")
    act = cfg.get("hidden_act", "gelu")
    if act not in HF_ACTS:
        raise CheckpointError(f"unsupported hidden_act {act!r} in config.json; supported: {', '.join(HF_ACTS)}")
    dim = cfg.get("hidden_size", 768)
    head = sd.get("head.weight")
    fields: dict[str, Any] = dict(
        img_size=cfg.get("image_size", 224),
        patch_size=cfg.get("patch_size", 16),
        in_chans=cfg.get("num_channels", 3),
        embed_dim=dim,
        depth=cfg.get("num_hidden_layers", 12),
        num_heads=cfg.get("num_attention_heads", 12),
        mlp_ratio=cfg.get("intermediate_size", 4 * dim) / dim,
        qkv_bias=cfg.get("qkv_bias", True),
        norm_eps=cfg.get("layer_norm_eps", 1e-12),
        act_layer=HF_ACTS[act],
        num_classes=head.shape[0] if head is not None else 0,
        distilled="dist_token" in sd,
    )
    if preprocessor:
        fields.update(_hf_preprocessing(preprocessor, fields["in_chans"]))
    return ViTConfig(**fields)


def _hf_preprocessing(pre: dict[str, Any], in_chans: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "image_mean" in pre and len(pre["image_mean"]) == in_chans:
        out["mean"], out["std"] = tuple(pre["image_mean"]), tuple(pre["image_std"])
    if pre.get("resample") in PIL_RESAMPLE:
        out["interpolation"] = PIL_RESAMPLE[pre["resample"]]
    size, crop = pre.get("size"), pre.get("crop_size")
    if pre.get("do_center_crop") and isinstance(size, dict) and isinstance(crop, dict):
        resized = size.get("shortest_edge") or size.get("height")
        if resized and crop.get("height"):
            out["crop_pct"] = min(1.0, crop["height"] / resized)
    else:
        out["crop_pct"] = 1.0  # ViTImageProcessor resizes straight to the input size
    return out


# ---------------------------------------------------------------------------- timm
def infer_timm_config(sd: StateDict, *, norm_eps: float = 1e-6, warn: bool = True) -> ViTConfig:
    """Read a `ViTConfig` off a timm-named state dict's tensor shapes (`warn` on a guessed head count)."""
    from .registry import _REGISTRY

    def has(key: str) -> bool:
        return key in sd

    hybrid = None
    if has("patch_embed.backbone.stem.conv.weight"):
        stages = {}
        for key in sd:
            if m := re.match(r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.", key):
                stages[int(m.group(1))] = max(stages.get(int(m.group(1)), 0), int(m.group(2)) + 1)
        hybrid = tuple(stages[i] for i in sorted(stages))
        in_chans = sd["patch_embed.backbone.stem.conv.weight"].shape[1]
        dim, _, k, _ = sd["patch_embed.proj.weight"].shape
        patch = k * 4 * 2 ** (len(hybrid) - 1)
    else:
        dim, in_chans, patch, _ = sd["patch_embed.proj.weight"].shape
    depth = 1 + max((int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)
    if depth == 0:
        raise CheckpointError("checkpoint has patch embeddings but no transformer blocks ('blocks.N.*')")
    class_token, distilled = has("cls_token"), has("dist_token")
    reg_tokens = sd["reg_token"].shape[1] if has("reg_token") else 0
    prefix = int(class_token) + int(distilled) + reg_tokens
    n_pos = sd["pos_embed"].shape[1]
    if _is_square(n_pos - prefix):
        no_embed_class, grid = False, math.isqrt(n_pos - prefix)
    elif _is_square(n_pos):
        no_embed_class, grid = True, math.isqrt(n_pos)
    else:
        raise CheckpointError(
            f"cannot infer the patch grid from pos_embed of length {n_pos} (not square); pass config= to load_checkpoint"
        )
    fc_norm = has("fc_norm.weight")
    fields: dict[str, Any] = dict(
        img_size=grid * patch,
        patch_size=patch,
        in_chans=in_chans,
        embed_dim=dim,
        depth=depth,
        mlp_ratio=sd["blocks.0.mlp.fc1.weight"].shape[0] / dim,
        qkv_bias=has("blocks.0.attn.qkv.bias"),
        init_values=1e-6 if has("blocks.0.ls1.gamma") else None,  # the value is overwritten on load
        class_token=class_token,
        distilled=distilled,
        reg_tokens=reg_tokens,
        no_embed_class=no_embed_class,
        global_pool="token" if class_token and not fc_norm else "avg",
        fc_norm=fc_norm,
        representation_size=sd["pre_logits.fc.weight"].shape[0] if has("pre_logits.fc.weight") else None,
        num_classes=sd["head.weight"].shape[0] if has("head.weight") else 0,
        norm_eps=norm_eps,
        hybrid_layers=hybrid,
        mean=INCEPTION_MEAN,  # not stored in weights: timm's ViT default (broadcast to in_chans)
        std=INCEPTION_STD,
    )
    shape_keys = ("embed_dim", "depth", "class_token", "reg_tokens", "hybrid_layers")
    known = [r for r in _REGISTRY.values() if all(r.get(k, ViTConfig.__dataclass_fields__[k].default) == fields[k] for k in shape_keys)]
    if known:
        fields["num_heads"] = known[0]["num_heads"]
    elif dim % 64 == 0:
        fields["num_heads"] = dim // 64
        if warn:
            warnings.warn(
                f"num_heads cannot be read from weights; assuming head_dim 64 ({dim // 64} heads). "
                "Pass config= to load_checkpoint if that is wrong.",
                stacklevel=4,
            )
    else:
        raise CheckpointError(f"cannot infer num_heads for embed_dim {dim}; pass config= to load_checkpoint")
    return ViTConfig(**fields)


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n
