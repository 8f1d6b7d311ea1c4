"""Named model variants, under timm's names and with timm's default preprocessing.

`num_classes` follows the default pretrained tag timm picks for the name (0 where that tag is a
headless ImageNet-21k or DINO checkpoint). Where that tag is an image-text tower's (CLIP's, EVA-02 CLIP's, Perception
Encoder core's), the head is its image projection: `embedding_head=True`, the outputs an image embedding, not classes.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from typing import Any

from .config import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ViTConfig
from .errors import ConfigError
from .model import VisionTransformer

# (embed_dim, depth, num_heads) of the ViT paper / DeiT sizes.
SIZES = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
    "so400m": (1152, 27, 16),  # SigLIP's shape-optimised ViT (Alabdulmohsin et al. 2023), MLP 4304 wide
    "giantopt": (1536, 40, 16),
    "giant2": (1536, 40, 24),  # DINOv2's ViT-g/14 (timm names it "giant"; ViT-g of Zhai et al. is 1408 wide)
    "giant": (1408, 40, 16),  # ViT-g and ViT-G of Zhai et al. 2022 (EVA-CLIP, LAION's big CLIP towers)
    "gigantic": (1664, 48, 16),
    # timm's "searching for better baselines" sizes (Wightman 2024) and the ViT+ of Beyer et al.
    "xsmall": (256, 10, 4),
    "wee": (256, 14, 4),
    "little": (320, 14, 5),
    "medium": (512, 12, 8),
    "mediumd": (512, 20, 8),
    "betwixt": (640, 12, 10),
    "base_plus": (896, 12, 14),
    "so150m": (896, 18, 14),
    "so150m2": (832, 21, 13),
}
# MLP width / embed_dim where it is not 4: the ratios give timm's int(embed_dim * mlp_ratio)
MLP_RATIOS = {"so400m": 3.7362, "giant": 6144 / 1408, "gigantic": 8192 / 1664, "wee": 5.0, "little": 5.6, "so150m": 2304 / 896,
              "so150m2": 2176 / 832}  # fmt: skip


def _vit(size: str, patch: int, img: int, **kw: Any) -> dict[str, Any]:
    dim, depth, heads = SIZES[size]
    crop = 1.0 if img >= 384 else 0.9
    mlp = MLP_RATIOS.get(size, 4.0)
    return dict(img_size=img, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=mlp, crop_pct=crop) | kw


def _siglip(
    size: str, patch: int, imgs: tuple[int, ...], *, gap: bool = False, tanh: bool = False, crop_pct: float = 0.9
) -> dict[str, dict[str, Any]]:
    """timm's SigLIP image towers at each size: no class token, the attention-pool head ("map") or,
    for `_gap`, the mean of the tokens after the final norm; features only (no classifier)."""
    pool = dict(global_pool="avg", fc_norm=False) if gap else dict(global_pool="map")
    act = dict(act_layer="gelu_tanh") if tanh else {}
    return {
        f"vit_{size}_patch{patch}_siglip{'_gap' if gap else ''}_{img}": _vit(
            size, patch, img, class_token=False, num_classes=0, crop_pct=crop_pct, **pool, **act
        )
        for img in imgs
    }


_DEIT = dict(mean=IMAGENET_MEAN, std=IMAGENET_STD)
_DEIT3 = dict(init_values=1e-6, no_embed_class=True, **_DEIT)
# CLIP image towers: LayerNorm (eps 1e-5) before the blocks, no patch bias; OpenAI's normalisation
_CLIP = dict(pre_norm=True, norm_eps=1e-5, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
_CLIP_INCEPTION = dict(_CLIP, mean=INCEPTION_MEAN, std=INCEPTION_STD)  # LAION ViT-L/14 fine-tunes, as timm tags them
_QUICK = dict(_CLIP, act_layer="quick_gelu", crop_pct=1.0)
_DINOV2 = dict(init_values=1e-5, num_classes=0, crop_pct=1.0, **_DEIT)
_REG4 = dict(reg_tokens=4, no_embed_class=True)
# timm's sbb models: register tokens and average pooling, layer scale, [-1, 1] normalisation, crop 0.95
_SBB_REG = dict(init_values=1e-5, class_token=False, no_embed_class=True, global_pool="avg", crop_pct=0.95)
# ... and their older no-register form: no qkv bias, no norm after pooling
_SBB_GAP = dict(init_values=1e-6, class_token=False, qkv_bias=False, global_pool="avg", fc_norm=False, crop_pct=0.95)
# timm's CLIP towers trained as image-text encoders (their default tags are image embeddings)
_CLIP_EMBED = dict(_CLIP, crop_pct=1.0)
# TIPSv2 (Google): one register, layer scale starting at 1, unnormalised [0, 1] pixels, 448 px features
_TIPS = dict(reg_tokens=1, no_embed_class=True, init_values=1.0, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), crop_pct=1.0, num_classes=0)
# C-RADIO (NVIDIA) as timm ports it: registers, no norm after the blocks, 512 px features
_RADIO = dict(no_embed_class=True, final_norm=False, crop_pct=1.0, num_classes=0, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
# DINOv2's giant: SwiGLU of width (int(4C * 2/3) + 7) // 8 * 8 = 4096, packed into one 8192-wide fc1 (timm's mlp_ratio)
_SWIGLU = dict(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=2.66667 * 2)
# Apple's AIMv2 (Fini et al. 2024): RMSNorm everywhere (eps 1e-5) incl. on the patch embeddings, SwiGLU with the gate
# and value Linears apart, no biases but the patch projection's; the mean of the normalised tokens; features only.
# (embed_dim, num_heads, mlp_ratio) per size, all 24 blocks of 14 px patches
_AIMV2_SIZES = {"large": (1024, 8, 2.75), "huge": (1536, 12, 2.6667), "1b": (2048, 16, 2.75), "3b": (3072, 24, 2.6667)}
_AIMV2 = dict(patch_size=14, depth=24, class_token=False, global_pool="avg", fc_norm=False, qkv_bias=False, proj_bias=False,
              norm_layer="rmsnorm", embed_norm=True, norm_eps=1e-5, mlp_layer="swiglu", act_layer="silu", num_classes=0,
              crop_pct=1.0, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)  # fmt: skip

# timm's DINOv3 (eva.py; Simeoni et al. 2025): 2-D rotary positions, no learned ones, 4 registers, layer scale; timm pools
# the mean patch token (DINOv3's own features are the class token: global_pool="token"). "_qkvb": with a qkv bias.
# size: (embed_dim, depth, num_heads, mlp_ratio, SwiGLU)
_DINOV3_SIZES = {"tiny": (192, 12, 3, 4.0, False), "small": (384, 12, 6, 4.0, False), "small_plus": (384, 12, 6, 4.0, True),
                 "base": (768, 12, 12, 4.0, False), "large": (1024, 24, 16, 4.0, False), "huge_plus": (1280, 32, 20, 4.0, True),
                 "7b": (4096, 40, 32, 2.0, True)}  # fmt: skip
_DINOV3 = dict(img_size=256, patch_size=16, abs_pos_embed=False, rope="dinov3", rope_theta=100.0, reg_tokens=4, init_values=1e-5,
               global_pool="avg", fc_norm=False, norm_eps=1e-5, num_classes=0, crop_pct=1.0, mean=IMAGENET_MEAN, std=IMAGENET_STD)  # fmt: skip


# EVA-02 (Fang et al. 2023; timm's eva.py): learned position embeddings and 2-D axial rotary ones (patch indices scaled to
# the 16x16 grid of its 224 px pre-training, base 10000, pairs rotated together), SwiGLU of width int(8C / 3) (packed
# for Ti/S; B/L with the gate and value Linears apart and a LayerNorm before fc2), average pooling, CLIP's mean/std.
# The CLIP towers pool the class token into a projection and add a LayerNorm before the attention's output projection.
_EVA02 = dict(patch_size=14, rope="axial", rope_ref_grid=(16, 16), global_pool="avg", mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)


def _eva02(size: str, img: int, num_classes: int, **kw: Any) -> dict[str, Any]:
    dim, depth, heads = SIZES[size]
    hidden = int(dim * 8 / 3)
    if size in ("tiny", "small"):  # timm's GluMlp gating with the first half: vitfast's swiglu_packed
        mlp = dict(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=2 * hidden / dim)
    else:
        mlp = dict(mlp_layer="swiglu", act_layer="silu", mlp_ratio=hidden / dim, scale_mlp_norm=True)
    crop = dict(crop_pct=0.9) if img == 224 else dict(crop_pct=1.0, crop_mode="squash" if img == 448 else "center")
    return _EVA02 | dict(img_size=img, embed_dim=dim, depth=depth, num_heads=heads, num_classes=num_classes) | mlp | crop | kw


_EVA02_CLIP = dict(global_pool="token", scale_attn_norm=True, embedding_head=True)
# timm's sbb ViTs with EVA-02's axial rotary positions in place of learned ones (eva.py: *_rope_reg*_gap_256)
_SBB_ROPE = dict(_SBB_REG, no_embed_class=False, abs_pos_embed=False, rope="axial", rope_ref_grid=(16, 16))
# Naver's RoPE-ViT (Heo et al. 2024; timm's eva.py vit_*_patch16_rope[_ape]_224): DeiT-III's ViT with axial rotary
# positions on the patch indices (no reference grid), base 100, x's frequencies first; "_ape" keeps DeiT-III's learned
# position embeddings beside them (patches only)
_ROPE_VIT = dict(init_values=1e-5, abs_pos_embed=False, rope="axial", rope_theta=100.0, rope_grid_indexing="xy", **_DEIT)
# Meta's Perception Encoder towers (Bolya et al. 2025; timm's eva.py vit_pe_*): a CLIP tower (pre-norm, eps 1e-5) with axial
# rotary positions beside its learned ones (patch index + 1 scaled to the reference grid, x's frequencies first: the class
# token, not rotated, sees every patch at an absolute angle); crop 1.0, [-1, 1] pixels
_PE = dict(pre_norm=True, norm_eps=1e-5, rope="axial", rope_grid_offset=1.0, rope_grid_indexing="xy", crop_pct=1.0, mean=INCEPTION_MEAN,
           std=INCEPTION_STD)  # fmt: skip
# The core towers (vit_pe_core_*) end on a final norm and an 8-head attention pool that reads the class token too, into the
# image embedding (the head)
_PE_CORE = dict(_PE, global_pool="map", pool_include_prefix=True, attn_pool_num_heads=8)
# The spatial towers (vit_pe_spatial_*) end on their last block: no final norm, no pool of their own, their tokens the
# features (for dense prediction). timm pools the plain mean of the patch tokens (eva.py's default "avg", no fc_norm);
# reference grid 32x32 (512 px of 16, 448 px of 14); features only
_PE_SPATIAL = dict(_PE, rope_ref_grid=(32, 32), global_pool="avg", fc_norm=False, final_norm=False, num_classes=0)
# The gigantic towers' shapes (core, spatial, language): /14 at 448 px, 1536 wide, no class token (so no index offset)
_PE_GIGANTIC = dict(img_size=448, patch_size=14, embed_dim=1536, depth=50, num_heads=16, mlp_ratio=8960 / 1536, class_token=False,
                    rope_grid_offset=0.0, rope_ref_grid=(32, 32))  # fmt: skip


def _pe_core(size: str, patch: int, img: int, ref: int, embed: int, **kw: Any) -> dict[str, Any]:
    return _vit(size, patch, img, **_PE_CORE, rope_ref_grid=(ref, ref), num_classes=embed, embedding_head=True) | kw
# BEiT-3's image tower (Wang et al. 2022) as timm remaps it: a ViT with a LayerNorm inside each branch (eps 1e-5)
_BEIT3 = dict(scale_attn_norm=True, scale_mlp_norm=True, global_pool="avg", norm_eps=1e-5, crop_pct=1.0, mean=IMAGENET_MEAN, std=IMAGENET_STD)


def _dinov3(size: str, qkv_bias: bool) -> dict[str, Any]:
    dim, depth, heads, ratio, swiglu = _DINOV3_SIZES[size]
    mlp = dict(mlp_layer="swiglu", act_layer="silu") if swiglu else {}
    return dict(_DINOV3, embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=ratio, qkv_bias=qkv_bias, **mlp)


_REGISTRY: dict[str, dict[str, Any]] = {
    # ViT (Dosovitskiy et al.), timm's augreg / original weights
    "vit_tiny_patch16_224": _vit("tiny", 16, 224),
    "vit_tiny_patch16_384": _vit("tiny", 16, 384),
    "vit_small_patch32_224": _vit("small", 32, 224),
    "vit_small_patch32_384": _vit("small", 32, 384),
    "vit_small_patch16_224": _vit("small", 16, 224),
    "vit_small_patch16_384": _vit("small", 16, 384),
    "vit_small_patch8_224": _vit("small", 8, 224, num_classes=0, **_DEIT),  # DINO weights
    "vit_base_patch32_224": _vit("base", 32, 224),
    "vit_base_patch32_384": _vit("base", 32, 384),
    "vit_base_patch16_224": _vit("base", 16, 224),
    "vit_base_patch16_384": _vit("base", 16, 384),
    "vit_base_patch8_224": _vit("base", 8, 224),
    "vit_large_patch32_224": _vit("large", 32, 224, num_classes=0),
    "vit_large_patch32_384": _vit("large", 32, 384),
    "vit_large_patch16_224": _vit("large", 16, 224),
    "vit_large_patch16_384": _vit("large", 16, 384),
    "vit_large_patch14_224": _vit("large", 14, 224),
    "vit_huge_patch14_224": _vit("huge", 14, 224, num_classes=0),
    # global average pooling, register tokens (Darcet et al. 2023)
    "vit_base_patch16_gap_224": _vit("base", 16, 224, num_heads=16, class_token=False, global_pool="avg", fc_norm=False),
    "vit_base_patch16_reg4_gap_256": _vit(
        "base", 16, 256, class_token=False, global_pool="avg", reg_tokens=4, no_embed_class=True
    ),
    # DeiT (Touvron et al. 2021), with and without the distillation token
    "deit_tiny_patch16_224": _vit("tiny", 16, 224, **_DEIT),
    "deit_small_patch16_224": _vit("small", 16, 224, **_DEIT),
    "deit_base_patch16_224": _vit("base", 16, 224, **_DEIT),
    "deit_base_patch16_384": _vit("base", 16, 384, **_DEIT),
    "deit_tiny_distilled_patch16_224": _vit("tiny", 16, 224, distilled=True, **_DEIT),
    "deit_small_distilled_patch16_224": _vit("small", 16, 224, distilled=True, **_DEIT),
    "deit_base_distilled_patch16_224": _vit("base", 16, 224, distilled=True, **_DEIT),
    "deit_base_distilled_patch16_384": _vit("base", 16, 384, distilled=True, **_DEIT),
    # DeiT-III: layer scale, position embeddings on patches only
    "deit3_small_patch16_224": _vit("small", 16, 224, **_DEIT3),
    "deit3_small_patch16_384": _vit("small", 16, 384, **_DEIT3),
    "deit3_base_patch16_224": _vit("base", 16, 224, **_DEIT3),
    "deit3_base_patch16_384": _vit("base", 16, 384, **_DEIT3),
    "deit3_large_patch16_224": _vit("large", 16, 224, **_DEIT3),
    "deit3_large_patch16_384": _vit("large", 16, 384, **_DEIT3),
    # hybrids: ResNet-v2 (BiT) stem, stride 16 or 32, tokens from its last stage; R+Ti: the stem alone (stride 4), 8x8 patches
    "vit_tiny_r_s16_p8_224": _vit("tiny", 32, 224, hybrid_layers=()),
    "vit_tiny_r_s16_p8_384": _vit("tiny", 32, 384, hybrid_layers=()),
    "vit_base_r50_s16_224": _vit("base", 16, 224, hybrid_layers=(3, 4, 9), num_classes=0),
    "vit_base_r50_s16_384": _vit("base", 16, 384, hybrid_layers=(3, 4, 9)),
    "vit_small_r26_s32_224": _vit("small", 32, 224, hybrid_layers=(2, 2, 2, 2)),
    "vit_small_r26_s32_384": _vit("small", 32, 384, hybrid_layers=(2, 2, 2, 2)),
    "vit_large_r50_s32_224": _vit("large", 32, 224, hybrid_layers=(3, 4, 6, 3)),
    "vit_large_r50_s32_384": _vit("large", 32, 384, hybrid_layers=(3, 4, 6, 3)),
    # CLIP image towers (Radford et al. 2021) as timm has them; without a quickgelu in the name, the
    # default tags are LAION / OpenAI weights fine-tuned on ImageNet with GELU
    "vit_base_patch32_clip_224": _vit("base", 32, 224, **_CLIP),
    "vit_base_patch32_clip_384": _vit("base", 32, 384, **_CLIP),
    "vit_base_patch32_clip_448": _vit("base", 32, 448, **_CLIP),
    "vit_base_patch16_clip_224": _vit("base", 16, 224, **_CLIP, crop_pct=0.95),
    "vit_base_patch16_clip_384": _vit("base", 16, 384, **_CLIP, crop_mode="squash"),
    "vit_large_patch14_clip_224": _vit("large", 14, 224, **_CLIP_INCEPTION, crop_pct=1.0),
    "vit_large_patch14_clip_336": _vit("large", 14, 336, **_CLIP_INCEPTION, crop_pct=1.0, crop_mode="squash"),
    "vit_huge_patch14_clip_224": _vit("huge", 14, 224, **_CLIP, crop_pct=1.0),
    "vit_huge_patch14_clip_336": _vit("huge", 14, 336, **_CLIP, crop_pct=1.0, crop_mode="squash"),
    # ... and with QuickGELU, as OpenAI (and DFN, MetaCLIP) trained them: image embeddings, no classifier
    "vit_base_patch32_clip_quickgelu_224": _vit("base", 32, 224, **dict(_QUICK, crop_pct=0.9), embedding_head=True, num_classes=512),
    "vit_base_patch16_clip_quickgelu_224": _vit("base", 16, 224, **_QUICK, embedding_head=True, num_classes=512),
    "vit_large_patch14_clip_quickgelu_224": _vit("large", 14, 224, **_QUICK, embedding_head=True, num_classes=768),
    "vit_large_patch14_clip_quickgelu_336": _vit("large", 14, 336, **_QUICK, embedding_head=True, num_classes=768),
    "vit_huge_patch14_clip_quickgelu_224": _vit("huge", 14, 224, **_QUICK, embedding_head=True, num_classes=1024),
    "vit_huge_patch14_clip_quickgelu_378": _vit("huge", 14, 378, **_QUICK, embedding_head=True, num_classes=1024),
    # DINOv2 (Oquab et al. 2023) features at 518x518, layer scale; reg4: with 4 registers
    "vit_small_patch14_dinov2": _vit("small", 14, 518, **_DINOV2),
    "vit_base_patch14_dinov2": _vit("base", 14, 518, **_DINOV2),
    "vit_large_patch14_dinov2": _vit("large", 14, 518, **_DINOV2),
    "vit_small_patch14_reg4_dinov2": _vit("small", 14, 518, **_DINOV2, **_REG4),
    "vit_base_patch14_reg4_dinov2": _vit("base", 14, 518, **_DINOV2, **_REG4),
    "vit_large_patch14_reg4_dinov2": _vit("large", 14, 518, **_DINOV2, **_REG4),
    "vit_giant_patch14_dinov2": _vit("giant2", 14, 518, **_DINOV2, **_SWIGLU),
    "vit_giant_patch14_reg4_dinov2": _vit("giant2", 14, 518, **_DINOV2, **_REG4, **_SWIGLU),
    # SigLIP image towers (Zhai et al. 2023, SigLIP 2 2025): the same architecture for v1 and v2 tags;
    # timm gives some the tanh GELU (as trained) and keeps the erf form for others
    **_siglip("base", 32, (256,), tanh=True),
    **_siglip("base", 16, (224, 256, 384, 512)),
    **_siglip("large", 16, (256, 384)),
    **_siglip("large", 16, (512,), tanh=True),
    **_siglip("so400m", 14, (224, 378, 384)),  # at 384 px the 27 x 27 patches see 378 of them, as in timm and HF
    **_siglip("so400m", 16, (256, 384, 512), tanh=True),
    **_siglip("giantopt", 16, (256, 384), tanh=True),
    # ... and the same towers pooled by the mean of their tokens (PaliGemma's image encoders among them)
    **_siglip("base", 32, (256,), gap=True, tanh=True),
    **_siglip("base", 16, (224, 256, 384, 512), gap=True),
    **_siglip("large", 16, (256, 384), gap=True),
    **_siglip("large", 16, (512,), gap=True, tanh=True),
    **_siglip("so400m", 14, (224, 378), gap=True),
    **_siglip("so400m", 14, (384, 448, 896), gap=True, crop_pct=1.0),  # 448, 896: PaliGemma's encoders
    **_siglip("so400m", 16, (256, 384, 512), gap=True, tanh=True),
    **_siglip("giantopt", 16, (256, 384), gap=True, tanh=True),
    # timm's "searching for better baselines" (sbb) ViTs: register tokens, average pooling; and the ViT+ sizes
    "vit_wee_patch16_reg1_gap_256": _vit("wee", 16, 256, reg_tokens=1, **_SBB_REG),
    "vit_little_patch16_reg1_gap_256": _vit("little", 16, 256, reg_tokens=1, **_SBB_REG),
    "vit_little_patch16_reg4_gap_256": _vit("little", 16, 256, reg_tokens=4, **_SBB_REG),
    "vit_medium_patch16_reg1_gap_256": _vit("medium", 16, 256, reg_tokens=1, **_SBB_REG),
    "vit_medium_patch16_reg4_gap_256": _vit("medium", 16, 256, reg_tokens=4, **_SBB_REG),
    "vit_mediumd_patch16_reg4_gap_256": _vit("mediumd", 16, 256, reg_tokens=4, **_SBB_REG),
    "vit_mediumd_patch16_reg4_gap_384": _vit("mediumd", 16, 384, reg_tokens=4, **dict(_SBB_REG, crop_pct=1.0)),
    "vit_betwixt_patch16_reg1_gap_256": _vit("betwixt", 16, 256, reg_tokens=1, **_SBB_REG),
    "vit_betwixt_patch16_reg4_gap_256": _vit("betwixt", 16, 256, reg_tokens=4, **_SBB_REG),
    "vit_betwixt_patch16_reg4_gap_384": _vit("betwixt", 16, 384, reg_tokens=4, **dict(_SBB_REG, crop_pct=1.0)),
    "vit_medium_patch16_gap_240": _vit("medium", 16, 240, num_classes=11821, **_SBB_GAP),  # ImageNet-12k head
    "vit_medium_patch16_gap_256": _vit("medium", 16, 256, **_SBB_GAP),
    "vit_medium_patch16_gap_384": _vit("medium", 16, 384, crop_mode="squash", **_SBB_GAP),
    "vit_betwixt_patch16_gap_256": _vit("betwixt", 16, 256, **_SBB_GAP),
    "vit_so150m_patch16_reg4_gap_256": _vit("so150m", 16, 256, class_token=False, reg_tokens=4, global_pool="avg", fc_norm=False, crop_pct=0.95),
    "vit_so150m_patch16_reg4_gap_384": _vit("so150m", 16, 384, class_token=False, reg_tokens=4, global_pool="avg", fc_norm=False, crop_pct=1.0),
    "vit_so150m_patch16_reg4_map_256": _vit("so150m", 16, 256, class_token=False, reg_tokens=4, global_pool="map"),
    **{f"vit_so150m2_patch16_reg1_gap_{img}": _vit("so150m2", 16, img, class_token=False, reg_tokens=1, global_pool="avg", qkv_bias=False,
                                                    init_values=1e-5, crop_pct=1.0, crop_mode="squash" if img == 448 else "center")
       for img in (256, 384, 448)},
    "vit_base_patch16_plus_240": _vit("base_plus", 16, 240, init_values=1e-5, crop_pct=0.95),
    "vit_base_patch32_plus_256": _vit("base_plus", 32, 256, init_values=1e-5, crop_pct=0.95),
    "vit_small_patch16_36x1_224": _vit("small", 16, 224, depth=36, init_values=1e-5),
    # big plain ViTs: ViT-H, and ViT-g / ViT-G of Zhai et al. 2022, some as average-pooled feature towers
    "vit_huge_patch14_gap_224": _vit("huge", 14, 224, class_token=False, global_pool="avg", fc_norm=False, num_classes=0, **_DEIT),
    "vit_huge_patch16_gap_448": _vit("huge", 16, 448, class_token=False, global_pool="avg", fc_norm=False, num_classes=0, **_DEIT),
    "vit_giant_patch14_224": _vit("giant", 14, 224),
    "vit_giant_patch16_gap_224": _vit("giant", 16, 224, class_token=False, global_pool="avg", fc_norm=False, num_classes=0, crop_pct=0.9, **_DEIT),
    "vit_gigantic_patch14_224": _vit("gigantic", 14, 224),
    # ImageNet-21k MIIL weights: no qkv bias, unnormalised pixels, bilinear
    "vit_base_patch16_224_miil": _vit("base", 16, 224, qkv_bias=False, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), crop_pct=0.875,
                                      interpolation="bilinear", num_classes=11221),
    # EVA-01's ViT-L/14 fine-tunes (class token kept, average pooling), FlexiViT at its 240 px default
    "eva_large_patch14_196": _vit("large", 14, 196, global_pool="avg", crop_pct=1.0, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD),
    "eva_large_patch14_336": _vit("large", 14, 336, global_pool="avg", crop_pct=1.0, crop_mode="squash", mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD),
    "flexivit_small": _vit("small", 16, 240, no_embed_class=True, crop_pct=0.95),
    "flexivit_base": _vit("base", 16, 240, no_embed_class=True, crop_pct=0.95),
    "flexivit_large": _vit("large", 16, 240, no_embed_class=True, crop_pct=0.95),
    # more CLIP image towers (LAION, DataComp, MetaCLIP sizes): image embeddings
    "vit_xsmall_patch16_clip_224": _vit("xsmall", 16, 224, **_CLIP, embedding_head=True, num_classes=512),
    "vit_medium_patch16_clip_224": _vit("medium", 16, 224, **_CLIP, embedding_head=True, num_classes=512),
    "vit_medium_patch32_clip_224": _vit("medium", 32, 224, **_CLIP, embedding_head=True, num_classes=512),
    "vit_betwixt_patch32_clip_224": _vit("betwixt", 32, 224, **_CLIP, embedding_head=True, num_classes=512),
    "vit_base_patch32_clip_256": _vit("base", 32, 256, **_CLIP_EMBED, embedding_head=True, num_classes=512),
    "vit_base_patch16_plus_clip_240": _vit("base_plus", 16, 240, **_CLIP_EMBED, embedding_head=True, num_classes=640),
    "vit_huge_patch14_clip_378": _vit("huge", 14, 378, **_CLIP_EMBED, embedding_head=True, num_classes=1024),
    "vit_giant_patch14_clip_224": _vit("giant", 14, 224, **_CLIP_EMBED, embedding_head=True, num_classes=1024),
    "vit_gigantic_patch14_clip_224": _vit("gigantic", 14, 224, **_CLIP_EMBED, embedding_head=True, num_classes=1280),
    "vit_gigantic_patch14_clip_378": _vit("gigantic", 14, 378, **_CLIP_EMBED, crop_mode="squash", embedding_head=True, num_classes=1280),
    "vit_gigantic_patch14_clip_quickgelu_224": _vit("gigantic", 14, 224, **_QUICK, embedding_head=True, num_classes=1280),
    # TIPSv2 image towers
    "vit_base_patch14_reg1_tipsv2": _vit("base", 14, 448, **_TIPS),
    "vit_large_patch14_reg1_tipsv2": _vit("large", 14, 448, **_TIPS),
    "vit_so400m_patch14_reg1_tipsv2": _vit("so400m", 14, 448, **_TIPS),
    "vit_giant_patch14_reg1_tipsv2": _vit("giant2", 14, 448, **_TIPS, **_SWIGLU),
    # RADIO v3 / v4 and InternViT-300M: features of the last block, no final norm
    "vit_base_patch16_radio_v3": _vit("base", 16, 512, reg_tokens=7, init_values=1e-5, **_RADIO),
    "vit_large_patch16_radio_v3": _vit("large", 16, 512, reg_tokens=7, init_values=1e-5, **_RADIO),
    "vit_huge_patch16_radio_v3": _vit("huge", 16, 512, reg_tokens=7, **_RADIO),
    "vit_giant_patch16_radio_v3": _vit("giant2", 16, 512, reg_tokens=7, **_RADIO),
    "vit_huge_patch16_radio_v4": _vit("huge", 16, 512, reg_tokens=9, **_RADIO),
    "vit_so400m_patch16_radio_v4": _vit("so400m", 16, 512, reg_tokens=9, **_RADIO),
    "vit_intern300m_patch14_448": _vit("large", 14, 448, init_values=0.1, final_norm=False, crop_pct=1.0, num_classes=0, **_DEIT),
    **{f"aimv2_{size}_patch14_{img}": dict(_AIMV2, img_size=img, embed_dim=dim, num_heads=heads, mlp_ratio=ratio)
       for size, (dim, heads, ratio) in _AIMV2_SIZES.items() for img in (224, 336, 448)},
    **{f"vit_{size}_patch16_dinov3{tag}": _dinov3(size, qkv_bias=bool(tag))
       for size in _DINOV3_SIZES for tag in ("", "_qkvb") if (size, tag) not in (("tiny", ""), ("7b", "_qkvb"))},
    **{f"eva02_{size}_patch14_224": _eva02(size, 224, 0) for size in ("tiny", "small", "base", "large")},  # MIM pre-trained
    "eva02_tiny_patch14_336": _eva02("tiny", 336, 1000),
    "eva02_small_patch14_336": _eva02("small", 336, 1000),
    "eva02_base_patch14_448": _eva02("base", 448, 1000),
    "eva02_large_patch14_448": _eva02("large", 448, 1000),
    "eva02_base_patch16_clip_224": _eva02("base", 224, 512, patch_size=16, **_EVA02_CLIP),  # image embeddings (EVA-CLIP)
    "eva02_large_patch14_clip_224": _eva02("large", 224, 768, **_EVA02_CLIP),
    "eva02_large_patch14_clip_336": _eva02("large", 336, 768, **_EVA02_CLIP),
    **{f"vit_{size}_patch16_rope_reg{regs}_gap_256": _vit(size, 16, 256, reg_tokens=regs, qkv_bias=size != "mediumd", **_SBB_ROPE, **pixels)
       for size, regs, pixels in (("medium", 1, {}), ("mediumd", 1, {}), ("betwixt", 4, dict(mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)),
                                  ("base", 1, {}))},  # timm gives the betwixt one eva.py's default (CLIP's) mean/std
    **{f"vit_{size}_patch16_rope_224": _vit(size, 16, 224, **_ROPE_VIT) for size in ("small", "base", "large")},
    **{f"vit_{size}_patch16_rope_ape_224": _vit(size, 16, 224, **dict(_ROPE_VIT, abs_pos_embed=True, no_embed_class=True))
       for size in ("small", "base", "large")},
    "vit_pe_core_tiny_patch16_384": _pe_core("tiny", 16, 384, 24, 512),
    "vit_pe_core_small_patch16_384": _pe_core("small", 16, 384, 24, 512),
    "vit_pe_core_base_patch16_224": _pe_core("base", 16, 224, 14, 1024),
    "vit_pe_core_large_patch14_336": _pe_core("large", 14, 336, 24, 1024),
    # its pool MLP narrower than its blocks'
    "vit_pe_core_gigantic_patch14_448": dict(_PE_CORE, **_PE_GIGANTIC, attn_pool_mlp_ratio=4.0, num_classes=1280, embedding_head=True),
    **{f"vit_pe_spatial_{size}_patch{patch}_{img}": _vit(size, patch, img, **_PE_SPATIAL)
       for size, patch, img in (("tiny", 16, 512), ("small", 16, 512), ("base", 16, 512), ("large", 14, 448))},
    "vit_pe_spatial_gigantic_patch14_448": dict(_PE_SPATIAL, **_PE_GIGANTIC, init_values=0.1),
    # the language towers (the image side of PE's language-model alignment) are built alike, with layer scale
    "vit_pe_lang_large_patch14_448": _vit("large", 14, 448, **_PE_SPATIAL) | dict(depth=23, init_values=0.1),
    "vit_pe_lang_gigantic_patch14_448": dict(_PE_SPATIAL, **_PE_GIGANTIC | dict(depth=47), init_values=0.1),
    "beit3_base_patch16_224": _vit("base", 16, 224, **_BEIT3),
    "beit3_large_patch16_224": _vit("large", 16, 224, **_BEIT3),
    "beit3_giant_patch14_224": _vit("giant", 14, 224, **_BEIT3),
    "beit3_giant_patch14_336": _vit("giant", 14, 336, **_BEIT3),
    # CIFAR-sized model for tests, demos and quick experiments (not a timm name)
    "vit_cifar_patch4_32": dict(
        img_size=32, patch_size=4, embed_dim=48, depth=4, num_heads=4, mlp_ratio=4.0, num_classes=10,
        act_layer="gelu_tanh", mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616), crop_pct=1.0,
    ),
}  # fmt: skip


# timm's CLIP towers whose default tag is an ImageNet fine-tune (a classifier): the width of the image projection (CLIP's
# image_embeds) that their image-text tags (openai, laion2b, laion400m_e32, datacompxl, dfn2b, metaclip_*, ...) carry as
# the head instead. The towers whose default tag is image-text have it as their registered num_classes (embedding_head)
_CLIP_PROJECTION = {"vit_base_patch32_clip_224": 512, "vit_base_patch32_clip_384": 512, "vit_base_patch32_clip_448": 512,
                    "vit_base_patch16_clip_224": 512, "vit_base_patch16_clip_384": 512, "vit_large_patch14_clip_224": 768,
                    "vit_large_patch14_clip_336": 768, "vit_huge_patch14_clip_224": 1024, "vit_huge_patch14_clip_336": 1024}  # fmt: skip
# timm's tags of fine-tuned weights (openai_ft_in12k_in1k, laion2b_ft_in1k, in22k_ft_in1k, ...): their heads classify
_FINE_TUNE_TAG = re.compile(r"(^|_)ft(_|$)|in1k|in12k|in21k|in22k")


def embedding_width(name: str) -> int | None:
    """The width of the image projection that timm's image-text weights of the registered tower `name` (a tag after a
    dot ignored) carry as their head, an image embedding (CLIP's image_embeds); None for a model that is no such tower."""
    base = name.split(".", 1)[0]
    entry = _REGISTRY.get(base, {})
    return entry["num_classes"] if entry.get("embedding_head") else _CLIP_PROJECTION.get(base)


def head_is_embedding(name: str, num_classes: int, tag: str | None = None) -> bool:
    """Whether timm's weights of `name` with a `num_classes`-wide head and pretrained `tag` (None: not said) hold an image
    projection rather than a classifier: a tower with one (`embedding_width`), under an image-text tag (not a fine-tune),
    or without a tag, a head of the projection's width."""
    width = embedding_width(name)
    if width is None or not num_classes:
        return False
    return not _FINE_TUNE_TAG.search(tag) if tag else num_classes == width


# timm vision_transformer.py names whose blocks vitfast does not implement, and why (first match wins)
_UNSUPPORTED = (
    ("vit_*_rpn_*", "its blocks normalise after each residual branch, not before (timm's ResPostBlock)"),
    ("vit_*_18x2_*", "its blocks run two attention and two MLP branches in parallel (timm's ParallelThingsBlock)"),
    ("vit_*_xp_*", "its blocks run attention and MLP in parallel from one fused projection, with RMSNorm and qk-norm "
                   "(timm's ParallelScalingBlock)"),
    ("vit_*pwee_*", "its blocks run attention and MLP in parallel from one fused projection (timm's ParallelScalingBlock)"),
    ("vit_d*_reg1_gap_*", "it uses differential attention (timm's DiffAttention)"),
    ("vit_*_rope_mixed_*", "it has learned rotary frequencies, per block and head (Naver's RoPE-Mixed, timm's RotaryEmbeddingMixed)"),
)  # fmt: skip


def unsupported_reason(name: str) -> str | None:
    """Why timm's model `name` (a tag after a dot ignored) has no vitfast equivalent, or None if not known to lack one."""
    base = name.split(".", 1)[0]
    if base in _REGISTRY:
        return None
    return next((why for pattern, why in _UNSUPPORTED if fnmatch.fnmatch(base, pattern)), None)


def list_models(pattern: str | None = None) -> list[str]:
    """Registered names, sorted; `pattern` is a shell-style filter such as ``"deit*"``."""
    names = sorted(_REGISTRY)
    return [n for n in names if fnmatch.fnmatch(n, pattern)] if pattern else names


def get_config(name: str, **overrides: Any) -> ViTConfig:
    """The config registered as `name`, with overrides applied.

    A timm tag after a dot changes the head where vitfast knows what the tag holds: a CLIP tower's image-text tag
    (``vit_base_patch16_clip_224.openai``) gives its image projection (`embedding_head`), and a fine-tune tag on a tower
    registered with one needs `num_classes=` (its classifier's width is not known here). Any other tag keeps the
    registered head, the default tag's; pass `num_classes=` for a tag whose head differs."""
    base, _, tag = name.partition(".")
    if base not in _REGISTRY and (why := unsupported_reason(base)):
        raise ConfigError(f"timm's {base} cannot be built by vitfast: {why}, which vitfast's ViT does not implement")
    if base not in _REGISTRY:
        close = difflib.get_close_matches(base, _REGISTRY, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown model {name!r}{hint} (`vitfast models` lists them all)")
    cfg = ViTConfig.from_dict(dict(_REGISTRY[base], name=base))
    if tag and "num_classes" not in overrides:
        cfg = _tag_head(cfg, base, tag)
    return cfg.replace(**overrides) if overrides else cfg


def _tag_head(cfg: ViTConfig, base: str, tag: str) -> ViTConfig:
    """`cfg` with the head timm's weights under `tag` carry, where the tag says it (see `get_config`)."""
    width = embedding_width(base)
    if width is None:
        return cfg
    if head_is_embedding(base, width, tag):
        return cfg.replace(num_classes=width, embedding_head=True)
    if cfg.embedding_head:
        raise ConfigError(f"{base}.{tag} is a fine-tuned classifier, and {base} is registered with its image-text head "
                          f"(a {width}-wide image embedding): pass num_classes= with the fine-tune's number of classes")
    return cfg


def create_model(name_or_config: str | ViTConfig, **overrides: Any):
    """Build the reference `VisionTransformer` (random init, eval mode) from a name or a config.

    >>> create_model("vit_tiny_patch16_224", img_size=32, num_classes=10)
    """
    if isinstance(name_or_config, ViTConfig):
        cfg = name_or_config.replace(**overrides) if overrides else name_or_config
    elif isinstance(name_or_config, str):
        cfg = get_config(name_or_config, **overrides)
    else:
        raise ConfigError(f"create_model takes a model name or a ViTConfig, got {type(name_or_config).__name__}")
    return VisionTransformer(cfg).eval()
