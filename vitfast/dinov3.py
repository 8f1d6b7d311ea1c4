"""Hugging Face DINOv3 (`DINOv3ViTModel`, `DINOv3ViTBackbone`) checkpoints in vitfast's (= timm's) names.

DINOv3 (Simeoni et al. 2025) is a pre-norm ViT with a class token, 4 register tokens, LayerScale and
2-D rotary position embeddings instead of learned ones (`rope="dinov3"`, `abs_pos_embed=False`); its
large sizes gate the MLP with SwiGLU (`use_gated_mlp`: gate_proj, up_proj apart). transformers has
no key bias (`key_bias=False`): the fused qkv bias gets zeros there, which is exact. The pooled
output is the normalised class token, as `DINOv3ViTModel.pooler_output`.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from .config import IMAGENET_MEAN, IMAGENET_STD
from .errors import CheckpointError
from .registry import _REGISTRY

StateDict = dict[str, torch.Tensor]
Guesses = dict[str, str]

MODEL_TYPE = "dinov3_vit"
PATCH_KEY = "embeddings.patch_embeddings.weight"  # ViT/DeiT/DINOv2 name theirs `...patch_embeddings.projection.weight`
PROCESSOR = "DINOv3ViTImageProcessor"
# transformers' DINOv3ViTConfig defaults (ViT-S/16), for what a config.json leaves out
DEFAULTS = dict(patch_size=16, hidden_size=384, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=6, hidden_act="gelu",
                layer_norm_eps=1e-5, rope_theta=100.0, image_size=224, num_channels=3, query_bias=True, key_bias=False, value_bias=True,
                proj_bias=True, mlp_bias=True, layerscale_value=1.0, use_gated_mlp=False, num_register_tokens=0)  # fmt: skip
# DINOv3ViTImageProcessor: straight to 224x224, bilinear, ImageNet's mean/std
PROCESSOR_DEFAULTS = dict(size={"height": 224, "width": 224}, resample=2, image_mean=list(IMAGENET_MEAN), image_std=list(IMAGENET_STD))

_LAYER = re.compile(r"(?:model\.)?layer\.(\d+)\.(.+)\.(weight|bias|lambda1)$")  # on disk `layer.N`, in memory `model.layer.N`
_SIMPLE = {
    "embeddings.cls_token": "cls_token",
    "embeddings.register_tokens": "reg_token",
    "embeddings.patch_embeddings.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.bias": "patch_embed.proj.bias",
    "norm.weight": "norm.weight",
    "norm.bias": "norm.bias",
}
_BLOCK = {"attention.o_proj": "attn.proj", "norm1": "norm1", "norm2": "norm2", "layer_scale1": "ls1", "layer_scale2": "ls2",
          "mlp.down_proj": "mlp.fc2"}  # fmt: skip
_QKV = {"attention.q_proj": 0, "attention.k_proj": 1, "attention.v_proj": 2}


def is_dinov3(sd: StateDict) -> bool:
    return any(k.endswith(PATCH_KEY) for k in sd)


def dinov3_to_timm(sd: StateDict) -> StateDict:
    """Rename a DINOv3ViTModel / DINOv3ViTBackbone state dict to timm's names: q, k and v fused into qkv (a
    missing bias, as DINOv3's key bias, as zeros), `lambda1` -> `gamma`, the MLP's up_proj -> fc1 or, gated,
    gate_proj -> fc1_g and up_proj -> fc1_x. The masked-image-modelling `mask_token` is dropped, and so are
    register tokens when there are none."""
    gated = any(".mlp.gate_proj." in k for k in sd)
    mlp = {"mlp.gate_proj": "mlp.fc1_g", "mlp.up_proj": "mlp.fc1_x"} if gated else {"mlp.up_proj": "mlp.fc1"}
    out: StateDict = {}
    qkv: dict[int, dict[str, dict[int, torch.Tensor]]] = {}
    for key, value in sd.items():
        if key == "embeddings.mask_token" or (key == "embeddings.register_tokens" and not value.shape[1]):
            continue  # the masked-image-modelling token; an empty [1, 0, C] register tensor (num_register_tokens=0)
        if key in _SIMPLE:
            out[_SIMPLE[key]] = value
        elif (m := _LAYER.match(key)) and m.group(2) in _QKV:
            qkv.setdefault(int(m.group(1)), {}).setdefault(m.group(3), {})[_QKV[m.group(2)]] = value
        elif m and (name := _BLOCK.get(m.group(2)) or mlp.get(m.group(2))):
            out[f"blocks.{m.group(1)}.{name}.{'gamma' if m.group(3) == 'lambda1' else m.group(3)}"] = value
        else:
            out[key] = value  # unknown: reported as unexpected by the loader
    for idx, kinds in qkv.items():
        weights = kinds.get("weight", {})
        if len(weights) != 3:
            raise CheckpointError(f"layer {idx} lacks some of its q/k/v projections: found {sorted(weights)} of q_proj, k_proj, v_proj (0, 1, 2)")
        out[f"blocks.{idx}.attn.qkv.weight"] = torch.cat([weights[i] for i in range(3)])
        if biases := kinds.get("bias"):
            zero = torch.zeros(weights[0].shape[0], dtype=next(iter(biases.values())).dtype)
            out[f"blocks.{idx}.attn.qkv.bias"] = torch.cat([biases.get(i, zero) for i in range(3)])
    return out


def dinov3_fields(cfg: dict[str, Any], sd: StateDict) -> dict[str, Any]:
    """ViTConfig architecture fields of a DINOv3 config.json (transformers' defaults for what it leaves out),
    `sd` already in timm's names. The attention output's and the MLP's biases must agree (one `proj_bias`)."""
    cfg = DEFAULTS | cfg
    if cfg["proj_bias"] != cfg["mlp_bias"]:
        raise CheckpointError(f"this DINOv3 model has proj_bias={cfg['proj_bias']} but mlp_bias={cfg['mlp_bias']}; vitfast's ViT has one "
                              "switch for both (proj_bias)")  # fmt: skip
    gated = bool(cfg["use_gated_mlp"])
    act = str(cfg["hidden_act"])
    if gated and act not in ("silu", "swish"):
        raise CheckpointError(f"this DINOv3 model gates its MLP with hidden_act {act!r}; vitfast's SwiGLU gate is SiLU ('silu')")
    if not gated and act not in ("gelu", "gelu_python"):
        raise CheckpointError(f"this DINOv3 model's MLP uses hidden_act {act!r}; vitfast reads DINOv3's erf GELU ('gelu') or a gated SiLU")
    head = sd.get("head.weight")
    size = cfg["image_size"]
    return dict(
        img_size=size if isinstance(size, int) else tuple(size),
        patch_size=int(cfg["patch_size"] if isinstance(cfg["patch_size"], int) else cfg["patch_size"][0]),
        in_chans=cfg["num_channels"],
        embed_dim=cfg["hidden_size"],
        depth=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"],
        num_classes=head.shape[0] if head is not None else 0,
        mlp_ratio=cfg["intermediate_size"] / cfg["hidden_size"],
        mlp_layer="swiglu" if gated else "mlp",
        act_layer="silu" if gated else "gelu",
        qkv_bias=bool(cfg["query_bias"] or cfg["key_bias"] or cfg["value_bias"]),
        proj_bias=bool(cfg["proj_bias"]),
        init_values=float(cfg["layerscale_value"]),
        reg_tokens=int(cfg["num_register_tokens"]),
        abs_pos_embed=False,
        rope="dinov3",
        rope_theta=float(cfg["rope_theta"]),
        norm_eps=float(cfg["layer_norm_eps"]),
        global_pool="token",
    )


def config_from_weights(sd: StateDict, num_heads: int | None = None) -> tuple[dict[str, Any], Guesses]:
    """A DINOv3 config.json read off a timm-named state dict (`dinov3_to_timm`'s output), with what the
    weights cannot state (head count, eps, rope base, image size) as guesses."""
    dim = sd["patch_embed.proj.weight"].shape[0]
    depth = 1 + max(int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k)))
    gated = "blocks.0.mlp.fc1_g.weight" in sd
    hidden = sd["blocks.0.mlp.fc1_g.weight" if gated else "blocks.0.mlp.fc1.weight"].shape[0]
    guesses: Guesses = {}
    if num_heads is None:
        same = [n for n, r in _REGISTRY.items() if r.get("rope") == "dinov3" and r["embed_dim"] == dim and r["depth"] == depth]
        num_heads = _REGISTRY[same[0]]["num_heads"] if same else max(dim // 64, 1)
        source = f"taken from {same[0]}, the registered DINOv3 of this width and depth" if same else "head_dim 64 assumed"
        guesses["num_heads"] = f"num_heads cannot be read from weights; {source}"
    cfg = dict(hidden_size=dim, intermediate_size=hidden, num_hidden_layers=depth, num_attention_heads=num_heads,
               patch_size=sd["patch_embed.proj.weight"].shape[-1], num_channels=sd["patch_embed.proj.weight"].shape[1],
               num_register_tokens=sd["reg_token"].shape[1] if "reg_token" in sd else 0, use_gated_mlp=gated,
               hidden_act="silu" if gated else "gelu", query_bias="blocks.0.attn.qkv.bias" in sd, key_bias=False,
               value_bias="blocks.0.attn.qkv.bias" in sd, proj_bias="blocks.0.attn.proj.bias" in sd,
               mlp_bias="blocks.0.mlp.fc2.bias" in sd)  # fmt: skip
    why = "not stored in a Hugging Face state dict without its config.json; transformers' DINOv3 default assumed"
    guesses |= dict.fromkeys(("norm_eps", "rope_theta", "img_size"), why)
    return cfg, guesses
