"""Reference ViT layers in plain PyTorch (timm's parameter names, so checkpoints map 1:1).

Shapes: B batch, N tokens, C = embed_dim, H heads, D = C // H head_dim.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .errors import InputError


class PatchEmbed(nn.Module):
    """Image [B, in_chans, H, W] -> patch tokens [B, N, C] with a stride = kernel = patch Conv2d,
    then `norm` over C if given (timm's `patch_embed.norm`, AIMv2)."""

    def __init__(
        self, img_size: tuple[int, int], patch_size: int, in_chans: int, embed_dim: int, bias: bool = True, norm: nn.Module | None = None,
        dynamic_patch: int | None = None,
    ):  # fmt: skip
        super().__init__()
        self.img_size = img_size
        self.in_chans = in_chans
        self.dynamic_patch = dynamic_patch
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)
        self.norm = norm if norm is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_image_shape(x, self.in_chans, self.img_size, self.dynamic_patch)
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


def check_image_shape(x: torch.Tensor, in_chans: int, img_size: tuple[int, int], dynamic_patch: int | None = None) -> None:
    """Raise `InputError` naming the expected shape (shape checks are static under tracing). `dynamic_patch`: any
    H x W in whole patches of that size is accepted (dynamic_img_size)."""
    if x.ndim != 4:
        raise InputError(
            f"expected images as a [B, {in_chans}, {img_size[0]}, {img_size[1]}] float tensor, "
            f"got {x.ndim} dims {tuple(x.shape)}; uint8 [B, H, W, 3] images go through vitfast.preprocess first"
        )
    if not x.is_floating_point():
        raise InputError(
            f"expected normalised float images, got dtype {x.dtype}; uint8 [B, H, W, 3] images go through "
            f"vitfast.preprocess (resize, crop, mean/std) first"
        )
    if x.shape[1] != in_chans:
        raise InputError(
            f"expected {in_chans} input channels, got {x.shape[1]} (shape {tuple(x.shape)}); "
            f"images must be [B, C, H, W] with C = {in_chans}"
        )
    if dynamic_patch is not None:
        h, w = x.shape[2], x.shape[3]
        if h % dynamic_patch or w % dynamic_patch or min(h, w) < dynamic_patch:
            fit = [max(s // dynamic_patch, 1) * dynamic_patch for s in (h, w)]
            raise InputError(f"images of {h}x{w} are not whole {dynamic_patch}x{dynamic_patch} patches; this model (dynamic_img_size) "
                             f"takes any size in whole patches: crop or resize to e.g. {fit[0]}x{fit[1]}")  # fmt: skip
        return
    if tuple(x.shape[2:]) != tuple(img_size):
        raise InputError(
            f"expected images of {img_size[0]}x{img_size[1]}, got {x.shape[2]}x{x.shape[3]}; resize the "
            f"input, or load the checkpoint with img_size={x.shape[2] if x.shape[2] == x.shape[3] else tuple(x.shape[2:])} "
            f"to resize the position embeddings"
        )


def attention_probs(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) over the keys, [B, H, Nq, D] x [B, H, Nk, D] -> [B, H, Nq, Nk]; the softmax
    sums in at least fp32 (fp16/bf16 models), then returns to q's dtype."""
    attn = (q * scale) @ k.transpose(-2, -1)
    return attn.to(torch.promote_types(attn.dtype, torch.float32)).softmax(dim=-1).to(q.dtype)


def rope_tables(
    kind: str, grid: tuple[int, int], head_dim: int, theta: float, dtype: torch.dtype, device=None, ref_grid: tuple[int, int] | None = None,
    indexing: str = "ij", offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """2-D rotary tables (cos, sin), each [gh * gw, head_dim], patches in row-major order (`ViTConfig.rope`).

    head_dim / 4 periods theta ** (4i / head_dim) per axis, y's then x's (x's first for `indexing` "xy"), dividing the patch coordinate:
    "dinov3" (DINOv3): patch centres normalised to [-1, 1] per axis, angles 2 pi coord / period, repeated for the
    rotate-half layout [a, a]. "axial" (EVA-02, timm's RotaryEmbeddingCat): patch indices plus `offset`, scaled by
    ref_grid / grid when given (EVA's ref_feat_shape), angles coord / period, each repeated for its pair [a0, a0, a1, a1, ..].
    Computed in at least fp32 (as transformers and timm do), so cast to the model's dtype by the caller.
    """
    dtype = torch.promote_types(dtype, torch.float32)
    axes = [torch.arange(size, dtype=dtype, device=device) for size in grid]
    if kind == "dinov3":
        axes = [(t + 0.5) / size * 2 - 1 for t, size in zip(axes, grid)]
    else:
        axes = [t + offset for t in axes]
        if ref_grid is not None:
            axes = [t / size * ref for t, size, ref in zip(axes, grid, ref_grid)]
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).flatten(0, 1)  # [gh * gw, 2]: (y, x)
    if indexing == "xy":
        coords = coords.flip(-1)
    periods = theta ** (torch.arange(head_dim // 4, dtype=dtype, device=device) * 4 / head_dim)
    # [gh * gw, head_dim / 2], in each library's order of operations (timm's DINOv3 divides, its EVA multiplies)
    if kind == "dinov3":
        angles = (2 * math.pi * coords[:, :, None] / periods).flatten(1)
        angles = torch.cat([angles, angles], dim=-1)
    else:
        angles = (coords[:, :, None] * (1 / periods)).flatten(1).repeat_interleave(2, dim=-1)
    return angles.cos(), angles.sin()


class Rope(NamedTuple):
    """What a block's attention rotates the last Np tokens' queries and keys by: cos, sin [Np, D] and the layout."""

    cos: torch.Tensor
    sin: torch.Tensor
    interleaved: bool  # pairs (2j, 2j + 1) ("axial"), else the halves (j, j + D/2) ("dinov3")


class RopeTables(nn.Module):
    """The rotary tables of a fixed patch grid, computed once: `forward()` -> `Rope` (cos, sin [gh * gw, head_dim]).

    Non-persistent buffers (not in the state dict), kept in at least fp32 whatever dtype the model is cast
    to: `.half()` / `.to()` recompute them from the formula (as timm keeps its rotary periods), so a
    float64 model gets float64 tables and an fp16 one fp32 tables that `apply_rope` casts, as transformers does.
    """

    def __init__(self, kind: str, grid: tuple[int, int], head_dim: int, theta: float, ref_grid: tuple[int, int] | None = None,
                 indexing: str = "ij", offset: float = 0.0):  # fmt: skip
        super().__init__()
        self.interleaved = kind == "axial"
        self._at = functools.partial(rope_tables, kind, head_dim=head_dim, theta=theta, ref_grid=ref_grid, indexing=indexing, offset=offset)
        self._tables = functools.partial(self._at, grid=grid)
        cos, sin = self._tables(dtype=torch.float32)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.cos, self.sin = self._tables(dtype=self.cos.dtype, device=self.cos.device)
        return self

    def forward(self, grid: tuple[int, int] | None = None) -> Rope:
        """The tables of the model's grid, or computed for another `grid` (dynamic_img_size: the input's, each forward)."""
        if grid is None:
            return Rope(self.cos, self.sin, self.interleaved)
        return Rope(*self._at(grid=grid, dtype=self.cos.dtype, device=self.cos.device), self.interleaved)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotate the last cos.shape[0] tokens of x [B, H, N, D] (the patches; the class and register tokens
    before them stay): x cos + rot(x) sin in x's dtype, rot(x) = (-x[D/2:], x[:D/2]) (rotate-half), or with
    `interleaved` rot(x)[2j], rot(x)[2j + 1] = -x[2j + 1], x[2j] (timm's `apply_rot_embed_cat(half=False)`)."""
    prefix, patches = x.split((x.shape[-2] - cos.shape[0], cos.shape[0]), dim=-2)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if interleaved:
        pairs = patches.unflatten(-1, (-1, 2))
        rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    else:
        x1, x2 = patches.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
    return torch.cat([prefix, patches * cos + rotated * sin], dim=-2)


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv Linear.

    Two paths with the same math: `F.scaled_dot_product_attention` (default) and an explicit
    softmax(q k^T / sqrt(D)) v that can return the attention probabilities and exports to ONNX
    as plain MatMul/Softmax. `fused_attn = False` selects the explicit path. Given `rope` tables
    (`Rope`), the patch tokens' queries and keys are rotated first (DINOv3, EVA-02). `norm` (timm's
    scale_attn_norm, EVA-02 CLIP): a norm module for the heads' output before the projection.
    """

    def __init__(
        self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0, proj_bias: bool = True,
        norm: nn.Module | None = None,
    ):  # fmt: skip
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm if norm is not None else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, return_attention: bool = False, rope: Rope | None = None):
        """x [B, N, C] -> [B, N, C]; with `return_attention`, also probabilities [B, H, N, N]. `rope`:
        the rotary tables [Np, D] of the last Np tokens."""
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, H, N, D]
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        attn = None
        if self.fused_attn and not return_attention:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            attn = attention_probs(q, k, self.scale)
            x = self.attn_drop(attn) @ v
        x = self.proj_drop(self.proj(self.norm(x.transpose(1, 2).reshape(B, N, C))))
        return (x, attn) if return_attention else x


class AttentionPoolLatent(nn.Module):
    """Multihead attention pooling (MAP, SigLIP's head): one learned query attends over the tokens,
    then a pre-norm MLP with a residual. Tokens [B, N, C] -> pooled [B, C]. timm's parameter names
    (`latent`, `q`, `kv`, `proj`, `norm`, `mlp`); `fused_attn` as in `Attention`."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_hidden: int,
        *,
        norm_eps: float = 1e-6,
        act_layer: str = "gelu",
        norm_layer: type[nn.Module] = nn.LayerNorm,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        self.norm = norm_layer(dim, eps=norm_eps)
        self.mlp = Mlp(dim, mlp_hidden, act_layer=act_layer)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """x [B, N, C] -> [B, C]; with `return_attention`, also the query's probabilities [B, H, N]."""
        B, N, C = x.shape
        q = self.q(self.latent).reshape(1, self.num_heads, 1, self.head_dim).expand(B, -1, -1, -1)
        k, v = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, N, D]
        attn = None
        if self.fused_attn and not return_attention:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = attention_probs(q, k, self.scale)
            x = attn @ v
        x = self.proj(x.reshape(B, C))  # [B, H, 1, D] -> [B, C]: one query, heads side by side
        x = x + self.mlp(self.norm(x))
        return (x, attn[:, :, 0]) if return_attention else x


class QuickGELU(nn.Module):
    """x sigmoid(1.702 x): GELU's sigmoid approximation (Hendrycks & Gimpel), which OpenAI's CLIP
    was trained with. `approximate` names the form as the fused kernels do (nn.GELU has 'none' / 'tanh')."""

    approximate = "sigmoid"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def make_act(act_layer: str) -> nn.Module:
    """The activation module for a `ViTConfig.act_layer` name."""
    if act_layer == "quick_gelu":
        return QuickGELU()
    if act_layer == "silu":
        return nn.SiLU()
    return nn.GELU(approximate="tanh" if act_layer == "gelu_tanh" else "none")


class Mlp(nn.Module):
    """fc1 -> GELU (erf form, or its tanh or sigmoid approximation) -> fc2, [B, N, C] -> [B, N, C].
    The MLP classes take `norm`: a norm module for the hidden activations before fc2 (timm's scale_mlp_norm)."""

    def __init__(self, dim: int, hidden: int, act_layer: str = "gelu", drop: float = 0.0, bias: bool = True, norm: nn.Module | None = None):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = make_act(act_layer)
        self.drop1 = nn.Dropout(drop)
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


class SwiGLUPacked(nn.Module):
    """SwiGLU (Shazeer 2020) with both input projections in one Linear, as timm's `SwiGLUPacked` and
    DINOv2's giant: fc1 [hidden, C] -> gate, value halves [.., hidden / 2] -> silu(gate) * value -> fc2.
    [B, N, C] -> [B, N, C]; `hidden` is fc1's (packed) width."""

    def __init__(self, dim: int, hidden: int, act_layer: str = "silu", drop: float = 0.0, bias: bool = True, norm: nn.Module | None = None):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = make_act(act_layer)
        self.drop1 = nn.Dropout(drop)
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden // 2, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(gate) * value))))


class SwiGLU(nn.Module):
    """SwiGLU with the gate and value projections apart, as timm's `SwiGLU` (AIMv2): silu(fc1_g(x)) *
    fc1_x(x) -> fc2, [B, N, C] -> [B, N, C]; `hidden` is each projection's width."""

    def __init__(self, dim: int, hidden: int, act_layer: str = "silu", drop: float = 0.0, bias: bool = True, norm: nn.Module | None = None):
        super().__init__()
        self.fc1_g = nn.Linear(dim, hidden, bias=bias)
        self.fc1_x = nn.Linear(dim, hidden, bias=bias)
        self.act = make_act(act_layer)
        self.drop1 = nn.Dropout(drop)
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1_g(x)) * self.fc1_x(x)))))


