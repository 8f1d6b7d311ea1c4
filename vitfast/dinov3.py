"""DINOv3 checkpoints in vitfast's (= timm's vision_transformer.py) names, from the three layouts they come in:

- Hugging Face (`DINOv3ViTModel`, `DINOv3ViTBackbone`): q/k/v apart, `lambda1` layer scales;
- timm's eva.py (`vit_*_patch16_dinov3[_qkvb]`): renamed by eva.py (`eva.eva_to_timm`), configured here
  (`eva_config`);
- Meta's original `.pth` (facebookresearch/dinov3): registers named `storage_tokens`, a key-bias mask beside
  the qkv bias, the rotary periods saved as a buffer, SwiGLU's Linears named `w1`, `w2`, `w3`.

DINOv3 (Simeoni et al. 2025) is a pre-norm ViT with a class token, 4 register tokens, LayerScale and
2-D rotary position embeddings instead of learned ones (`rope="dinov3"`, `abs_pos_embed=False`); its
large sizes gate the MLP with SwiGLU. It has no key bias: the fused qkv bias gets zeros there, which
is exact. DINOv3's own features are the normalised class token (Meta's forward, transformers'
`pooler_output`); timm's DINOv3 names pool the mean patch token instead.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from .config import IMAGENET_MEAN, IMAGENET_STD, ViTConfig
from .errors import CheckpointError
from .registry import _DINOV3, _REGISTRY

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


def bare_hf_config(sd: StateDict, num_heads: int | None = None) -> tuple[dict[str, Any], Guesses]:
    """ViTConfig architecture fields of a Hugging Face DINOv3 state dict without its config.json (`dinov3_to_timm`'s
    output): its shapes (`_shape_fields`), transformers' DINOv3 defaults for what the weights cannot state (head
    count, eps, rope base, image size), each one a guess; the class token as the features (`pooler_output`)."""
    fields = _shape_fields(sd)
    guesses: Guesses = {}
    if num_heads is None:
        num_heads, guesses["num_heads"] = _registered_heads(fields["embed_dim"], fields["depth"])
    why = "not stored in a Hugging Face state dict without its config.json; transformers' DINOv3 default assumed"
    guesses |= dict.fromkeys(("norm_eps", "rope_theta", "img_size"), why)
    stated = dict(num_heads=num_heads, img_size=DEFAULTS["image_size"], norm_eps=DEFAULTS["layer_norm_eps"], rope_theta=DEFAULTS["rope_theta"],
                  global_pool="token")  # fmt: skip
    return _DINOV3 | fields | stated, guesses


def _registered_heads(dim: int, depth: int) -> tuple[int, str]:
    """The head count of the registered DINOv3 of this width and depth, else head_dim 64's, and why (a guess)."""
    same = [n for n, r in _REGISTRY.items() if r.get("rope") == "dinov3" and r["embed_dim"] == dim and r["depth"] == depth]
    why = "num_heads cannot be read from weights; "
    if same:
        return _REGISTRY[same[0]]["num_heads"], why + f"taken from {same[0]}, the registered DINOv3 of this width and depth"
    return max(dim // 64, 1), why + "head_dim 64 assumed"


def _shape_fields(sd: StateDict) -> dict[str, Any]:
    """The ViTConfig fields a DINOv3 state dict in vitfast's names states by its keys and shapes (not the head count)."""
    dim, in_chans, patch, _ = sd["patch_embed.proj.weight"].shape
    gated = "blocks.0.mlp.fc1_g.weight" in sd
    proj_bias = "blocks.0.attn.proj.bias" in sd
    if proj_bias != ("blocks.0.mlp.fc2.bias" in sd):
        raise CheckpointError(f"this DINOv3 has {'an' if proj_bias else 'no'} attention output bias but {'no' if proj_bias else 'an'} MLP "
                              "bias; vitfast's ViT has one switch for both (proj_bias)")  # fmt: skip
    return dict(
        embed_dim=dim,
        in_chans=in_chans,
        patch_size=patch,
        depth=1 + max(int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))),
        mlp_ratio=sd["blocks.0.mlp.fc1_g.weight" if gated else "blocks.0.mlp.fc1.weight"].shape[0] / dim,
        mlp_layer="swiglu" if gated else "mlp",
        act_layer="silu" if gated else "gelu",
        qkv_bias="blocks.0.attn.qkv.bias" in sd,
        proj_bias=proj_bias,
        init_values=_DINOV3["init_values"] if "blocks.0.ls1.gamma" in sd else None,  # the value is overwritten on load
        reg_tokens=sd["reg_token"].shape[1] if "reg_token" in sd else 0,
        num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 0,
    )


