"""Translating other checkpoint formats into vitfast's (= timm's) parameter names and configs.

- Hugging Face `transformers` ViT / DeiT / DINOv2 (with or without registers), and the image
  towers of CLIP (`CLIPModel`, `CLIPVisionModel[WithProjection]`) and SigLIP (`SiglipModel`,
  `SiglipVisionModel`, `SiglipForImageClassification`) and AIMv2 (`Aimv2VisionModel` without its
  attention-pooling head): separate query/key/value Linears are fused into one qkv Linear;
  `config.json` (+ `preprocessor_config.json`) becomes a `ViTConfig`.
- timm (or an HF state dict without its config.json): the config is inferred from tensor shapes.
  The number of heads cannot be read from weights: it is taken from the registry variant with
  the same width/depth/tokens, else head_dim 64. Preprocessing is not stored either.
- DINOv3 in Hugging Face's, timm eva.py's and Meta's layouts: see dinov3.py; timm's eva.py layout
  (DINOv3, EVA-02): see eva.py. Meta's original DINOv2: timm's names but for a few (`meta_dinov2_to_timm`).

Whatever had to be guessed is returned as `{field: reason}` (a `Guesses` dict) so the loader can
say so loudly and record it.
"""

from __future__ import annotations

import fnmatch
import math
import re
from typing import Any, Sequence

import torch

from .config import (
    CROP_MODES, IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, INTERPOLATIONS, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PROBLEM_TYPES,
    ROPE_SETTINGS, ROPE_THETA, ViTConfig, hybrid_stride,
)  # fmt: skip
from . import dinov3, eva
from .errors import CheckpointError, ConfigError
from .registry import _AIMV2, _DINOV2, _EVA02, _PE_CORE, _PE_SPATIAL, _REGISTRY, _ROPE_VIT, _SBB_ROPE, embedding_width, get_config, head_is_embedding, unsupported_reason

StateDict = dict[str, torch.Tensor]
Guesses = dict[str, str]  # ViTConfig field -> why its value is a guess
PREPROCESSING_GUESSED = ("mean", "std", "crop_pct", "interpolation", "crop_mode")  # reported when not stored

HF_PATCH_KEY = "embeddings.patch_embeddings.projection.weight"
TIMM_PATCH_KEYS = ("patch_embed.proj.weight", "patch_embed.backbone.stem.conv.weight")

# Hugging Face `hidden_act` names -> ours. gelu_new / gelu_fast / gelu_pytorch_tanh are all the
# tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
HF_ACTS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
           "quick_gelu": "quick_gelu"}  # fmt: skip
TOWER_PATCH_KEY = "embeddings.patch_embedding.weight"  # CLIP and SigLIP: under vision_model. on disk, at the root in memory (transformers 5)
AIMV2_PATCH_KEY = "embeddings.patch_embed.weight"  # AIMv2's tower, the only transformers model with this name
CLIP_CLASS_KEY = "embeddings.class_embedding"  # CLIP has a class token, SigLIP none
CLIP_MODEL_TYPES = ("clip", "clip_vision_model")
CLIP_PROJECTION_KEY = "visual_projection.weight"  # CLIPModel's and CLIPVisionModelWithProjection's: image_embeds
SIGLIP_MODEL_TYPES = ("siglip", "siglip_vision_model")
HEADLESS_SIGLIP = ("this SigLIP tower has no attention pool (vision_use_head=False), so transformers returns no pooled output; "
                   "vitfast returns the mean of its tokens, as timm's *_siglip_gap_* models do (--global-pool none: every token, its last_hidden_state)")  # fmt: skip
HEADLESS_IJEPA = ("I-JEPA has no class token and IJepaModel returns no pooled output (one saved with add_pooling_layer=True returns "
                  "tanh(dense(its first patch token)), a pooler vitfast does not load); vitfast returns the mean of its normalised "
                  "tokens, the features IJepaForImageClassification classifies (--global-pool none: every token, its last_hidden_state)")  # fmt: skip
HEADLESS_AIMV2 = ("transformers' AIMv2 tower without its attention-pooling head (use_head=False) returns no pooled output; "
                  "vitfast returns the mean of its normalised tokens, as timm's aimv2_* models do (--global-pool none: every token, its last_hidden_state)")  # fmt: skip
DEIT_POOLER = ("transformers' DeiTModel returns pooler_output = tanh(dense(class token)), beside the distillation token; vitfast's "
               "distilled models return the mean of the class and distillation tokens, normalised, so the pooler (if any) is not "
               "loaded (--global-pool none: every token, its last_hidden_state)")  # fmt: skip
AIMV2_MODEL_TYPE = "aimv2_vision_model"  # Aimv2VisionModel; Aimv2Model ("aimv2") is refused by its weights (tower_to_timm)
# transformers' Aimv2VisionConfig defaults, for what a config.json leaves out (AIMv2-large/14 at 224 px)
AIMV2_DEFAULTS = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=24, num_attention_heads=8, image_size=224, patch_size=14,
                      num_channels=3, hidden_act="silu", rms_norm_eps=1e-5, qkv_bias=False, mlp_bias=False)  # fmt: skip
DINOV2_MODEL_TYPES = ("dinov2", "dinov2_with_registers")
# ViT's layers under other model types: MSN (class token, eps 1e-6) and I-JEPA (no class token, classifies the mean token)
VIT_MODEL_TYPES = ("vit", "deit", "vit_msn", "ijepa")
# PIL resample codes used in HF image processors (1 lanczos, 4 box, 5 hamming are not supported).
PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}
# transformers' (5.x) class defaults for what a preprocessor_config.json leaves out; mean/std default to 0.5.
_CROP_224 = dict(crop_size={"height": 224, "width": 224}, do_center_crop=True, resample=3)
_CLIP_DEFAULTS = dict(size={"shortest_edge": 224}, image_mean=list(OPENAI_CLIP_MEAN), image_std=list(OPENAI_CLIP_STD), **_CROP_224,
                      do_convert_rgb=True)  # fmt: skip
PROCESSOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "ViTImageProcessor": dict(size={"height": 224, "width": 224}, resample=2),
    "DeiTImageProcessor": dict(size={"height": 256, "width": 256}, **_CROP_224),
    "CLIPImageProcessor": _CLIP_DEFAULTS,
    "BitImageProcessor": _CLIP_DEFAULTS,
    "SiglipImageProcessor": dict(size={"height": 224, "width": 224}, resample=3, do_convert_rgb=True),
    "ConvNextImageProcessor": dict(size={"shortest_edge": 384}, crop_pct=0.875, resample=3),
    dinov3.PROCESSOR: dinov3.PROCESSOR_DEFAULTS,
}
# The image processor transformers pairs with each model type.
MODEL_PROCESSORS = {"vit": "ViTImageProcessor", "deit": "DeiTImageProcessor", "vit_msn": "ViTImageProcessor", "ijepa": "ViTImageProcessor"} \
    | dict.fromkeys(CLIP_MODEL_TYPES, "CLIPImageProcessor") \
    | dict.fromkeys(DINOV2_MODEL_TYPES, "BitImageProcessor") | dict.fromkeys(SIGLIP_MODEL_TYPES, "SiglipImageProcessor") \
    | {AIMV2_MODEL_TYPE: "CLIPImageProcessor", dinov3.MODEL_TYPE: dinov3.PROCESSOR}  # fmt: skip
# Processors whose integer `size` means the shortest edge (the others read it as a square).
SHORTEST_EDGE_PROCESSORS = ("CLIPImageProcessor", "BitImageProcessor", "ConvNextImageProcessor", "SiglipImageProcessor")



def detect_format(sd: StateDict) -> str:
    """'hf' (ViT, DeiT, DINOv2, DINOv3, CLIP, SigLIP or AIMv2) or 'timm'; raises `CheckpointError` for anything that is not a ViT state dict."""
    if any(k.endswith(HF_PATCH_KEY) for k in sd) or is_tower(sd) or dinov3.is_dinov3(sd):
        return "hf"
    if any(k in sd for k in TIMM_PATCH_KEYS):
        return "timm"
    sample = ", ".join(list(sd)[:5]) or "(no tensors)"
    raise CheckpointError(
        "this checkpoint is not a Vision Transformer vitfast can read: found neither timm keys "
        f"('patch_embed.proj.weight') nor Hugging Face ViT keys ('...{HF_PATCH_KEY}'); its first keys are: {sample}"
    )


# timm block structures vitfast does not implement, by a key that only they have (block 0 is enough)
_FOREIGN_STRUCTURES = (
    (r"blocks\.0\.attns\.0\.", "parallel attention and MLP branches (timm's ParallelThingsBlock: vit_*_18x2_*)"),
    (r"blocks\.0\.in_proj\.", "one fused input projection for parallel attention and MLP (timm's ParallelScalingBlock: *_xp_*, vit_pwee_*)"),
    (r"blocks\.0\.attn\.lambda_q1$", "differential attention (timm's DiffAttention: vit_dwee_*, vit_dlittle_*)"),
    (r"blocks\.0\.attn\.[qk]_norm\.", "query/key normalisation (timm's qk_norm=True)"),
    (r"relative_position_bias_table$", "relative position biases (BEiT, Swin)"),
    (r"^rope\.freqs$", "learned rotary frequencies (Naver's RoPE-Mixed, timm's RotaryEmbeddingMixed: vit_*_rope_mixed_*)"),
    (r"blocks\.0\.gamma_1$", "layer scale named gamma_1 (timm's BEiT, EVA and CaiT blocks; of eva.py's, vitfast reads DINOv3, EVA-02, "
                             "timm's sbb RoPE ViTs and Naver's RoPE-ViT)"),
    (r"blocks\.0\.attn\.(q_proj|q_bias)", "separate q/k/v projections or biases (timm's beit.py / eva.py attention)"),
)


# timm's eva.py Perception Encoder towers (vit_pe_*) have a CLIP tower's keys (eva.py's layer scale names aside), and add
# rotary positions (RotaryEmbeddingCat) that no key shows. Their tell is what follows the blocks, beside the pre-norm: an
# attention pool and a final norm (the core towers), or nothing at all (neither norm nor fc_norm nor a pool: the spatial
# towers, and the language ones, which are built alike). Every vision_transformer.py pre-norm (CLIP) tower of timm 1.0.31
# has a final norm and no attention pool; RADIO and InternViT-300M, without a final norm, have no pre-norm.
_PE_LIKE = ("a pre-norm and an attention pool without a final norm (no registered timm model has them: not a Perception Encoder core "
            "tower, which has a final norm, nor a spatial one, which has no pool; rotary positions would not show in its keys)")  # fmt: skip