MLP_CLASSES = {"mlp": Mlp, "swiglu_packed": SwiGLUPacked, "swiglu": SwiGLU}  # ViTConfig.mlp_layer -> module
NORM_CLASSES = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}  # ViTConfig.norm_layer -> module


class LayerScale(nn.Module):
    """Per-channel learned scale of a residual branch (Touvron et al., CaiT / DeiT-III)."""

    def __init__(self, dim: int, init_values: float):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth per sample; the identity in eval mode."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_hidden: int,
        *,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        init_values: float | None = None,
        norm_eps: float = 1e-6,
        act_layer: str = "gelu",
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        attn_layer: type[nn.Module] = Attention,
        mlp_layer: type[nn.Module] = Mlp,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        scale_attn_norm: bool = False,
        scale_mlp_norm: bool = False,
    ):
        super().__init__()
        self.norm1 = norm_layer(dim, eps=norm_eps)
        # bias-free projections and inner norms are asked for only when wanted, so injected layers without the
        # arguments keep working
        attn_kw = ({} if proj_bias else {"proj_bias": False}) | ({"norm": norm_layer(dim, eps=norm_eps)} if scale_attn_norm else {})
        self.attn = attn_layer(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop, **attn_kw)
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = norm_layer(dim, eps=norm_eps)
        mlp_kw = {} if proj_bias else {"bias": False}
        if scale_mlp_norm:  # over the width fc2 reads: half of a packed SwiGLU's fc1
            mlp_kw["norm"] = norm_layer(mlp_hidden // 2 if mlp_layer is SwiGLUPacked else mlp_hidden, eps=norm_eps)
        self.mlp = mlp_layer(dim, mlp_hidden, act_layer=act_layer, drop=proj_drop, **mlp_kw)
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor, return_attention: bool = False, rope: Rope | None = None):
        """x [B, N, C] -> [B, N, C]; with `return_attention`, also [B, H, N, N] probabilities. `rope` goes to
        the attention (only when given, so injected attention layers without it keep working)."""
        attn = None
        kw = {} if rope is None else {"rope": rope}
        if return_attention:
            y, attn = self.attn(self.norm1(x), return_attention=True, **kw)
        else:
            y = self.attn(self.norm1(x), **kw)
        x = x + self.drop_path1(self.ls1(y))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return (x, attn) if return_attention else x