def eva_config(sd: StateDict, num_heads: int | None = None) -> tuple[ViTConfig, Guesses]:
    """The config of a bare timm eva.py DINOv3 state dict (in vitfast's names: `eva_to_timm`'s output) read off its
    shapes, on timm's DINOv3 defaults (registry._DINOV3) for what the weights do not state, each one a guess."""
    fields = _shape_fields(sd)
    guesses: Guesses = {}
    if num_heads is None:
        num_heads, guesses["num_heads"] = _registered_heads(fields["embed_dim"], fields["depth"])
    why = "not stored in a state dict; as in every timm vit_*_patch16_dinov3 model"
    guesses |= dict.fromkeys(("norm_eps", "rope_theta", "img_size", "mean", "std", "crop_pct", "interpolation"), why)
    guesses["global_pool"] = ("not stored in a state dict; the mean patch token, as timm's vit_*_patch16_dinov3 models pool. DINOv3's own "
                              "features (Meta's, transformers') and timm's LingBot are the class token: --global-pool token, "
                              "or overrides= in Python")  # fmt: skip
    return ViTConfig(**(_DINOV3 | fields | dict(num_heads=num_heads))), guesses


# ---------------------------------------------------------------------------- Meta's original checkpoints
# facebookresearch/dinov3's DinoVisionTransformer: Meta's names for the registers and for the saved rotary periods
META_KEYS = ("storage_tokens", "rope_embed.periods")
_META_MLP = re.compile(r"(blocks\.\d+\.mlp\.)(w1|w2|w3)\.(weight|bias)")
_META_SWIGLU = {"w1": "fc1_g", "w2": "fc1_x", "w3": "fc2"}  # SwiGLUFFN: w3(silu(w1 x) * w2 x), as timm's SwiGLU
# Meta's model holds these but never uses them at inference: the masked-image-modelling token (its forward adds
# 0 * mask_token to the class token) and, in the 7B and ViT-L SAT-493M, the norm of local crops' class token (training)
_META_TRAINING_ONLY = ("mask_token", "local_cls_norm.weight", "local_cls_norm.bias")
# Meta's README eval transform: resize to 256 x 256 (bilinear), ImageNet's mean and std
_META_PREPROCESSING = dict(img_size=256, crop_pct=1.0, crop_mode="squash", interpolation="bilinear", mean=IMAGENET_MEAN, std=IMAGENET_STD)


def is_meta(sd: StateDict) -> bool:
    return any(k in sd for k in META_KEYS)


def meta_to_timm(sd: StateDict) -> StateDict:
    """Rename a Meta DINOv3 state dict to vitfast's names: storage_tokens -> reg_token; SwiGLUFFN's w1, w2, w3 -> fc1_g,
    fc1_x, fc2; the key-bias mask applied, qkv.bias * qkv.bias_mask, as Meta's LinearKMaskedBias does at every call
    (the released masks zero the key's third). rope_embed.periods is dropped (see `read_meta`), so are the pieces
    used in training only (_META_TRAINING_ONLY). A class-token norm used at inference (cls_norm) is refused."""
    if "cls_norm.weight" in sd:
        raise CheckpointError("this DINOv3 normalises its class and register tokens with a LayerNorm of their own (cls_norm: Meta's "
                              "untie_cls_and_patch_norms), which vitfast's ViT, one final norm for every token, does not implement")  # fmt: skip
    if "blocks.0.attn.qkv.weight" not in sd:
        raise CheckpointError("this checkpoint has DINOv3's storage_tokens / rope_embed but no fused blocks.N.attn.qkv (Meta's Sapiens2 "
                              "has wq, wk, wv apart, with qk-norm), which vitfast's ViT does not implement")  # fmt: skip
    out: StateDict = {}
    for key, value in sd.items():
        if key in _META_TRAINING_ONLY or key == "rope_embed.periods" or key.endswith(".qkv.bias_mask"):
            continue
        if key == "storage_tokens":
            key = "reg_token"
        elif m := _META_MLP.fullmatch(key):
            key = f"{m.group(1)}{_META_SWIGLU[m.group(2)]}.{m.group(3)}"
        elif key.endswith(".qkv.bias") and (mask := sd.get(key + "_mask")) is not None:
            value = value * mask.to(value.dtype)
        out[key] = value
    return out


