"""2-D rotary position embedding (RoPE) of q and k, straight from the packed qkv, in two layouts.

Between the qkv GEMM and the fused attention of a RoPE ViT: qkv [B, N, 3, H, D] (any strides) ->
a new contiguous [B, N, 3, H, D] in qkv's dtype where q and k (index 0 and 1 on dim 2) of the last
Np tokens, the patch tokens, are rotated; each head, with t = n - (N - Np):

    x_rot = x * cos[t] + rot(x) * sin[t]

rotate-half (the default; DINOv3, transformers' `apply_rotary_pos_emb`): columns d and d + D/2 pair up,

    rot(x) = cat(-x[D/2:], x[:D/2])

interleaved (`interleaved=True`; EVA-02 and timm's other axial-RoPE ViTs, timm's
`apply_rot_embed_cat(x, emb, half=False)`): columns 2j and 2j + 1 pair up,

    rot(x) = stack([-x[1::2], x[::2]], -1).reshape(D):  rot(x)[2j] = -x[2j + 1], rot(x)[2j + 1] = x[2j]

Both are computed in fp32 and rounded once. v and the prefix tokens (class, registers) are copied bit for
bit. cos, sin [Np, D]: fp32 or qkv's dtype, one value per column, so each pair's angle appears in
both of its columns ([f0, ..., f(D/2-1)] twice for rotate-half, [f0, f0, f1, f1, ...] interleaved).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vitfast.errors import InputError

from ._common import INT32_MAX, check_device, next_pow2, runs_reference, span, vitfast_op, wrap_triton

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Elements of one [BLOCK_H, BLOCK_D] tile: 32 heads x 128 (ViT-7B's q or k in one tile, 16 fp32
# values per thread per tensor at 8 warps); wider heads take fewer heads per tile
MAX_TILE = 4096


@triton.jit
def _rope_qkv_kernel(
    QKV, Cos, Sin, Out,
    stride_b, stride_n, stride_3, stride_h, stride_d,  # qkv [B, N, 3, H, D]
    stride_om, stride_o3, stride_oh,  # out viewed as [B*N, 3, H, D], unit last stride
    N, H, PREFIX,  # tokens per image, heads, tokens before the rotated ones
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr,
):  # fmt: skip
    HALF: tl.constexpr = HEAD_DIM // 2
    # -- one (image, token) row per program; int64: b * stride_b passes 2^31 elements at large
    # batches, the offsets inside one row stay int32 (the launcher checks they fit)
    row = tl.program_id(0).to(tl.int64)
    n = row % N
    src = QKV + (row // N) * stride_b + n * stride_n
    dst = Out + row * stride_om
    t = n - PREFIX  # index into cos / sin; negative for the prefix tokens (class, registers)
    offs_h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask_d = d < HEAD_DIM
    # rot(x)[d] = sign[d] * x[partner[d]]; partners stay below HEAD_DIM (even) for unmasked columns
    if INTERLEAVED:  # -x[d + 1] on even d, +x[d - 1] on odd d
        partner = d ^ 1
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    else:  # -x[d + D/2] for d < D/2, +x[d - D/2] after
        partner = tl.where(d < HALF, d + HALF, d - HALF)
        sign = tl.where(d < HALF, -1.0, 1.0)
    for p in tl.static_range(3):  # q, k, v
        for h0 in range(0, H, BLOCK_H):
            h = h0 + offs_h
            mask = (h < H)[:, None] & mask_d[None, :]
            heads = src + p * stride_3 + h[:, None] * stride_h
            x = tl.load(heads + d[None, :] * stride_d, mask=mask)
            if p < 2:
                if t >= 0:  # -- q, k of a patch token: x cos + rot(x) sin in fp32, rounded once
                    # (cos / sin: one [BLOCK_D] row per token, re-read per tile from L1; loaded here, not
                    # hoisted under a `mask_d & (t >= 0)` mask, which Triton 3.9's interpreter mis-types)
                    cos = tl.load(Cos + t * HEAD_DIM + d, mask=mask_d, other=0.0).to(tl.float32)
                    sin = sign * tl.load(Sin + t * HEAD_DIM + d, mask=mask_d, other=0.0).to(tl.float32)
                    xp = tl.load(heads + partner[None, :] * stride_d, mask=mask).to(tl.float32)
                    x = (x.to(tl.float32) * cos[None, :] + xp * sin[None, :]).to(Out.dtype.element_ty)
            # -- store: v and the prefix tokens' q, k as loaded, bit for bit
            tl.store(dst + p * stride_o3 + h[:, None] * stride_oh + d[None, :], x, mask=mask)


def check_shapes(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """qkv [B, N, 3, H, D] with D even, cos and sin [Np, D] with Np <= N; ValueError naming the shapes otherwise."""
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        raise ValueError(f"RoPE expects qkv of shape [B, N, 3, H, D], got {tuple(qkv.shape)}")
    N, D = qkv.shape[1], qkv.shape[-1]
    if D % 2:
        raise ValueError(f"RoPE rotates pairs of columns in each head (halves or neighbours), so head_dim must be even, "
                         f"got {D} (qkv {tuple(qkv.shape)})")  # fmt: skip
    if cos.ndim != 2 or cos.shape != sin.shape or cos.shape[1] != D or cos.shape[0] > N:
        raise ValueError(f"cos and sin must both be [Np, {D}] with Np <= N = {N} for qkv {tuple(qkv.shape)}, "
                         f"got cos {tuple(cos.shape)} and sin {tuple(sin.shape)}")  # fmt: skip


def rope_qkv_launch(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Run the kernel: qkv [B, N, 3, H, D] (any strides), cos, sin [Np, D] -> out [B, N, 3, H, D]
    (contiguous, written in place): q and k of the last Np tokens rotated (rotate-half layout, or
    `interleaved`), the rest copied."""
    check_shapes(qkv, cos, sin)
    B, N, _, H, D = qkv.shape
    if qkv.dtype not in DTYPES:
        raise ValueError(f"RoPE supports fp16/bf16/fp32 qkv, got {qkv.dtype}")
    if cos.dtype != sin.dtype or cos.dtype not in (torch.float32, qkv.dtype):
        raise ValueError(f"cos and sin must both be torch.float32 or qkv's {qkv.dtype}, got {cos.dtype} and {sin.dtype}")
    if out.shape != qkv.shape or out.dtype != qkv.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {qkv.dtype} tensor of shape {tuple(qkv.shape)}, got {tuple(out.shape)} {out.dtype}")
    M = B * N
    out4 = out.view(M, 3, H, D)
    if max(span(qkv, slice(2, None)), span(out4, slice(1, None))) > INT32_MAX:
        raise InputError(f"RoPE: one token's qkv {tuple(qkv.shape[2:])} spans 2^31 elements or more "
                         "(the kernel's in-row offsets are 32-bit); use fewer heads")  # fmt: skip
    if M > INT32_MAX:
        raise InputError(f"RoPE: {M} (image, token) rows exceed CUDA's grid limit (one program each); split the batch")
    check_device(qkv, cos, sin, out)
    cos, sin = cos.contiguous(), sin.contiguous()
    BLOCK_D = next_pow2(D)
    BLOCK_H = min(next_pow2(H), max(MAX_TILE // BLOCK_D, 1))
    num_warps = min(max(BLOCK_H * BLOCK_D // 256, 1), 8)  # one tile at a time: more warps for bigger tiles
    wrap_triton(_rope_qkv_kernel, qkv)[(M,)](
        qkv, cos, sin, out4,
        *qkv.stride(), *out4.stride()[:3],
        N, H, N - cos.shape[0],
        HEAD_DIM=D, BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D, INTERLEAVED=bool(interleaved), num_warps=num_warps,
    )  # fmt: skip
    return out


@vitfast_op("rope_qkv")
def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """qkv [B, N, 3, H, D] -> a new contiguous [B, N, 3, H, D]: q and k of the last Np tokens
    rotated by cos, sin [Np, D] in the rotate-half layout (DINOv3) or `interleaved` (EVA-02, timm);
    a torch op, so it composes with torch.compile."""
    check_shapes(qkv, cos, sin)
    if runs_reference(qkv):
        return rope_reference(qkv, cos, sin, interleaved)
    out = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    return rope_qkv_launch(qkv, cos, sin, out, interleaved)


def rope_reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Plain PyTorch on q and k of qkv [B, N, 3, H, D], the same operations in the same order as
    transformers' DINOv3 `apply_rotary_pos_emb` or (`interleaved`) timm's `apply_rot_embed_cat(x, emb,
    half=False)`: in qkv's dtype, or in fp32 with fp32 cos / sin, then rounded to qkv's dtype. A new
    contiguous tensor."""
    N, Np, D = qkv.shape[1], cos.shape[0], qkv.shape[-1]
    qk, v = qkv[:, :, :2], qkv[:, :, 2:]
    prefix, patches = qk[:, : N - Np], qk[:, N - Np :]
    cos, sin = cos[:, None, None, :], sin[:, None, None, :]  # [Np, 1, 1, D]: over q / k and the heads
    if interleaved:  # timm's rot(x)
        rotated = torch.stack((-patches[..., 1::2], patches[..., ::2]), dim=-1).reshape(patches.shape)
    else:  # transformers' rotate_half(x)
        rotated = torch.cat((-patches[..., D // 2 :], patches[..., : D // 2]), dim=-1)
    patches = ((patches * cos) + (rotated * sin)).to(qkv.dtype)
    return torch.cat((torch.cat((prefix, patches), dim=1), v), dim=2)
