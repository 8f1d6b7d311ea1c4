"""The reference Vision Transformer (Dosovitskiy et al. 2021), with DeiT, DeiT-III, register,
hybrid, CLIP image-tower (pre-norm, QuickGELU), SigLIP (attention-pool head), AIMv2 (RMSNorm, SwiGLU,
bias-free projections) and DINOv3 (2-D rotary position embeddings) variants, in plain PyTorch.

Parameter names are timm's, so `model.state_dict()` is a timm state dict. Layers are injected
by class (`block_fn`, `attn_layer`, `mlp_layer`, `norm_layer`) so fused versions can replace
them without touching the weights.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from .config import OUTPUT_FMTS, ViTConfig, take_indices
from .hybrid import HybridEmbed
from .layers import MLP_CLASSES, NORM_CLASSES, Attention, AttentionPoolLatent, Block, PatchEmbed, RopeTables
from .pos_embed import interpolate_grid

# the instance attribute vitfast.optimize(head_only=True) sets: how many leading tokens the head reads
HEAD_ROWS = "_vitfast_head_rows"


class VisionTransformer(nn.Module):
    """images [B, in_chans, H, W] (normalised float) -> logits [B, num_classes].

    With `num_classes=0` the head is the identity and `forward` returns pooled features [B, C]; with
    `global_pool=""` nothing is pooled and `forward` returns every token [B, T, num_classes or C] (timm's rule); with
    `features_only` it returns feature maps [B, n, C, gh, gw] (`forward_intermediates`, stacked) and has no head.
    `mlp_layer` and `norm_layer` default to the config's (`Mlp`, `SwiGLUPacked` or `SwiGLU`;
    `nn.LayerNorm` or `nn.RMSNorm`).
    """

    def __init__(
        self,
        config: ViTConfig,
        *,
        block_fn: type[nn.Module] = Block,
        attn_layer: type[nn.Module] = Attention,
        mlp_layer: type[nn.Module] | None = None,
        norm_layer: type[nn.Module] | None = None,
    ):
        super().__init__()
        c = self.config = config
        mlp_layer = mlp_layer or MLP_CLASSES[c.mlp_layer]
        norm_layer = norm_layer or NORM_CLASSES[c.norm_layer]
        dim = c.embed_dim
        self.num_prefix_tokens = c.num_prefix_tokens
        bias = not c.pre_norm  # timm: no projection bias when a LayerNorm follows the embeddings
        dynamic = c.patch_size if c.dynamic_img_size else None
        if c.hybrid_layers is not None:
            self.patch_embed = HybridEmbed(c.img_hw, c.patch_size, c.in_chans, dim, c.hybrid_layers, bias=bias, dynamic_patch=dynamic)
        else:
            embed_norm = norm_layer(dim, eps=c.norm_eps) if c.embed_norm else None
            self.patch_embed = PatchEmbed(c.img_hw, c.patch_size, c.in_chans, dim, bias=bias, norm=embed_norm, dynamic_patch=dynamic)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if c.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim)) if c.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, c.reg_tokens, dim)) if c.reg_tokens else None
        embed_len = c.pos_grid[0] * c.pos_grid[1] + (0 if c.no_embed_class else c.num_prefix_tokens)
        self.pos_embed = nn.Parameter(torch.zeros(1, embed_len, dim)) if c.abs_pos_embed else None
        self.pos_drop = nn.Dropout(c.pos_drop_rate)
        # DINOv3, EVA-02: rotary tables for img_size's grid, computed once (per input grid with dynamic_img_size), handed to every block
        rope_grid = (c.rope_ref_grid, c.rope_grid_indexing, c.rope_grid_offset)
        self.rope = RopeTables(c.rope, c.grid_size, c.head_dim, c.rope_base, *rope_grid) if c.rope is not None else None
        self.norm_pre = norm_layer(dim, eps=c.norm_eps) if c.pre_norm else nn.Identity()

        drop_path = [c.drop_path_rate * i / max(c.depth - 1, 1) for i in range(c.depth)]  # linear decay rule
        self.blocks = nn.Sequential(
            *[
                block_fn(
                    dim,
                    c.num_heads,
                    c.mlp_hidden,
                    qkv_bias=c.qkv_bias,
                    proj_bias=c.proj_bias,
                    init_values=c.init_values,
                    norm_eps=c.norm_eps,
                    act_layer=c.act_layer,
                    attn_drop=c.attn_drop_rate,
                    proj_drop=c.proj_drop_rate,
                    drop_path=drop_path[i],
                    attn_layer=attn_layer,
                    mlp_layer=mlp_layer,
                    norm_layer=norm_layer,
                    **{k: True for k in ("scale_attn_norm", "scale_mlp_norm") if getattr(c, k)},  # only when wanted (injected blocks)
                )
                for i in range(c.built_depth)  # features_only: none after the last map (timm's prune_intermediate_layers)
            ]
        )
        # timm's rule: with average pooling the final norm moves after the pooling (fc_norm).
        keep_norm = c.feature_norm if c.features_only else c.final_norm and not c.use_fc_norm
        self.norm = norm_layer(dim, eps=c.norm_eps) if keep_norm else nn.Identity()
        if not c.features_only:  # features_only has no head: nothing after the blocks but the optional norm
            self._build_head(c, norm_layer)
        self.reset_parameters()

    def _build_head(self, c: ViTConfig, norm_layer: type[nn.Module]) -> None:
        """Pooling, fc_norm, pre-logits and classifier(s), named as timm names them."""
        dim = c.embed_dim
        if c.global_pool == "map":
            self.attn_pool = AttentionPoolLatent(
                dim, c.attn_pool_num_heads or c.num_heads, c.pool_mlp_hidden, norm_eps=c.norm_eps, act_layer=c.act_layer, norm_layer=norm_layer
            )
        self.fc_norm = norm_layer(dim, eps=c.norm_eps) if c.final_norm and c.use_fc_norm else nn.Identity()
        if c.representation_size:
            self.pre_logits = nn.Sequential(
                OrderedDict(fc=nn.Linear(c.num_features, c.representation_size), act=nn.Tanh())
            )
        else:
            self.pre_logits = nn.Identity()
        self.head_drop = nn.Dropout(c.drop_rate)
        head_in = c.representation_size or c.num_features
        self.head = nn.Linear(head_in, c.num_classes) if c.num_classes else nn.Identity()
        if c.distilled and c.dist_head:
            self.head_dist = nn.Linear(dim, c.num_classes) if c.num_classes else nn.Identity()

    def reset_parameters(self) -> None:
        """Random init in the ViT/timm style (truncated normal 0.02, zero biases, unit LayerNorm)."""
        for p in (self.pos_embed, self.cls_token, self.dist_token, self.reg_token):  # pos_embed None without one
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        if hasattr(self, "attn_pool"):
            nn.init.trunc_normal_(self.attn_pool.latent, std=self.config.embed_dim**-0.5)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    # ---------------------------------------------------------------- forward
    def _embed(self, images: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """images -> (tokens [B, prefix + N, C] entering the blocks, the blocks' rotary keyword argument).

        With dynamic_img_size the position embeddings and rotary tables are fitted to the images' patch grid."""
        x = self.patch_embed(images)
        p = self.config.patch_size
        grid = (images.shape[-2] // p, images.shape[-1] // p) if self.config.dynamic_img_size else None
        x = self.norm_pre(self.pos_drop(self._pos_embed(x, grid)))
        return x, {} if self.rope is None else {"rope": self.rope(grid)}  # blocks get it only when there is one

    def _pos_embed(self, x: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Patch tokens [B, N, C] -> [B, prefix + N, C] with class/dist/register tokens prepended, and the position
        embeddings added: as stored, or resized to `grid` from the stored grid (dynamic_img_size)."""
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        pos = self.pos_embed
        if pos is None:
            return torch.cat(prefix + [x], dim=1) if prefix else x
        c = self.config
        if grid is not None:
            n = 0 if c.no_embed_class else self.num_prefix_tokens
            pos = torch.cat([pos[:, :n], interpolate_grid(pos[:, n:], c.pos_grid, grid, antialias=c.pos_embed_antialias)], dim=1)
        if c.no_embed_class:
            x = x + pos
            return torch.cat(prefix + [x], dim=1) if prefix else x
        if prefix:
            x = torch.cat(prefix + [x], dim=1)
        return x + pos

    def forward_features(self, x: torch.Tensor, return_attention: bool = False):
        """images -> tokens [B, prefix + N, C] after the final norm.

        With `return_attention=True`, returns `(tokens, attentions)` where `attentions` is a list of
        `depth` tensors [B, heads, T, T] of attention probabilities (T = prefix + N), computed on
        the explicit math path.
        """
        x, rope = self._embed(x)
        if not return_attention:
            for block in self.blocks:
                x = block(x, **rope)
            return self.norm(x)
        attentions = []
        for block in self.blocks:
            x, attn = block(x, return_attention=True, **rope)
            attentions.append(attn)
        return self.norm(x), attentions

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """tokens [B, T, C] -> logits [B, num_classes] (or pooled features with `pre_logits`; [B, T, ...] unpooled)."""
        if self.config.distilled and self.config.dist_head:
            cls, dist = self.head_drop(x[:, 0]), self.head_drop(x[:, 1])
            if pre_logits:
                return (cls + dist) / 2
            return (self.head(cls) + self.head_dist(dist)) / 2  # DeiT inference: mean of both heads
        x = self.pool(x)
        x = self.head_drop(self.pre_logits(self.fc_norm(x)))
        return x if pre_logits else self.head(x)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """tokens [B, T, C] -> [B, num_features]: the class token, the mean of the patch tokens ("avg"),
        the attention pool over them ("map") or the class token and the patch mean side by side
        ("token_avg", [B, 2C]); with "" every token, unpooled [B, T, C]."""
        pool, patches = self.config.global_pool, x[:, self.num_prefix_tokens :]
        if pool == "":
            return x
        if pool == "map":
            return self.attn_pool(x if self.config.pool_include_prefix else patches)
        if pool == "avg":
            return patches.mean(dim=1)
        return torch.cat([x[:, 0], patches.mean(dim=1)], dim=-1) if pool == "token_avg" else x[:, 0]

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """images -> the patch tokens after the blocks `indices`, as timm's `forward_intermediates` returns them.

        `indices`: the last n blocks (int), block indices (negative from the end of `config.depth`), or None: all.
        Each feature map is [B, C, gh, gw] ("NCHW") or [B, gh * gw, C] ("NLC"); `norm` applies the final norm
        first; `return_prefix_tokens` pairs each with its prefix tokens [B, prefix, C]. Returns
        `(tokens [B, T, C] after the final norm, list)`, or the list alone with `intermediates_only`. `stop_early`
        skips the blocks after the last index (the tokens returned are then that block's).
        """
        if output_fmt not in OUTPUT_FMTS:
            raise ValueError(f"output_fmt must be one of {OUTPUT_FMTS}, got {output_fmt!r}")
        take = take_indices(self.config.depth, indices)
        if take[-1] >= len(self.blocks):
            raise ValueError(f"block {take[-1]} is not in this model: it keeps blocks 0 to {len(self.blocks) - 1} "
                             f"(features_only, out_indices={self.config.out_indices})")  # fmt: skip
        B, _, height, width = x.shape
        x, rope = self._embed(x)
        blocks = self.blocks[: take[-1] + 1] if stop_early or intermediates_only else self.blocks
        features = []
        for i, block in enumerate(blocks):
            x = block(x, **rope)
            if i in take:
                y = x[0] if isinstance(x, tuple) else x  # a fused block hands the next one (x, norm1(x))
                features.append(self.norm(y) if norm else y)
        prefix = [y[:, : self.num_prefix_tokens] for y in features]
        features = [y[:, self.num_prefix_tokens :] for y in features]
        if output_fmt == "NCHW":
            gh, gw = height // self.config.patch_size, width // self.config.patch_size
            features = [y.reshape(B, gh, gw, -1).permute(0, 3, 1, 2).contiguous() for y in features]
        if return_prefix_tokens and self.num_prefix_tokens:
            features = list(zip(features, prefix))
        if intermediates_only:
            return features
        return self.norm(x[0] if isinstance(x, tuple) else x), features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        if c.features_only:  # [B, len(out_indices), *feature map]
            maps = self.forward_intermediates(x, c.feature_indices, return_prefix_tokens=c.feature_prefix_tokens, norm=c.feature_norm,
                                              output_fmt=c.output_fmt, intermediates_only=True)  # fmt: skip
            if c.feature_prefix_tokens:  # every token in the block's order: prefix first
                maps = [torch.cat([prefix, patches], dim=1) for patches, prefix in maps]
            return torch.stack(maps, dim=1)
        rows = self.__dict__.get(HEAD_ROWS)  # vitfast.optimize(head_only=True): see _head_rows_features
        if rows is not None and not any(m._forward_hooks or m._forward_pre_hooks for m in (self.blocks[-1], self.norm)):
            return self.forward_head(self._head_rows_features(x, rows))
        return self.forward_head(self.forward_features(x))

    def _head_rows_features(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """forward_features' first `rows` tokens [B, rows, C], the last block computing only those (their queries
        over every key): an optimized block's `rows`, set up by `vitfast.optimize(head_only=True)` where the head
        reads no other token. Hooks on the last block or the final norm get the full forward instead (above)."""
        x, rope = self._embed(x)
        *body, last = self.blocks
        for block in body:
            x = block(x, **rope)
        return self.norm(last(x, rows=rows, **rope))

    # ---------------------------------------------------------------- helpers
    def set_fused_attn(self, enabled: bool) -> "VisionTransformer":
        """Select SDPA (True) or the explicit math path (False, ONNX-friendly) in every Attention."""
        for m in self.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = enabled
        return self