def read_meta(sd: StateDict, *, given: ViTConfig | None = None, num_heads: int | None = None) -> tuple[StateDict, ViTConfig, Guesses]:
    """A Meta DINOv3 state dict -> (vitfast names, config, guesses); `given`: the caller's config, checked.

    The head count is a fact here: rope_embed.periods holds head_dim / 4 periods. Their values are not used:
    the released files store them in bf16, and transformers and timm ignore them and compute the periods in
    fp32 from the base (rope_theta ** (4 i / head_dim)), as vitfast does. They are checked against that
    schedule within bf16's rounding, so that periods of another form are refused, not replaced. Meta's
    forward returns the normalised class token (global_pool "token"). Not stored, so guessed: the LayerNorm
    eps and the preprocessing."""
    periods = sd.get("rope_embed.periods")
    if periods is None:
        raise CheckpointError("this checkpoint has DINOv3's storage_tokens but no rope_embed.periods, which Meta's DinoVisionTransformer "
                              "saves; vitfast does not know this layout")  # fmt: skip
    sd = meta_to_timm(sd)
    head_dim, dim = 4 * periods.numel(), sd["patch_embed.proj.weight"].shape[0]
    found = f"rope_embed.periods holds {periods.numel()} periods, so head_dim {head_dim}"
    if dim % head_dim:
        raise CheckpointError(f"{found}, which does not divide embed_dim {dim}; this is not a DINOv3 vitfast knows")
    if num_heads is not None and num_heads * head_dim != dim:
        raise CheckpointError(f"{found} and {dim // head_dim} heads; the {num_heads} heads asked for contradict it")
    cfg, guesses = given, {}
    if cfg is None:
        cfg = ViTConfig(**(_DINOV3 | _shape_fields(sd) | _META_PREPROCESSING | dict(num_heads=dim // head_dim, global_pool="token")))
        guesses = dict.fromkeys(("img_size", "mean", "std", "crop_pct", "crop_mode", "interpolation"),
                                "not stored in a state dict; Meta's README eval transform assumed (resize to 256 x 256, bilinear, ImageNet's "
                                "mean and std; its SAT-493M weights take mean (0.430, 0.411, 0.296), std (0.213, 0.156, 0.143))")  # fmt: skip
        guesses["norm_eps"] = "not stored in a state dict; 1e-5, Meta's 'layernormbf16' in every released DINOv3 ViT, assumed"
    if cfg.rope != "dinov3" or cfg.head_dim != head_dim:
        raise CheckpointError(f"this is Meta's DINOv3, with rotary positions (rope 'dinov3') of head_dim {head_dim} (rope_embed.periods); "
                              f"the config given has rope={cfg.rope!r}, head_dim {cfg.head_dim}")  # fmt: skip
    expected = cfg.rope_base ** (torch.arange(head_dim // 4, dtype=torch.float64) * 4 / head_dim)
    # bf16 rounds to within 2^-9; 2^-7 leaves room for that and still refuses other bases (90 for 100) or min/max periods
    if not torch.allclose(periods.double(), expected, rtol=2**-7, atol=0):
        values = ", ".join(f"{p:.4g}" for p in periods.double().tolist()[:4])
        raise CheckpointError(f"rope_embed.periods ({values}, ...) are not rope_theta ** (4 i / head_dim) for rope_theta={cfg.rope_base:g}, "
                              "the schedule vitfast computes; pass config= with the checkpoint's rope_theta if it has another base")  # fmt: skip
    return sd, cfg, guesses
