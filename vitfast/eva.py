"""timm's eva.py state dicts in vitfast's (= timm's vision_transformer.py) names: DINOv3, EVA-02 and the axial RoPE ViTs.

eva.py names its layer scales `gamma_1` / `gamma_2` and keeps the attention's biases apart from a
bias-free fused qkv Linear (`q_bias`, `v_bias`; the key's is a zero buffer it does not save), or its
q, k and v Linears apart (`q_proj`, `k_proj` without a bias, `v_proj`: EVA-02 B/L). Its rotary
positions are not saved, so which rotary form a model has is read off what its keys do show
(`eva_family`); anything else from eva.py is refused afterwards, never loaded with the wrong positions.

EVA-02 (Fang et al. 2023): a class token with learned position embeddings *and* 2-D rotary ones
(`rope="axial"`: patch indices scaled to the 16x16 grid it was pre-trained on, base 10000, pairs
rotated together), SwiGLU (packed for Ti/S; B/L with the gate and value Linears apart and a LayerNorm
before fc2, `scale_mlp_norm`), no layer scale; the CLIP towers add a LayerNorm before the attention's
output projection (`scale_attn_norm`). timm's sbb RoPE ViTs and Naver's RoPE-ViT have EVA-02's rotary form on a plain
ViT with layer scale: see registry._SBB_ROPE, registry._ROPE_VIT.
"""

from __future__ import annotations

import math
import re

import torch

from .errors import CheckpointError

StateDict = dict[str, torch.Tensor]

# Any of these marks eva.py's layout (BEiT and CaiT share the first)
EVA_KEYS = ("blocks.0.gamma_1", "blocks.0.attn.q_bias", "blocks.0.attn.q_proj.weight")
# Everything a timm sbb RoPE ViT or a Naver RoPE-ViT holds, in eva.py's names or vitfast's
_ROPE_VIT_KEYS = re.compile(r"cls_token|reg_token|pos_embed|patch_embed\.proj\.(weight|bias)|(norm|fc_norm|head)\.(weight|bias)|blocks\.\d+\."
                            r"((norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias)|gamma_[12]|ls[12]\.gamma|attn\.[qv]_bias)")
_EVA_BLOCK = re.compile(r"blocks\.(\d+)\.(gamma_1|gamma_2|attn\.q_bias|attn\.v_bias|attn\.[qkv]_proj\.(?:weight|bias))")


def is_eva(sd: StateDict) -> bool:
    return any(k in sd for k in EVA_KEYS)


def eva_family(sd: StateDict) -> str | None:
    """"dinov3", "eva02", "sbb_rope", "rope_vit" or None: which rotary ViT an eva.py-layout state dict is, read off its
    keys (eva.py's names or, for a caller who said the weights are rotary, vitfast's).

    DINOv3: a class token and registers, no learned position embeddings. EVA-02: a class token, learned position
    embeddings, no registers, no layer scale, no norm before the blocks, a SwiGLU MLP (its gate and value Linears
    apart, or packed into one fc1 twice as wide as fc2 reads). timm's sbb RoPE ViTs ("sbb_rope"): registers, no class
    token, no learned positions. Naver's RoPE-ViT ("rope_vit"): a class token, no registers, learned positions for
    the patches only or none. Both of these: layer scale, a GELU MLP and nothing else (`_ROPE_VIT_KEYS`: no CaiT
    class-attention blocks, no BEiT relative positions). None has a saved rotary buffer nor qk-norm.
    Among timm 1.0.31's eva.py models the DINOv3 rule holds exactly for those built with its DINOv3 rotary
    embedding (the vit_*_patch16_dinov3* names, LingBot, and Sapiens2, refused afterwards for its qk-norm), the
    EVA-02 rule exactly for eva02_* but the post-norm enormous one, the other two exactly for the
    vit_*_rope_reg*_gap_256 and vit_*_patch16_rope[_ape]_224 names. EVA-01 (a GELU MLP, no rotary positions, no
    layer scale), PE (a norm before the blocks) and RoPE-Mixed (learned frequencies, saved) match none.
    tests/test_timm_parity.py checks this over every eva.py model."""
    if any(k.startswith("rope.") for k in sd):
        return None
    cls, reg, pos = "cls_token" in sd, "reg_token" in sd, "pos_embed" in sd
    if cls and reg and not pos:
        return "dinov3"
    fc1, fc2 = sd.get("blocks.0.mlp.fc1.weight"), sd.get("blocks.0.mlp.fc2.weight")
    swiglu = "blocks.0.mlp.fc1_g.weight" in sd or (fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1])
    scaled = "blocks.0.gamma_1" in sd or "blocks.0.ls1.gamma" in sd
    plain = not scaled and "norm_pre.weight" not in sd and not any(".q_norm." in k for k in sd)
    if cls and pos and not reg and swiglu and plain:
        return "eva02"
    if not scaled or swiglu or fc1 is None or not all(_ROPE_VIT_KEYS.fullmatch(k) for k in sd):
        return None
    if reg and not cls and not pos:
        return "sbb_rope"
    patches_only = pos and math.isqrt(n := sd["pos_embed"].shape[1]) ** 2 == n  # DeiT-III's no_embed_class
    return "rope_vit" if cls and not reg and (patches_only or not pos) else None


def eva_to_timm(sd: StateDict) -> StateDict:
    """Rename timm's eva.py block keys to vitfast's: gamma_1 / gamma_2 -> ls1.gamma / ls2.gamma; q_bias, zeros (eva.py's
    k_bias, a zero buffer it does not save) and v_bias -> one qkv.bias [3 C], in qkv.weight's row order (q, k, v);
    q_proj / k_proj / v_proj -> one qkv Linear, its bias [q, k or zeros, v] (EVA-02's k_proj has none)."""
    out: StateDict = {}
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in sd.items():
        if not (m := _EVA_BLOCK.fullmatch(key)):
            out[key] = value
        elif m.group(2).startswith("gamma"):
            out[f"blocks.{m.group(1)}.ls{m.group(2)[-1]}.gamma"] = value
        else:
            parts.setdefault(m.group(1), {})[m.group(2).removeprefix("attn.")] = value
    for idx, p in parts.items():
        if "q_proj.weight" in p:
            if {"q_proj.weight", "k_proj.weight", "v_proj.weight"} - p.keys():
                raise CheckpointError(f"block {idx} has attention projections {sorted(p)}; timm's eva.py has q_proj, k_proj and v_proj")
            out[f"blocks.{idx}.attn.qkv.weight"] = torch.cat([p["q_proj.weight"], p["k_proj.weight"], p["v_proj.weight"]])
            q, k, v = p.get("q_proj.bias"), p.get("k_proj.bias"), p.get("v_proj.bias")
        else:
            q, k, v = p.get("q_bias"), None, p.get("v_bias")
        if (q is None) != (v is None):
            raise CheckpointError(f"block {idx} has a bias on only one of q and v; timm's eva.py attention has both or neither")
        if q is not None:
            out[f"blocks.{idx}.attn.qkv.bias"] = torch.cat([q, k if k is not None else torch.zeros_like(q), v])
    return out