def pe_family(sd: StateDict) -> str | None:
    """"pe_core", "pe_spatial" or None: which Perception Encoder tower a timm state dict (eva.py's names or vitfast's) is, read
    off its keys: a pre-norm, an attention pool and a final norm (core); a pre-norm and nothing after the blocks (spatial)."""
    if "norm_pre.weight" not in sd:
        return None
    if "attn_pool.latent" in sd and "norm.weight" in sd:
        return "pe_core"
    return "pe_spatial" if not {"norm.weight", "fc_norm.weight", "attn_pool.latent"} & sd.keys() else None


def foreign_structure(sd: StateDict) -> str | None:
    """What in a timm-named state dict vitfast's blocks cannot hold (None when nothing is): parallel blocks,
    differential attention, qk-norm, norms inside the branches, BEiT/EVA layers, an attention pool after a pre-norm tower
    without a final norm."""
    for pattern, what in _FOREIGN_STRUCTURES:
        if any(re.search(pattern, k) for k in sd):
            return what
    if {"norm_pre.weight", "attn_pool.latent"} <= sd.keys() and not {"norm.weight", "fc_norm.weight"} & sd.keys():
        return _PE_LIKE
    return None


def check_structure(sd: StateDict, where: object) -> None:
    """Raise `CheckpointError` naming the block structure vitfast does not implement, if `sd` has one."""
    if what := foreign_structure(sd):
        raise CheckpointError(f"{where}: this checkpoint's blocks have {what}, which vitfast's ViT does not implement; "
                              "it cannot be loaded (vitfast models lists what can)")  # fmt: skip


def timm_layout(sd: StateDict, where: object, *, rope: str | None = None) -> tuple[StateDict, str | None]:
    """A state dict in one of timm's layouts -> (vitfast's names, the rotary family to read its config as: "dinov3",
    one of AXIAL_FAMILIES or None, see `timm_config`).

    timm's eva.py block names are renamed when its keys say DINOv3, EVA-02, a RoPE ViT (`eva.eva_family`) or a
    Perception Encoder (`pe_family`: its keys say it in either layout), or the caller's
    config has rotary positions (`rope`: a given config's, an override's, a Hub folder's registered architecture's);
    never otherwise, since eva.py's other rotary ViTs would load and compute something else. Weights in vitfast's
    names without position embeddings are a DINOv3's only when `rope` says so. Block structures vitfast does
    not implement are refused (`check_structure`). Meta's original DINOv2 files are renamed as timm converts them
    (`meta_dinov2_to_timm`) and read as the "dinov2" family."""
    if is_meta_dinov2(sd):
        sd = meta_dinov2_to_timm(sd)
        check_structure(sd, where)
        return sd, "dinov2"
    eva_layout = eva.is_eva(sd)
    family = (eva.eva_family(sd) if eva_layout else None) or pe_family(sd)
    if eva_layout and (family or rope is not None):
        sd = eva.eva_to_timm(sd)
    check_structure(sd, where)
    if family is None and rope == "axial":  # the caller's word: weights in vitfast's names cannot say it, their shapes which one
        family = axial if (axial := eva.eva_family(sd)) in AXIAL_FAMILIES else "eva02"
    elif family is None and rope is not None:
        family = "dinov3" if "pos_embed" not in sd else None
    return sd, family


# Meta's original DINOv2 (facebookresearch/dinov2's torch.hub `.pth`): timm's names but for its masked-image-modelling
# token, its registers and the giant's SwiGLUFFNFused (w12: the gate and value halves packed, as timm's fc1; w3: fc2)
_META_DINOV2_MLP = re.compile(r"(blocks\.\d+\.mlp\.)(w12|w3)(\.(?:weight|bias))")


def is_meta_dinov2(sd: StateDict) -> bool:
    """Meta's DINOv2 layout: a `mask_token` of shape [1, C] beside a class token of width C (the key timm's
    checkpoint_filter_fn converts on). Meta's DINOv3, whose mask_token has that shape too, has storage_tokens /
    rope_embed beside it; MAE's and BEiT's mask tokens are [1, 1, C]."""
    mask, cls = sd.get("mask_token"), sd.get("cls_token")
    return mask is not None and cls is not None and tuple(mask.shape) == (1, cls.shape[-1]) and not dinov3.is_meta(sd)


def meta_dinov2_to_timm(sd: StateDict) -> StateDict:
    """timm's `_convert_dinov2`: the mask token dropped (masked-image-modelling only); SwiGLUFFNFused's w12 / w3 ->
    fc1 / fc2; `register_tokens` -> reg_token, with the class token's position embedding folded into it and the
    position embeddings kept for the patches only, since Meta adds pos_embed before inserting the registers
    (timm's *_reg4_dinov2 models are no_embed_class)."""
    out = {_META_DINOV2_MLP.sub(lambda m: f"{m.group(1)}{'fc1' if m.group(2) == 'w12' else 'fc2'}{m.group(3)}", k): v
           for k, v in sd.items() if k != "mask_token"}  # fmt: skip
    if "register_tokens" in out:
        pos = out.get("pos_embed")
        n = pos.shape[1] - 1 if pos is not None and pos.ndim == 3 else 0
        if not _is_square(n):
            found = f"pos_embed of shape {list(pos.shape)}" if pos is not None else "no pos_embed"
            raise CheckpointError(f"this Meta DINOv2 checkpoint (mask_token, register_tokens) has {found}; Meta's hold one row for "
                                  "the class token and one per patch of a square grid (1 + 37 x 37 at 518 px): re-download it")  # fmt: skip
        out["reg_token"] = out.pop("register_tokens")
        out["cls_token"] = out["cls_token"] + pos[:, :1]
        out["pos_embed"] = pos[:, 1:]
    return out


# eva.py's families with axial rotary positions (`eva.eva_family`, `pe_family`), which their weights do not hold: (the
# registered names of the family, timm's defaults for one of other shapes, what to call it)
AXIAL_FAMILIES = {"eva02": ("eva02_*", _EVA02, "EVA-02"), "sbb_rope": ("vit_*_rope_reg*_gap_*", _SBB_ROPE, "sbb RoPE ViT"),
                  "rope_vit": ("vit_*_patch16_rope_*224", _ROPE_VIT, "Naver RoPE-ViT"),
                  "pe_core": ("vit_pe_core_*", _PE_CORE, "Perception Encoder core"),
                  "pe_spatial": ("vit_pe_spatial_*", _PE_SPATIAL, "Perception Encoder spatial")}  # fmt: skip
_PE_FAMILIES = ("pe_core", "pe_spatial")
_DINOV2_FAMILY = ("vit_*_patch14*_dinov2", _DINOV2, "DINOv2")  # Meta's DINOv2 files' (`is_meta_dinov2`), as in AXIAL_FAMILIES
_AXIAL_FIELDS = ("rope", *ROPE_SETTINGS)
_POOL_FIELDS = ("pool_include_prefix", "attn_pool_num_heads")  # an attention pool's, not in its weights either


def timm_config(sd: StateDict, family: str | None, num_heads: int | None = None) -> tuple[ViTConfig, Guesses]:
    """The config of a bare timm state dict in vitfast's names, read as `family` ("dinov3", "dinov2", one of
    AXIAL_FAMILIES, None: a vision_transformer.py ViT) says; what the weights do not state comes back as guesses."""
    if family == "dinov3":
        return dinov3.eva_config(sd, num_heads)
    cfg, guesses = infer_timm_config(sd, num_heads=num_heads, family=family)
    if family not in AXIAL_FAMILIES and family != "dinov2":
        return cfg, guesses
    # the preprocessing (and rotary positions) are not in the weights: timm's, from its model of the family and these shapes
    pattern, defaults, label = AXIAL_FAMILIES.get(family) or _DINOV2_FAMILY
    name, like = next(((n, r) for n, r in _registered_like(cfg.to_dict(), family) if fnmatch.fnmatch(n, pattern)), (None, defaults))
    source = f"{name}'s" if name else f"timm's {label} defaults"
    preprocessing = {k: like.get(k, getattr(cfg, k)) for k in ("mean", "std", "crop_pct", "interpolation", "crop_mode")}
    guesses |= dict.fromkeys(preprocessing, f"preprocessing is not stored in a state dict; {source} assumed")
    if family == "dinov2":  # `meta_dinov2_to_timm` left any registers' position embeddings for the patches only: a fact
        return cfg.replace(**preprocessing), {k: v for k, v in guesses.items() if k != "no_embed_class"}
    field = ViTConfig.__dataclass_fields__
    rotary = {k: like.get(k, field[k].default) for k in _AXIAL_FIELDS}
    if family in _PE_FAMILIES and name is None:  # Meta's PE: reference grid = the one its learned positions have; index + 1 beside a class token
        rotary |= dict(rope_ref_grid=cfg.grid_size, rope_grid_offset=float(cfg.class_token))
    ref, shift = rotary["rope_ref_grid"], rotary["rope_grid_offset"]
    indices = f"patch indices{f' + {shift:g}' if shift else ''} " + (f"scaled to a {ref[0]}x{ref[1]} grid" if ref else "unscaled")
    first = "x" if rotary["rope_grid_indexing"] == "xy" else "y"
    why = f"rotary positions are not stored in weights; {source} assumed: axial, base {rotary['rope_theta'] or ROPE_THETA['axial']:g}, {indices}"
    # keyed by each rotary field (the offset when there is one): a caller who states rope="axial" alone still hears the rest
    guesses |= dict.fromkeys((k for k in _AXIAL_FIELDS if k != "rope_grid_offset" or shift), f"{why}, {first}'s frequencies first")
    pool = {k: like.get(k, field[k].default) for k in _POOL_FIELDS} if cfg.global_pool == "map" else {}
    guesses |= dict.fromkeys(pool, f"the attention pool's heads and whether it reads the class token are not stored in weights; {source} assumed")
    return cfg.replace(**rotary, **pool, **preprocessing), guesses


# ---------------------------------------------------------------------------- Hugging Face
def hf_to_timm(sd: StateDict) -> StateDict:
    """Rename a `ViTModel` / `ViTForImageClassification` / DeiT / `Dinov2Model` (or CLIP / SigLIP,
    see `tower_to_timm`) state dict to timm names.

    The pooler (a bare `ViTModel`'s dense + tanh on the class token, its `pooler_output`) becomes the pre-logits
    layer it was in the ViT paper (`pre_logits.fc`, `representation_size`); a classifier never reads it (transformers'
    `*ForImageClassification` builds none), and vitfast cannot apply it beside a distillation token (`DEIT_POOLER`) or
    without a class token, so there it is dropped, as is the masked-image-modeling `mask_token`. DINOv2's registers get
    no position embedding, so (as timm converts them) the class token's is folded into it and the
    position embeddings cover the patches only (`no_embed_class`).
    """
    if is_tower(sd):
        return tower_to_timm(sd)
    if dinov3.is_dinov3(sd):
        return dinov3.dinov3_to_timm(sd)
    prefix = next(k[: -len(HF_PATCH_KEY)] for k in sd if k.endswith(HF_PATCH_KEY))
    out: StateDict = {}
    qkv: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    swiglu: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
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
        "norm1": "norm1",  # DINOv2
        "norm2": "norm2",
        "layer_scale1": "ls1",
        "layer_scale2": "ls2",
        "mlp.weights_in": "mlp.fc1",  # DINOv2 giant's SwiGLU on disk: fc1 packed (gate, then value)
        "mlp.weights_out": "mlp.fc2",
        "mlp.down_proj": "mlp.fc2",  # ... and in transformers 5's memory, gate_proj and up_proj apart
    }
    qkv_parts = {
        "attention.attention.query": "query", "attention.attention.key": "key", "attention.attention.value": "value",
        "attention.q_proj": "query", "attention.k_proj": "key", "attention.v_proj": "value",
    }  # fmt: skip
    heads = {"classifier": "head", "cls_classifier": "head", "distillation_classifier": "head_dist"}
    layer_re = re.compile(r"(?:encoder\.layer|layers)\.(\d+)\.(.+)\.(weight|bias|lambda1)$")
    for key, value in sd.items():
        if key.startswith(prefix):
            inner = key[len(prefix) :]
        elif key.split(".")[0] in heads or layer_re.match(key):  # transformers 5 saves ViT-MSN's layers without its prefix
            inner = key
        else:
            out[key] = value  # unknown: reported as unexpected by the loader
            continue
        if inner in simple:
            out[simple[inner]] = value
        elif inner.split(".")[0] in heads and inner.count(".") == 1:
            name, kind = inner.split(".")
            out[f"{heads[name]}.{kind}"] = value
        elif inner.startswith("pooler.dense."):
            out[f"pre_logits.fc.{inner.rsplit('.', 1)[1]}"] = value
        elif inner.startswith("pooler.") or inner == "embeddings.mask_token":
            continue
        elif inner == "embeddings.register_tokens":
            out["reg_token"] = value
        elif m := layer_re.match(inner):
            idx, sub, kind = int(m.group(1)), m.group(2), m.group(3)
            if sub in qkv_parts:
                qkv.setdefault(idx, {}).setdefault(kind, {})[qkv_parts[sub]] = value
            elif sub in ("mlp.gate_proj", "mlp.up_proj"):
                swiglu.setdefault(idx, {}).setdefault(kind, {})[sub] = value
            elif sub in layer_map:
                out[f"blocks.{idx}.{layer_map[sub]}.{'gamma' if kind == 'lambda1' else kind}"] = value
            else:
                out[key] = value
        else:
            out[key] = value
    if any(k.startswith("head.") for k in out) or "dist_token" in out or "cls_token" not in out:
        out = {k: v for k, v in out.items() if not k.startswith("pre_logits.")}
    if "reg_token" in out and "cls_token" in out and "pos_embed" in out:
        out["cls_token"] = out["cls_token"] + out["pos_embed"][:, :1]
        out["pos_embed"] = out["pos_embed"][:, 1:]
    return out | _stacked(qkv, "attn.qkv", ("query", "key", "value")) | _stacked(swiglu, "mlp.fc1", ("mlp.gate_proj", "mlp.up_proj"))


def _stacked(parts_by_layer: dict[int, dict[str, dict[str, torch.Tensor]]], name: str, order: tuple[str, ...]) -> StateDict:
    """{layer: {weight|bias: {part: tensor}}} -> timm's `blocks.N.{name}.*`, the parts stacked in `order`
    (attention's q, k, v into qkv; SwiGLU's gate and value into its packed fc1)."""
    out: StateDict = {}
    for idx, kinds in parts_by_layer.items():
        for kind, parts in kinds.items():
            if set(parts) != set(order):
                raise CheckpointError(f"layer {idx} has an incomplete {name} {kind}: found only {sorted(parts)}")
            out[f"blocks.{idx}.{name}.{kind}"] = torch.cat([parts[p] for p in order], dim=0)
    return out


def read_hf_state_dict(sd: StateDict, *, num_heads: int | None = None) -> tuple[StateDict, ViTConfig, Guesses]:
    """An HF state dict without its config.json -> (timm-named state dict, config read off the shapes,
    guesses); eps, activation and preprocessing are transformers' defaults for the model type."""
    if dinov3.is_dinov3(sd):
        return _read_dinov3_state_dict(dinov3.dinov3_to_timm(sd), num_heads)
    if is_tower(sd):
        model_type = "clip" if is_clip(sd) else AIMV2_MODEL_TYPE if is_aimv2(sd) else "siglip"
    else:
        model_type = "dinov2" if any(".layer_scale1." in k for k in sd) else "vit"
    projected = model_type == "clip" and has_clip_projection(sd)
    sd = hf_to_timm(sd)
    eps = {"clip": 1e-5, "dinov2": 1e-6, "siglip": 1e-6, AIMV2_MODEL_TYPE: 1e-5}.get(model_type, 1e-12)
    cfg, guesses = infer_timm_config(sd, norm_eps=eps, family="siglip" if model_type == "siglip" else None, num_heads=num_heads)
    size = cfg.img_hw[0]
    pre, _ = hf_preprocessing(_default_preprocessor(model_type, size), cfg.in_chans, size)
    packed = cfg.mlp_layer == "swiglu_packed"  # DINOv2 giant's SiLU gate is a fact of the shapes; any other MLP's activation is not
    act = "silu" if cfg.mlp_layer != "mlp" else {"clip": "quick_gelu", "siglip": "gelu_tanh"}.get(model_type, "gelu")  # AIMv2's: SiLU
    cfg = cfg.replace(act_layer=act, **pre)
    name = model_type.removesuffix("_vision_model").upper()
    reason = f"not stored in a Hugging Face state dict without its config.json; transformers' {name} default assumed"
    guessed = ("norm_eps", *(() if packed else ("act_layer",)), *(k for k in pre if k != "crop_rounding"))  # HF floors crops: a fact
    if model_type == "siglip" and cfg.global_pool == "avg" and not cfg.num_classes:
        guesses["global_pool"] = HEADLESS_SIGLIP
    if model_type == AIMV2_MODEL_TYPE:
        guesses["global_pool"] = HEADLESS_AIMV2
    if projected:  # CLIP's visual_projection: image_embeds (a fact of its name, not a guess off the head's width)
        cfg = cfg.replace(embedding_head=True)
        guesses.pop("embedding_head", None)
    if cfg.distilled and not cfg.num_classes:
        guesses["global_pool"] = DEIT_POOLER
    guesses.pop("no_embed_class", None)  # a fact here: hf_to_timm folds DINOv2's register models into that layout
    return sd, cfg, guesses | dict.fromkeys(guessed, reason)


def _read_dinov3_state_dict(sd: StateDict, num_heads: int | None) -> tuple[StateDict, ViTConfig, Guesses]:
    """A DINOv3 state dict (timm names) without config.json: its config read off the shapes, as `read_hf_state_dict`."""
    fields, guesses = dinov3.bare_hf_config(sd, num_heads)
    pre, _ = hf_preprocessing(_default_preprocessor(dinov3.MODEL_TYPE, fields["img_size"]), fields["in_chans"], fields["img_size"])
    reason = "not stored in a Hugging Face state dict without its config.json; transformers' DINOv3ViTImageProcessor defaults assumed"
    return sd, ViTConfig(**(fields | pre)), guesses | dict.fromkeys(("mean", "std", "interpolation", "crop_pct", "crop_mode"), reason)


def has_clip_projection(sd: StateDict) -> bool:
    """HF weights with CLIP's `visual_projection` (read before `hf_to_timm` makes it the head): the model returns
    `image_embeds`, an image embedding, not class logits."""
    return any(k.endswith(CLIP_PROJECTION_KEY) for k in sd)


def hf_config_to_vit(cfg: dict[str, Any], preprocessor: dict[str, Any] | None, sd: StateDict, *,
                     projected: bool = False) -> tuple[ViTConfig, Guesses]:  # fmt: skip
    """A `ViTConfig` from HF `config.json` and `preprocessor_config.json` (its defaults, guessed, when absent).
    `projected`: the weights had CLIP's `visual_projection` (now `sd`'s head): the model returns `image_embeds`, an image
    embedding (`embedding_head`), not class logits."""
    model_type = cfg.get("model_type", "vit")
    if model_type in CLIP_MODEL_TYPES + SIGLIP_MODEL_TYPES:
        vision = (cfg.get("vision_config") or {}) if model_type in ("clip", "siglip") else cfg
        fields = _tower_fields(vision, sd, clip=model_type in CLIP_MODEL_TYPES)
    elif model_type in (*VIT_MODEL_TYPES, *DINOV2_MODEL_TYPES):
        fields = _vit_fields(cfg, model_type, sd)
    elif model_type == AIMV2_MODEL_TYPE:
        fields = _aimv2_fields(cfg, sd)
    elif model_type == dinov3.MODEL_TYPE:
        fields = dinov3.dinov3_fields(cfg, sd)
    else:
        known = ", ".join(repr(t) for t in (*VIT_MODEL_TYPES, *DINOV2_MODEL_TYPES, *CLIP_MODEL_TYPES, *SIGLIP_MODEL_TYPES, AIMV2_MODEL_TYPE,
                                            dinov3.MODEL_TYPE))  # fmt: skip
        raise CheckpointError(f"config.json describes a {model_type!r} model; vitfast reads ViT, DeiT, ViT-MSN, I-JEPA, DINOv2, DINOv3, CLIP, "
                              f"SigLIP and AIMv2 image towers (model_type {known})")  # fmt: skip
    if model_type in (*DINOV2_MODEL_TYPES, dinov3.MODEL_TYPE):
        fields |= _backbone_fields(cfg, model_type, fields["depth"])
    head = sd.get("head.weight")
    if model_type in CLIP_MODEL_TYPES and head is not None and projected:  # CLIP's visual_projection: image_embeds, not classes
        fields["embedding_head"], head = True, None
    labels, guesses = hf_labels(cfg, head.shape[0]) if head is not None else (None, {})
    if labels:
        fields["labels"] = labels
    if head is not None and (problem_type := hf_problem_type(cfg)):
        fields["problem_type"] = problem_type
    if model_type in SIGLIP_MODEL_TYPES and fields["global_pool"] == "avg" and head is None:
        guesses["global_pool"] = HEADLESS_SIGLIP
    if model_type == "ijepa" and head is None:
        guesses["global_pool"] = HEADLESS_IJEPA
    if fields.get("distilled") and head is None:
        guesses["global_pool"] = DEIT_POOLER
    if model_type == AIMV2_MODEL_TYPE:  # a head is refused (tower_to_timm)
        guesses["global_pool"] = HEADLESS_AIMV2
    if preprocessor is None:
        preprocessor = _default_preprocessor(model_type, fields["img_size"])
        reason = f"no preprocessor_config.json; {preprocessor['image_processor_type']} defaults assumed"
        guesses |= dict.fromkeys(("mean", "std", "interpolation", "crop_pct", "crop_mode"), reason)
    # DINOv2 interpolates its position embeddings to whatever size it is given (the processor's); DINOv3's rotary ones
    # are computed for it
    follow_size = model_type in (*DINOV2_MODEL_TYPES, dinov3.MODEL_TYPE)
    pre, pre_guesses = hf_preprocessing(preprocessor, fields["in_chans"], fields["img_size"], follow_size=follow_size,
                                        default_kind=MODEL_PROCESSORS[model_type])  # fmt: skip
    return ViTConfig(**(fields | pre)), guesses | pre_guesses


def _backbone_fields(cfg: dict[str, Any], model_type: str, depth: int) -> dict[str, Any]:
    """A `Dinov2Backbone` / `Dinov2WithRegistersBackbone` / `DINOv3ViTBackbone` folder returns `feature_maps`: the patch
    tokens of its `out_indices` stages (stage i = after block i - 1; transformers' default the last), normalised with
    `apply_layernorm`, as NCHW maps with `reshape_hidden_states`; without it DINOv2's are every token of the stage, the class
    and register tokens first (Depth Anything's backbone), DINOv3's the patch tokens, NLC. The features_only
    fields that compute them; what vitfast cannot compute is refused by name. Other folders: no fields."""
    arch = next((a for a in cfg.get("architectures") or () if a.endswith("Backbone")), None)
    if arch is None:
        return {}
    stages = cfg.get("out_indices")
    if not stages:
        names = cfg.get("out_features") or [f"stage{depth}"]
        if not all(re.fullmatch(r"stem|stage\d+", str(n)) for n in names):
            raise CheckpointError(f"this {arch}'s out_features {names} are not transformers' stage names ('stem', 'stage1', ...); fix config.json")
        stages = [0 if n == "stem" else int(n.removeprefix("stage")) for n in names]
    reshape, norm = cfg.get("reshape_hidden_states", True), cfg.get("apply_layernorm", True)
    if 0 in stages:
        raise CheckpointError(f"this {arch} returns the stem (the embeddings before any block) as a feature map; vitfast's feature maps "
                              "are block outputs: drop 'stem' from out_features in config.json, or load the weights alone")  # fmt: skip
    if not norm and model_type == dinov3.MODEL_TYPE and depth in stages:
        raise CheckpointError(f"this {arch} has apply_layernorm=false but normalises its last stage anyway, one map of {len(stages)}; "
                              "vitfast normalises all maps or none: set apply_layernorm to true, or leave the last stage out")  # fmt: skip
    every_token = not reshape and model_type != dinov3.MODEL_TYPE  # DINOv2's backbones then return the prefix tokens too
    return dict(features_only=True, out_indices=tuple(s - 1 for s in stages), output_fmt="NCHW" if reshape else "NLC", feature_norm=norm,
                feature_prefix_tokens=every_token)  # fmt: skip


def _hf_act(section: dict[str, Any], default: str) -> str:
    """Our act_layer for a config's `hidden_act` (transformers' `default` when absent)."""
    act = section.get("hidden_act", default)
    if act not in HF_ACTS:
        raise CheckpointError(f"unsupported hidden_act {act!r} in config.json; supported: {', '.join(HF_ACTS)}")
    return HF_ACTS[act]


def _vit_fields(cfg: dict[str, Any], model_type: str, sd: StateDict) -> dict[str, Any]:
    """ViTConfig architecture fields of a ViT / DeiT / ViT-MSN / I-JEPA / DINOv2 config.json (transformers' defaults
    for what it leaves out). I-JEPA has no class token: its classifier reads the mean of the normalised tokens."""
    dinov2 = model_type in DINOV2_MODEL_TYPES
    fields = _hf_shape_fields(cfg, sd, patch_size=14 if dinov2 else 16)
    dim = fields["embed_dim"]
    if dinov2:
        fields["global_pool"] = _dinov2_pool(sd.get("head.weight"), dim)
    if model_type == "ijepa":
        fields |= dict(class_token=False, global_pool="avg", fc_norm=False)
    fields |= dict(
        mlp_ratio=cfg.get("mlp_ratio", 4.0) if dinov2 else cfg.get("intermediate_size", 4 * dim) / dim,
        qkv_bias=cfg.get("qkv_bias", True),
        norm_eps=cfg.get("layer_norm_eps", 1e-6 if dinov2 or model_type == "vit_msn" else 1e-12),
        act_layer=_hf_act(cfg, "gelu"),
        distilled="dist_token" in sd,
        dist_head=_dist_head(sd),
    )
    if dinov2 and cfg.get("use_swiglu_ffn"):  # the giant: SiLU gate whatever hidden_act says, fc1 packed to 2 x 4096
        fields |= dict(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=sd["blocks.0.mlp.fc1.weight"].shape[0] / dim)
    if dinov2:
        regs = sd["reg_token"].shape[1] if "reg_token" in sd else 0
        fields |= dict(init_values=float(cfg.get("layerscale_value", 1.0)), reg_tokens=regs, no_embed_class=regs > 0)
    if (pooler := sd.get("pre_logits.fc.weight")) is not None:  # a bare ViTModel: pooler_output = act(dense(class token))
        if cfg.get("pooler_act", "tanh") != "tanh":
            raise CheckpointError(f"this {model_type} model's pooler uses pooler_act={cfg['pooler_act']!r}; vitfast's pre-logits layer is "
                                  "tanh, the ViT paper's (transformers' default). Save the model without its pooler (add_pooling_layer=False) "
                                  "to load its normalised class token")  # fmt: skip
        fields["representation_size"] = pooler.shape[0]
    return fields


def _dist_head(sd: StateDict) -> bool:
    """Whether a classifier beside a distillation token has the token's own head too (timm's distilled DeiTs,
    transformers' DeiTForImageClassificationWithTeacher), or classifies the class token alone (DeiTForImageClassification).
    No classifier at all: the two tokens' mean, as timm's distilled models without one return. True without a
    distillation token (the field's default)."""
    return "dist_token" not in sd or "head.weight" not in sd or "head_dist.weight" in sd


def _aimv2_fields(cfg: dict[str, Any], sd: StateDict) -> dict[str, Any]:
    """ViTConfig architecture fields of an AIMv2 image tower (`Aimv2VisionModel`; transformers' defaults for
    what config.json leaves out): timm's AIMv2 layout (RMSNorm, also on the patch embeddings; SwiGLU; no class
    token, the mean of the normalised tokens). transformers ties the attention output's bias to `qkv_bias`;
    that it equals `mlp_bias` is checked on the weights (tower_to_timm)."""
    cfg = AIMV2_DEFAULTS | cfg
    if cfg["hidden_act"] not in ("silu", "swish"):  # transformers' two names for SiLU
        raise CheckpointError(f"this AIMv2 tower gates its MLP with hidden_act {cfg['hidden_act']!r}; vitfast's SwiGLU gate is SiLU ('silu')")
    fields = _hf_shape_fields(cfg, sd, patch_size=AIMV2_DEFAULTS["patch_size"])
    layout = {k: _AIMV2[k] for k in ("class_token", "global_pool", "fc_norm", "norm_layer", "embed_norm", "mlp_layer", "act_layer")}
    return fields | layout | dict(mlp_ratio=cfg["intermediate_size"] / fields["embed_dim"], qkv_bias=cfg["qkv_bias"], proj_bias=cfg["qkv_bias"],
                                  norm_eps=cfg["rms_norm_eps"])  # fmt: skip


def _hf_shape_fields(section: dict[str, Any], sd: StateDict, *, patch_size: int) -> dict[str, Any]:
    """The ViTConfig fields every HF vision config states alike (transformers' defaults, and its
    `patch_size`, where the config leaves them out); the class count from the converted head."""
    head = sd.get("head.weight")
    return dict(
        img_size=section.get("image_size", 224),
        patch_size=section.get("patch_size", patch_size),
        in_chans=section.get("num_channels", 3),
        embed_dim=section.get("hidden_size", 768),
        depth=section.get("num_hidden_layers", 12),
        num_heads=section.get("num_attention_heads", 12),
        num_classes=head.shape[0] if head is not None else 0,
    )


def _dinov2_pool(head: torch.Tensor | None, dim: int) -> str:
    """"token", or "token_avg" for Dinov2ForImageClassification's classifier (class token and mean patch
    token side by side); any other head width is refused."""
    if head is None or head.shape[1] == dim:
        return "token"
    if head.shape[1] == 2 * dim:
        return "token_avg"
    raise CheckpointError(f"the DINOv2 classifier reads {head.shape[1]} features; vitfast knows {dim} (class token) and "
                          f"{2 * dim} (Dinov2ForImageClassification: class token and mean patch token)")  # fmt: skip


def _default_preprocessor(model_type: str, img_size: int | Sequence[int]) -> dict[str, Any]:
    """A preprocessor_config.json for the processor transformers pairs with `model_type`, sized for
    the model's (h, w) (DeiT: resize to 256/224 of it, then centre crop; CLIP and AIMv2: shortest edge to its
    shorter side, then centre crop; DINOv2: shortest edge to 256/224 of that, then centre crop, ImageNet's
    mean/std as facebook/dinov2-* state; ViT and SigLIP: resize to it). Everything else is the class's default
    (`PROCESSOR_DEFAULTS`). config.json's `image_size` may be one int or [h, w]."""
    h, w = (img_size, img_size) if isinstance(img_size, int) else (int(img_size[0]), int(img_size[1]))
    kind, crop = MODEL_PROCESSORS[model_type], {"height": h, "width": w}
    if kind == "CLIPImageProcessor":
        return {"image_processor_type": kind, "size": {"shortest_edge": min(h, w)}, "crop_size": crop}
    if model_type in DINOV2_MODEL_TYPES:
        return {"image_processor_type": kind, "size": {"shortest_edge": min(h, w) * 256 // 224}, "crop_size": crop,
                "image_mean": list(IMAGENET_MEAN), "image_std": list(IMAGENET_STD)}  # fmt: skip
    if model_type == "deit":
        return {"image_processor_type": kind, "size": {"height": h * 256 // 224, "width": w * 256 // 224}, "crop_size": crop}
    return {"image_processor_type": kind, "size": crop}


def hf_labels(cfg: dict, num_classes: int | None = None) -> tuple[tuple[str, ...] | None, Guesses]:
    """Class names by index from an HF config.json's `id2label` -> (names or None, guesses). None: none there, another
    count than `num_classes`, or transformers' placeholders (LABEL_0, LABEL_1, ...), which carry no information. Line
    breaks in a name become spaces (labels are written one per line for Triton), said as a guess."""
    id2label = cfg.get("id2label") or {}
    if not isinstance(id2label, dict) or not id2label or (num_classes is not None and len(id2label) != num_classes):
        return None, {}
    if all(str(v) == f"LABEL_{k}" for k, v in id2label.items()):
        return None, {}
    names = [id2label.get(str(i), id2label.get(i)) for i in range(len(id2label))]  # JSON keys are strings, in-memory ones ints
    if any(name is None for name in names):
        return None, {}
    one_line = tuple(re.sub(r"[\r\n]+", " ", str(name)) for name in names)
    broken = [i for i, name in enumerate(names) if str(name) != one_line[i]]
    guesses = {"labels": f"id2label names with line breaks ({', '.join(map(str, broken[:5]))}{', ...' if len(broken) > 5 else ''}) "
                         "read with spaces instead; pass --labels FILE to name them yourself"} if broken else {}  # fmt: skip
    return one_line, guesses


def hf_problem_type(cfg: dict) -> str | None:
    """An HF config.json's `problem_type` (transformers' names, `PROBLEM_TYPES`), or None where it says none or
    something else (the config's own loader would refuse that)."""
    problem_type = cfg.get("problem_type")
    return problem_type if problem_type in PROBLEM_TYPES else None


def processor_kind(pre: dict[str, Any], default: str = "") -> str:
    """The image processor a preprocessor_config.json stands for, as transformers resolves it:
    `image_processor_type`, else the legacy `feature_extractor_type` (openai/clip-*, google/vit-*)
    renamed, else `default` (the model type's processor); without "Fast" (the torchvision twins
    read sizes alike)."""
    legacy = str(pre.get("feature_extractor_type") or "").replace("FeatureExtractor", "ImageProcessor")
    return str(pre.get("image_processor_type") or legacy or default).removesuffix("Fast")


def hf_preprocessing(pre: dict[str, Any], in_chans: int, img_size: int | tuple[int, int], *, follow_size: bool = False,
                     default_kind: str = "") -> tuple[dict[str, Any], Guesses]:  # fmt: skip
    """ViTConfig preprocessing fields doing what the HF image processor (PIL backend) does:
    `size` {height, width} resizes straight ("squash", non-square sizes too), {shortest_edge} keeps the aspect ratio
    ("center"); `crop_size` after `do_center_crop` (offset floored, as HF does); rescale and
    normalisation folded into one mean/std. Where the processor's output size differs from
    `img_size`, `follow_size` makes it the model's `img_size` (for models that interpolate their
    position embeddings to any input, as DINOv2 does), else it is reported as a guess.
    `default_kind`: the processor class to follow when the file names none."""
    guesses: Guesses = {}
    kind = processor_kind(pre, default_kind)
    pre = PROCESSOR_DEFAULTS.get(kind, {}) | pre
    mean = [float(v) for v in _per_channel(pre.get("image_mean", 0.5), in_chans)]
    std = [float(v) for v in _per_channel(pre.get("image_std", 0.5), in_chans)]
    if not pre.get("do_normalize", True):
        mean, std = [0.0] * in_chans, [1.0] * in_chans
    factor = float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) else 1.0
    if factor != 1 / 255:  # (x * factor - m) / s == (x / 255 - m / (255 factor)) / (s / (255 factor))
        mean, std = [m / (255 * factor) for m in mean], [v / (255 * factor) for v in std]
    # do_convert_rgb: transparent pixels composited onto white (transformers' convert_to_rgb); without it a processor
    # takes no RGBA image at all, and vitfast drops alpha as Pillow does
    out: dict[str, Any] = {"mean": tuple(mean), "std": tuple(std), "crop_rounding": "floor", "alpha_on_white": bool(pre.get("do_convert_rgb"))}
    resample = pre.get("resample", 2)
    out["interpolation"] = PIL_RESAMPLE.get(resample, "bicubic")
    if resample not in PIL_RESAMPLE:
        guesses["interpolation"] = f"the processor's resample {resample!r} is not supported (nearest 0, bilinear 2, bicubic 3); bicubic used"
    size, crop = pre.get("size", 224), pre.get("crop_size")
    if isinstance(size, int):
        size = {"shortest_edge": size} if kind in SHORTEST_EDGE_PROCESSORS else {"height": size, "width": size}
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    crop = crop if pre.get("do_center_crop") and isinstance(crop, dict) else None
    edge = size.get("shortest_edge") if isinstance(size, dict) else None
    model_hw = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    crop_hw = (crop["height"], crop.get("width", crop["height"])) if crop else None
    if kind.startswith("ConvNext") and edge:
        # ConvNextImageProcessor: below 384, shortest edge to int(edge / crop_pct) then an edge x edge
        # crop; from 384 on, straight to edge x edge
        pct = float(pre.get("crop_pct", 224 / 256)) if edge < 384 else 1.0
        out |= {"crop_mode": "center" if edge < 384 else "squash", "crop_pct": pct}
        output = (edge, edge)
    elif not pre.get("do_resize", True):
        out |= {"crop_mode": "squash", "crop_pct": 1.0}  # images must already have the input size
        output = model_hw
    elif edge:
        output = crop_hw or model_hw
        out |= {"crop_mode": "center", "crop_pct": _exact_crop_pct(output[0], edge)}
        if not crop:
            guesses["crop_pct"] = "the processor resizes the shortest edge without a centre crop (no fixed input size); a centre crop assumed"
        elif output[0] != output[1]:  # vitfast's centre crop of a non-square size resizes as timm's ResizeKeepRatio does
            guesses["crop_pct"] = (f"the processor crops {output[0]}x{output[1]} after resizing the shortest edge to {edge}, which vitfast's "
                                   "non-square centre crop (timm's ResizeKeepRatio) does not reproduce; images are resized by its rule")  # fmt: skip
    elif isinstance(size, dict) and size.get("height") and size.get("width"):
        resized = (size["height"], size["width"])  # both sides straight to these, then the crop, if any
        output = crop_hw or resized
        pct = _exact_crop_pct(output[0], resized[0])
        out |= {"crop_mode": "squash", "crop_pct": pct}
        if (got := tuple(math.floor(o / pct) for o in output)) != resized:  # one crop_pct scales both sides
            guesses["crop_pct"] = (f"the processor resizes to {resized[0]}x{resized[1]} and crops {output[0]}x{output[1]}, which one crop_pct "
                                   f"cannot reproduce; {pct:g} (the heights') used, resizing to {got[0]}x{got[1]}")  # fmt: skip
    else:
        raise CheckpointError(f"preprocessor_config.json has a size vitfast cannot follow: {size!r}; pass --config with the preprocessing")
    if output != model_hw and follow_size:
        out["img_size"] = output[0] if output[0] == output[1] else output
    elif output != model_hw:
        guesses["img_size"] = (f"the processor makes {output[0]}x{output[1]} inputs but config.json's image_size is {model_hw[0]}x{model_hw[1]}; "
                               f"{model_hw[0]}x{model_hw[1]} used")  # fmt: skip
    return out, guesses


# ---------------------------------------------------------------------------- Hugging Face CLIP, SigLIP and AIMv2
def is_tower(sd: StateDict) -> bool:
    """A CLIP or SigLIP image tower (their shared `embeddings.patch_embedding` naming), or an AIMv2 one."""
    return any(k.endswith((TOWER_PATCH_KEY, AIMV2_PATCH_KEY)) for k in sd)


def is_aimv2(sd: StateDict) -> bool:
    return any(k.endswith(AIMV2_PATCH_KEY) for k in sd)


def is_clip(sd: StateDict) -> bool:
    return is_tower(sd) and any(k.endswith(CLIP_CLASS_KEY) for k in sd)


def tower_to_timm(sd: StateDict) -> StateDict:
    """Rename the image tower of a CLIP (`CLIPModel`, `CLIPVisionModel[WithProjection]`), SigLIP
    (`SiglipModel`, `SiglipVisionModel`, `SiglipForImageClassification`) or AIMv2 (`Aimv2VisionModel`)
    state dict to timm's names: q/k/v fused, `pre_layrnorm` -> norm_pre, `post_layernorm` -> norm, CLIP's
    `visual_projection` -> head (bias zero), SigLIP's attention-pool `head` -> attn_pool (its
    `nn.MultiheadAttention` in_proj split into q and kv), SigLIP's `classifier` -> head; AIMv2's RMSNorms
    (`embeddings.rms_norm` -> patch_embed.norm, `rms_norm` -> norm) and SwiGLU (`gate_proj` -> fc1_g,
    `up_proj` -> fc1_x, `down_proj` -> fc2). Text towers, `logit_scale` and `logit_bias` are dropped, and so
    is the attention pool of a `SiglipForImageClassification`, which classifies the mean token instead.

    HF applies CLIP's `post_layernorm` to the class token only and timm to every token before
    pooling it: the same embedding (`image_embeds`, or `pooler_output` without a projection)."""
    patch_key = next(k for k in sd if k.endswith((TOWER_PATCH_KEY, AIMV2_PATCH_KEY)))
    vision = patch_key[: patch_key.rindex("embeddings.")]
    if sd[patch_key].ndim != 4:
        raise CheckpointError("this is a SigLIP 2 NaFlex tower (patches embedded by a Linear at any aspect ratio), which vitfast "
                              "does not implement; the fixed-resolution SigLIP 2 checkpoints (google/siglip2-*-patch16-224 ...) load")  # fmt: skip
    prefix = vision.removesuffix("vision_model.")  # where the projection, classifier and text tower are
    if patch_key.endswith(AIMV2_PATCH_KEY):
        _check_aimv2(sd, vision, prefix)
    simple = {
        "embeddings.patch_embedding.weight": "patch_embed.proj.weight", "embeddings.patch_embedding.bias": "patch_embed.proj.bias",
        "pre_layrnorm.weight": "norm_pre.weight", "pre_layrnorm.bias": "norm_pre.bias",  # (sic: HF's name)
        "post_layernorm.weight": "norm.weight", "post_layernorm.bias": "norm.bias",
        "head.probe": "attn_pool.latent",
        "embeddings.patch_embed.weight": "patch_embed.proj.weight", "embeddings.patch_embed.bias": "patch_embed.proj.bias",  # AIMv2
        "embeddings.rms_norm.weight": "patch_embed.norm.weight", "rms_norm.weight": "norm.weight",
    }  # fmt: skip
    pool_map = {"head.attention.out_proj": "attn_pool.proj", "head.layernorm": "attn_pool.norm",
                "head.mlp.fc1": "attn_pool.mlp.fc1", "head.mlp.fc2": "attn_pool.mlp.fc2"}  # fmt: skip
    layer_map = {"self_attn.out_proj": "attn.proj", "layer_norm1": "norm1", "layer_norm2": "norm2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2",
                 "attention.out_proj": "attn.proj", "rms_norm1": "norm1", "rms_norm2": "norm2",  # AIMv2
                 "ffn.gate_proj": "mlp.fc1_g", "ffn.up_proj": "mlp.fc1_x", "ffn.down_proj": "mlp.fc2"}  # fmt: skip
    qkv_parts = {"self_attn.q_proj": "query", "self_attn.k_proj": "key", "self_attn.v_proj": "value",
                 "attention.q_proj": "query", "attention.k_proj": "key", "attention.v_proj": "value"}  # fmt: skip
    layer_re = re.compile(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")
    out: StateDict = {}
    qkv: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    for key, value in sd.items():
        inner = key[len(vision) :] if key.startswith(vision) else None
        m = layer_re.match(inner) if inner else None
        module, _, kind = (inner or "").rpartition(".")
        if key == prefix + "visual_projection.weight":
            out["head.weight"], out["head.bias"] = value, value.new_zeros(value.shape[0])
        elif key in (prefix + "classifier.weight", prefix + "classifier.bias"):
            out["head." + key.rpartition(".")[2]] = value
        elif key.startswith((prefix + "text_", prefix + "logit_scale", prefix + "logit_bias")) or inner == "embeddings.position_ids":
            continue
        elif inner == "embeddings.class_embedding":
            out["cls_token"] = value.reshape(1, 1, -1)
        elif inner == "embeddings.position_embedding.weight":
            out["pos_embed"] = value.unsqueeze(0)
        elif inner in simple:
            out[simple[inner]] = value
        elif module == "head.attention" and kind in ("in_proj_weight", "in_proj_bias"):
            dim = value.shape[0] // 3  # rows: query, key, value
            part = kind.removeprefix("in_proj_")
            out[f"attn_pool.q.{part}"], out[f"attn_pool.kv.{part}"] = value[:dim], value[dim:]
        elif module in pool_map and kind in ("weight", "bias"):
            out[f"{pool_map[module]}.{kind}"] = value
        elif m and m.group(2) in qkv_parts:
            qkv.setdefault(int(m.group(1)), {}).setdefault(m.group(3), {})[qkv_parts[m.group(2)]] = value
        elif m and m.group(2) in layer_map:
            out[f"blocks.{m.group(1)}.{layer_map[m.group(2)]}.{m.group(3)}"] = value
        else:
            out[key] = value  # unknown: reported as unexpected by the loader
    if prefix + "classifier.weight" in sd:
        out = {k: v for k, v in out.items() if not k.startswith("attn_pool.")}
    return out | _stacked(qkv, "attn.qkv", ("query", "key", "value"))


def _check_aimv2(sd: StateDict, vision: str, prefix: str) -> None:
    """Refuse, by its weights, what of transformers' AIMv2 vitfast cannot compute: `Aimv2Model`'s image
    embeddings, the attention-pooling head, native-resolution towers, and biases on the attention but
    not the MLP or the other way round (vitfast's `proj_bias` is one flag for both)."""
    if prefix + "visual_projection.weight" in sd:
        raise CheckpointError("this is an Aimv2Model (image and text towers): its image_embeds project the pooler_output of the image "
                              "tower's attention-pooling head, which vitfast does not implement (without that head transformers "
                              "computes none); an Aimv2VisionModel without the head (use_head=False) loads")  # fmt: skip
    if any(k.startswith(vision + "head.") for k in sd):
        raise CheckpointError("this AIMv2 tower has an attention-pooling head (use_head=True: a learned query attending to the "
                              "tokens through its own key/value projections, then output_proj), which vitfast does not implement, "
                              "so its pooler_output cannot be computed; the tokens (last_hidden_state) would match: save it with "
                              "use_head=False and without the head.* weights to load them, pooled by their mean")  # fmt: skip
    if vision + "embeddings.position_embedding.weight" not in sd:
        raise CheckpointError("this is a native-resolution AIMv2 tower (is_native=True: 2D sinusoidal position embeddings computed "
                              "for each input size, apple/aimv2-*-native), which vitfast does not implement; fixed-size towers "
                              "(is_native=False, a learned position_embedding) load")  # fmt: skip
    attn_bias, mlp_bias = (vision + f"encoder.layers.0.{name}.bias" in sd for name in ("attention.out_proj", "ffn.down_proj"))
    if attn_bias != mlp_bias:
        raise CheckpointError(f"this AIMv2 tower has qkv_bias={attn_bias} (its attention Linears, out_proj included) but "
                              f"mlp_bias={mlp_bias}; vitfast's ViT has one proj_bias for the attention output and MLP Linears, "
                              "so it cannot hold both")  # fmt: skip


def _tower_fields(vision: dict[str, Any], sd: StateDict, *, clip: bool) -> dict[str, Any]:
    """ViTConfig architecture fields of a CLIP or SigLIP image tower from its vision config
    (transformers' defaults for what it leaves out). CLIP's head is `visual_projection` when the
    checkpoint has one, else the model returns the pooled embedding; SigLIP pools with its
    attention pool (`pooler_output`), or, for `SiglipForImageClassification` and towers without a
    pool, by the mean token."""
    fields = _hf_shape_fields(vision, sd, patch_size=32 if clip else 16)
    fields |= dict(
        mlp_ratio=vision.get("intermediate_size", 4 * fields["embed_dim"]) / fields["embed_dim"],
        norm_eps=vision.get("layer_norm_eps", 1e-5 if clip else 1e-6),
        act_layer=_hf_act(vision, "quick_gelu" if clip else "gelu_pytorch_tanh"),
    )
    if clip:
        return fields | dict(pre_norm=True)
    pool = dict(global_pool="map") if "attn_pool.latent" in sd else dict(global_pool="avg", fc_norm=False)
    return fields | pool | dict(class_token=False)


def _per_channel(value: Any, in_chans: int) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value] * in_chans


def _exact_crop_pct(crop: int, resized: int) -> float:
    """crop_pct with floor(crop / crop_pct) == resized exactly (crop / resized may round either way)."""
    if crop >= resized:
        return 1.0
    pct = crop / resized
    while math.floor(crop / pct) < resized:
        pct = math.nextafter(pct, 0.0)
    while math.floor(crop / pct) > resized:
        pct = math.nextafter(pct, 1.0)
    return pct


# ---------------------------------------------------------------------------- timm
def infer_timm_config(
    sd: StateDict, *, norm_eps: float | None = None, family: str | None = None, num_heads: int | None = None
) -> tuple[ViTConfig, Guesses]:
    """Read a `ViTConfig` off a timm-named state dict's tensor shapes; the head count and the
    preprocessing are not in the weights and come back as guesses. So do, for a CLIP image tower
    (`norm_pre`), the LayerNorm eps and the GELU form, which differ between its timm variants, and
    for a SigLIP tower (`attn_pool`, or the shapes of a registered `*_siglip_gap_*`) the GELU form. `norm_eps` None:
    timm's default for the kind of model (1e-6, CLIP towers 1e-5). The head count comes from a registered model of the same
    shapes, preferring names with `family` in them, unless the caller knows it (`num_heads`)."""
    def has(key: str) -> bool:
        return key in sd

    hybrid = None
    # a ResNet-v2 stem with stages, or alone (timm's R+Ti: the stem is the backbone)
    stem = next((k for k in ("patch_embed.backbone.stem.conv.weight", "patch_embed.backbone.conv.weight") if has(k)), None)
    if stem is not None:
        stages = {}
        for key in sd:
            if m := re.match(r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.", key):
                stages[int(m.group(1))] = max(stages.get(int(m.group(1)), 0), int(m.group(2)) + 1)
        hybrid = tuple(stages[i] for i in sorted(stages))
        in_chans = sd[stem].shape[1]
        dim, _, k, _ = sd["patch_embed.proj.weight"].shape
        patch = k * hybrid_stride(hybrid)
    else:
        dim, in_chans, patch, _ = sd["patch_embed.proj.weight"].shape
    depth = 1 + max((int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)
    if depth == 0:
        raise CheckpointError("checkpoint has patch embeddings but no transformer blocks ('blocks.N.*')")
    class_token, distilled = has("cls_token"), has("dist_token")
    reg_tokens = sd["reg_token"].shape[1] if has("reg_token") else 0
    prefix = int(class_token) + int(distilled) + reg_tokens
    n_pos = sd["pos_embed"].shape[1] if has("pos_embed") else None
    if n_pos is None and family in ("sbb_rope", "rope_vit"):
        no_embed_class, grid = False, None  # rotary positions only: the image size comes from the registered model below
    elif n_pos is None:
        raise CheckpointError("this timm state dict has no learned position embeddings (pos_embed): its positions are rotary (a DINOv3 "
                              "or a RoPE ViT saved in vitfast's names) or none at all, which its keys cannot tell; pass "
                              '{"rope": "dinov3"} (a DINOv3) or {"rope": "axial"} (a RoPE ViT) in --config FILE.json (overrides= in '
                              "Python), or config= the model's config")  # fmt: skip
    elif _is_square(n_pos - prefix):
        no_embed_class, grid = False, math.isqrt(n_pos - prefix)
    elif _is_square(n_pos):
        no_embed_class, grid = True, math.isqrt(n_pos)
    else:
        raise CheckpointError(
            f"cannot infer the patch grid from pos_embed of length {n_pos} (not square); pass config= to load_checkpoint "
            "(CLI: --config FILE.json with img_size and the other fields)"
        )
    fc_norm, pre_norm = has("fc_norm.weight"), has("norm_pre.weight")
    # a norm with a weight and no bias is an RMSNorm (timm's vision_transformer.py builds no bias-free LayerNorm)
    rms = has("blocks.0.norm1.weight") and not has("blocks.0.norm1.bias")
    kind = "CLIP" if pre_norm else "AIMv2" if rms and has("patch_embed.norm.weight") else "ViT"
    if family != "eva02" and has("blocks.0.attn.norm.weight") and has("blocks.0.mlp.norm.weight"):
        kind = "BEiT-3"  # vision_transformer.py's only ViTs with a norm inside both branches
    fields: dict[str, Any] = dict(
        img_size=grid * patch if grid else None,
        abs_pos_embed=n_pos is not None,
        patch_size=patch,
        in_chans=in_chans,
        embed_dim=dim,
        depth=depth,
        **_timm_mlp(sd, dim),
        qkv_bias=has("blocks.0.attn.qkv.bias"),
        proj_bias=has("blocks.0.attn.proj.bias"),
        init_values=1e-6 if has("blocks.0.ls1.gamma") else None,  # the value is overwritten on load
        class_token=class_token,
        distilled=distilled,
        dist_head=_dist_head(sd),
        reg_tokens=reg_tokens,
        no_embed_class=no_embed_class,
        global_pool="avg" if family == "pe_spatial" else _timm_pool(sd, class_token, fc_norm, dim),  # no pool in PE's keys: timm's, said below
        fc_norm=fc_norm,
        final_norm=fc_norm or has("norm.weight"),  # RADIO and InternViT-300M end on the last block
        pre_norm=pre_norm,
        embed_norm=has("patch_embed.norm.weight"),
        scale_attn_norm=has("blocks.0.attn.norm.weight"),
        scale_mlp_norm=has("blocks.0.mlp.norm.weight"),
        norm_layer="rmsnorm" if rms else "layernorm",
        representation_size=sd["pre_logits.fc.weight"].shape[0] if has("pre_logits.fc.weight") else None,
        num_classes=sd["head.weight"].shape[0] if has("head.weight") else 0,
        norm_eps=norm_eps if norm_eps is not None else 1e-5 if kind != "ViT" else 1e-6,
        hybrid_layers=hybrid,
        # not stored in weights: timm's default for ViTs (broadcast to in_chans), or for CLIP towers and AIMv2, or BEiT-3's
        mean=_TIMM_MEAN_STD[kind][0] if in_chans == 3 else INCEPTION_MEAN,
        std=_TIMM_MEAN_STD[kind][1] if in_chans == 3 else INCEPTION_STD,
        **(dict(crop_pct=1.0) if kind in ("AIMv2", "BEiT-3") else {}),
    )
    pool_fc1 = sd.get("attn_pool.mlp.fc1.weight")
    if pool_fc1 is not None and pool_fc1.shape[0] != round(dim * fields["mlp_ratio"]):  # PE gigantic's pool MLP is narrower
        fields["attn_pool_mlp_ratio"] = pool_fc1.shape[0] / dim
    known = _registered_like(fields, family)
    name, entry = known[0] if known else (None, {})
    guesses: Guesses = {}
    if grid is None:
        fields["img_size"] = entry.get("img_size") or AXIAL_FAMILIES[family][1].get("img_size", 224)
        guesses["img_size"] = (f"rotary positions fit any image size and nothing in the weights states one; {fields['img_size']} px "
                               f"assumed, as {name or 'timm'} takes: pass --img-size N for another")  # fmt: skip
    if num_heads is not None:  # the caller knows it
        fields["num_heads"] = num_heads
    elif known:
        others = {n: r["num_heads"] for n, r in known if r["num_heads"] != entry["num_heads"]}
        fields["num_heads"] = entry["num_heads"]
        guesses["num_heads"] = f"num_heads cannot be read from weights; taken from {name}, the registered model of this width and depth"
        if others:
            other, heads = next(iter(others.items()))
            guesses["num_heads"] += f" ({other}, of the same shapes, has {heads}: pass --num-heads {heads} if it is one of those)"
    elif dim % 64 == 0:
        fields["num_heads"] = dim // 64
        guesses["num_heads"] = "num_heads cannot be read from weights; head_dim 64 assumed"
    else:
        raise CheckpointError(f"cannot infer num_heads for embed_dim {dim}; pass config= to load_checkpoint (CLI: --num-heads N)")
    guesses |= dict.fromkeys(PREPROCESSING_GUESSED, f"preprocessing is not stored in a state dict; timm's {kind} defaults assumed")
    if entry.get("rope") and family is None:  # e.g. an EVA-02 saved in vitfast's names: nothing in them says rotary
        fields |= {k: entry[k] for k in _AXIAL_FIELDS if k in entry}
        guesses["rope"] = (f"rotary positions are not stored in weights; {name}, the registered model of these shapes, has rope="
                           f"{entry['rope']!r}: pass {{\"rope\": null}} in --config FILE.json (overrides= in Python) if this one has none")
    elif family is None and (rotary := next((n for n, r in known if r.get("rope")), None)):  # e.g. DeiT-III beside Naver's RoPE-ViT
        guesses["rope"] = (f"rotary positions are not stored in weights; none assumed, as {name}, the registered model of these shapes, "
                           f"has none. {rotary}, of the same shapes, has them: pass {{\"rope\": \"axial\"}} in --config FILE.json "
                           "(overrides= in Python) if this is one of those")  # fmt: skip
    if no_embed_class and prefix and not any(r.get("no_embed_class") for _, r in known):
        # DeiT-III and register models leave their prefix tokens out of pos_embed; a non-square grid of
        # gh x gw patches with the class token embedded can have the same length (4 x 6 + 1 = 25)
        guesses["no_embed_class"] = (f"pos_embed of length {n_pos} read as a {grid}x{grid} grid without the prefix tokens, as "
                                     "DeiT-III and register models have it; if the grid is not square, pass --config FILE.json")
    # e.g. SigLIP so400m/14 at 384 px: 27 patches of 14 = 378, the last 6 px unseen; the weights cannot tell
    wider = [(n, r["img_size"]) for n, r in known if r["patch_size"] == patch and r["img_size"] // patch == grid != r["img_size"] / patch]
    if wider:
        other, size = wider[0]
        guesses["img_size"] = (f"{grid}x{grid} patches of {patch} px read from pos_embed; {other}, of the same shapes, takes "
                               f"{size} px images (the last {size - grid * patch} px unseen): pass --img-size {size} if it is that one")
    if pre_norm and norm_eps is None:
        guesses["norm_eps"] = "not stored in weights; 1e-5, as in every timm CLIP image tower, assumed"
    elif rms and norm_eps is None:
        source = "timm's AIMv2 (RMSNorm on the patch embeddings too)" if kind == "AIMv2" else "timm's RmsNorm default (AIMv2 has 1e-5)"
        guesses["norm_eps"] = f"RMSNorm eps is not stored in weights; {fields['norm_eps']:g}, as in {source}, assumed"
    if family == "pe_spatial":
        guesses["global_pool"] = ("not stored in weights, and this tower has no pool of its own: the mean of the patch tokens, unnormalised, "
                                  "as timm pools a Perception Encoder spatial tower, assumed (its features are its tokens: --global-pool none)")  # fmt: skip
    if pre_norm and family not in _PE_FAMILIES:  # a CLIP tower's caveat; every Perception Encoder tower has GELU
        guesses["act_layer"] = ("not stored in weights; GELU as in timm's *_clip_* models assumed. OpenAI's original "
                                "weights and others trained with QuickGELU (timm's *_clip_quickgelu_*) need act_layer='quick_gelu'")
    # SigLIP towers, attention-pooled or gap: timm builds some with the tanh GELU and others of the same shapes with erf
    elif fields["global_pool"] == "map" or any("siglip" in n for n, _ in known):
        fields["act_layer"] = entry.get("act_layer", "gelu")
        source = f"timm's {name}" if known else "timm's default"
        guesses["act_layer"] = (f"not stored in weights; {fields['act_layer']} as in {source} assumed. SigLIP was trained with the "
                                "tanh form (act_layer='gelu_tanh'), which timm gives some of its SigLIP names and not others")
    n = fields["num_classes"]
    tower = next((other for other, _ in known if head_is_embedding(other, n)), None)
    if tower is not None:  # an image-text tower's projection, or a classifier with as many classes: the weights cannot tell
        fields["embedding_head"] = True
        guesses["embedding_head"] = (f"not stored in weights; a head of {n} outputs on the shapes of {tower}, an image-text tower, read "
                                     f"as its image projection (an image embedding, CLIP's image_embeds), as timm's image-text weights "
                                     f"of it have it, not {n} classes: pass {{\"embedding_head\": false}} in --config FILE.json "
                                     "(overrides= in Python) if it is a classifier")  # fmt: skip
    return ViTConfig(**fields), guesses


_TIMM_MEAN_STD = {"ViT": (INCEPTION_MEAN, INCEPTION_STD), "CLIP": (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD), "AIMv2": (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
                  "BEiT-3": (IMAGENET_MEAN, IMAGENET_STD)}  # fmt: skip


def _timm_mlp(sd: StateDict, dim: int) -> dict[str, Any]:
    """The MLP kind and width: SwiGLU's gate and value Linears apart (fc1_g, fc1_x), or packed into one
    fc1 twice as wide as fc2's input (a GELU MLP's are equal)."""
    if "blocks.0.mlp.fc1_g.weight" in sd:
        return dict(mlp_layer="swiglu", act_layer="silu", mlp_ratio=sd["blocks.0.mlp.fc1_g.weight"].shape[0] / dim)
    if missing := [k for k in ("blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.weight") if k not in sd]:
        raise CheckpointError(f"this timm state dict lacks {' and '.join(missing)}, so its MLP cannot be read: the file may be "
                              "truncated or partial (re-download or re-save it)")  # fmt: skip
    fc1, fc2 = sd["blocks.0.mlp.fc1.weight"], sd["blocks.0.mlp.fc2.weight"]
    packed = dict(mlp_layer="swiglu_packed", act_layer="silu") if fc1.shape[0] == 2 * fc2.shape[1] else {}
    return dict(mlp_ratio=fc1.shape[0] / dim, **packed)


def _timm_pool(sd: StateDict, class_token: bool, fc_norm: bool, dim: int) -> str:
    """The pooling a timm-named state dict's keys and head width imply."""
    if "attn_pool.latent" in sd:
        return "map"
    if not class_token or fc_norm:
        return "avg"
    head = sd.get("pre_logits.fc.weight", sd.get("head.weight"))
    return "token_avg" if head is not None and head.shape[1] == 2 * dim else "token"


def _registered_like(fields: dict[str, Any], family: str | None) -> list[tuple[str, dict[str, Any]]]:
    """Registry entries with the shapes of `fields` (width, depth, tokens, stem, pooling, learned positions): named with
    `family` (such as "siglip"; for AXIAL_FAMILIES, its names) first, if given, then those of the same patch size,
    then image size.
    A "token_avg" head (no registered model has one) matches the class-token models it was trained on."""
    shape_keys = ("embed_dim", "depth", "class_token", "reg_tokens", "hybrid_layers", "pre_norm", "global_pool", "mlp_layer", "final_norm",
                  "norm_layer", "embed_norm", "scale_attn_norm", "scale_mlp_norm", "abs_pos_embed")
    default = {k: f.default for k, f in ViTConfig.__dataclass_fields__.items()}
    if fields["global_pool"] == "token_avg":
        fields = fields | {"global_pool": "token"}
    same = [(n, r) for n, r in _REGISTRY.items() if all(r.get(k, default[k]) == fields.get(k, default[k]) for k in shape_keys)]
    pattern = AXIAL_FAMILIES[family][0] if family in AXIAL_FAMILIES else f"*{family}*"
    return sorted(same, key=lambda item: (family is not None and not fnmatch.fnmatch(item[0], pattern),
                                          item[1]["patch_size"] != fields["patch_size"], item[1]["img_size"] != fields["img_size"]))  # fmt: skip


def read_timm_hub(cfg: dict[str, Any], sd: StateDict, where: object) -> tuple[StateDict, ViTConfig, Guesses]:
    """A timm Hub folder's config.json and weights (in any of timm's layouts) -> (vitfast's names, config, guesses).
    A registered rotary architecture says its weights are eva.py's (`timm_layout`)."""
    rope = _REGISTRY.get(str(cfg["architecture"]).split(".", 1)[0], {}).get("rope")
    sd, family = timm_layout(sd, where, rope=rope)
    vit_cfg, guesses = timm_hub_config(cfg, sd, family=family)
    return sd, vit_cfg, guesses


# timm's create_model arguments without a ViTConfig field that change nothing once the weights are loaded: regularisation
# (off in eval mode) and initialisation (the weights overwrite it)
_TIMM_TRAINING_ARGS = ("drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
                       "weight_init", "fix_init")  # fmt: skip
# ... and those that change nothing at timm's default, vitfast's model having only that form
_TIMM_DEFAULT_ARGS = {"qk_norm": False, "dynamic_img_pad": False}
_TIMM_POS_EMBED = {"learn": True, "none": False, "": False}  # timm's pos_embed -> abs_pos_embed


def _timm_model_args(model_args: dict[str, Any], arch: str) -> dict[str, Any]:
    """A timm Hub folder's `model_args` (timm's create_model arguments) as ViTConfig fields. One vitfast's model has no
    counterpart for is refused by name: building without it would run another model than timm's (pos_embed="none" would
    fail as a truncated checkpoint, dynamic_img_pad=True would refuse the inputs timm pads)."""
    args = {k: v for k, v in model_args.items()
            if k not in _TIMM_TRAINING_ARGS and not (k in _TIMM_DEFAULT_ARGS and v == _TIMM_DEFAULT_ARGS[k])}  # fmt: skip
    if args.get("pos_embed") in _TIMM_POS_EMBED:
        args["abs_pos_embed"] = _TIMM_POS_EMBED[args.pop("pos_embed")]
    if unknown := [f"{k}={v!r}" for k, v in args.items() if k not in ViTConfig.__dataclass_fields__]:
        raise ConfigError(f"this timm Hub folder's model_args give {arch} {', '.join(unknown)}, which vitfast's ViT does not "
                          "implement; it cannot be loaded as timm builds it")  # fmt: skip
    return args


def timm_hub_config(cfg: dict[str, Any], sd: StateDict, *, family: str | None = None) -> tuple[ViTConfig, Guesses]:
    """A `ViTConfig` from a timm Hub folder's config.json (as timm's `save_for_hf` writes it):
    the architecture from `architecture` (+ `model_args`), `num_classes`, preprocessing from
    `pretrained_cfg` (its input_size the image size unless model_args state one, as in timm's create_model; a
    disagreement is a guess), class names from `label_names`. An architecture vitfast has not registered
    is read off the weights' shapes instead (its head count then being a guess), as `family` says
    (see `timm_layout`, `timm_config`)."""
    arch = str(cfg["architecture"])
    if why := unsupported_reason(arch):  # its weights can look like a plain ViT's (ResPostBlock): never read them as one
        raise CheckpointError(f"this timm Hub folder holds {arch}: {why}, which vitfast's ViT does not implement")
    model_args = _timm_model_args(cfg.get("model_args") or {}, arch)
    try:
        base, guesses = get_config(arch, **model_args), {}
    except ConfigError:
        base, guesses = timm_config(sd, family)
        base = base.replace(**model_args)  # what the folder states (e.g. act_layer) is not a guess
        guesses = {k: v + f" ({arch!r} is not a registered vitfast model)" for k, v in guesses.items() if k not in model_args}
    pc = cfg.get("pretrained_cfg") or {}
    fields: dict[str, Any] = {}
    if "num_classes" in cfg:
        fields["num_classes"] = int(cfg["num_classes"])
    if isinstance(pc.get("input_size"), (list, tuple)) and len(pc["input_size"]) == 3:
        _, h, w = (int(v) for v in pc["input_size"])
        if "img_size" not in model_args:  # timm's create_model: model_args first, input_size only fills in an unset img_size
            fields["img_size"] = h if h == w else (h, w)
        elif base.img_hw != (h, w):  # timm's resolve_data_config preprocesses to input_size, which this model does not take
            other = f"--img-size {h} (img_size={h} in Python)" if h == w else f"img_size=({h}, {w}) in Python"
            guesses["img_size"] = (f"model_args build the model at {base.img_hw[0]}x{base.img_hw[1]} px, as timm's create_model does, "
                                   f"but pretrained_cfg's input_size is {h}x{w} px, the size timm's default transforms would feed it; "
                                   f"images are preprocessed to the model's size here. To run at the input_size (the position embeddings "
                                   f"resized), pass {other}")  # fmt: skip
    for key in ("mean", "std", "crop_pct"):
        if pc.get(key) is not None:
            fields[key] = pc[key]
            guesses.pop(key, None)
    if pc.get("interpolation") in INTERPOLATIONS:
        fields["interpolation"] = pc["interpolation"]
        guesses.pop("interpolation", None)
    elif "interpolation" in pc:
        guesses["interpolation"] = f"pretrained_cfg interpolation {pc['interpolation']!r} is not supported; {base.interpolation} used"
    mode = pc.get("crop_mode", "center")  # timm's data config takes "center" where pretrained_cfg has none
    if mode in CROP_MODES:
        fields["crop_mode"] = mode
        guesses.pop("crop_mode", None)
    else:
        guesses["crop_mode"] = f"pretrained_cfg crop_mode {mode!r} is not supported; 'center' used"
    names = cfg.get("label_names")
    if isinstance(names, dict):
        names = [names.get(str(i), names.get(i)) for i in range(len(names))]
    n_classes = fields.get("num_classes", base.num_classes)
    # an image-text tower's head is its image projection under timm's image-text tags (openai, laion2b, ...), a classifier
    # under its fine-tunes' (*_ft_in1k, ...); without a tag, a head as wide as the projection is the projection
    if embedding_width(arch):
        fields["embedding_head"] = head_is_embedding(arch, n_classes, pc.get("tag"))
        guesses.pop("embedding_head", None)
    if not base.replace(**fields).embedding_head and isinstance(names, (list, tuple)) and len(names) == n_classes and all(n is not None for n in names):
        fields["labels"] = tuple(str(n) for n in names)
    return base.replace(**fields), guesses


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n
