"""Flash-style fused attention forward (inference) straight from the packed qkv projection.

q, k and v are read from the qkv Linear's output `[B, N, 3, H, D]` through strides (no
permute/contiguous copies) and the result is written as `[B, N, H*D]`, ready for the output
projection. Online softmax in base 2 with fp32 statistics and accumulation; any N, any head
dim up to 256 (non powers of two by masking), fp16 / bf16 / fp32.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from ._common import INTERPRET, check_device, next_pow2, runs_reference

LOG2E = 1.0 / math.log(2.0)  # exp(x) = exp2(x / ln 2): folded into the softmax scale


def _configs() -> list[triton.Config]:
    if INTERPRET:  # the interpreter is slow and gains nothing from tuning: one config
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=1)]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm in (64, 128)
        for bn in (32, 64, 128)
        for w in (4, 8)
        for s in (2, 3, 4)
        if not (bm == 128 and bn == 128 and s == 4)  # exceeds shared memory at D = 128
    ]


@triton.autotune(configs=_configs(), key=["N", "HEAD_DIM"])  # tensor dtypes are part of the key too
@triton.jit
def _attention_fwd_kernel(
    QKV, Out,
    stride_b, stride_n, stride_3, stride_h, stride_d,  # qkv [B, N, 3, H, D]
    stride_ob, stride_on, stride_oh, stride_od,  # out viewed as [B, N, H, D]
    N, H, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IEEE_FP32: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < N
    mask_d = offs_d < HEAD_DIM
    base = QKV + b * stride_b + h * stride_h

    # -- load the query tile once (scores are scaled in fp32 after the dot, by scale * log2(e))
    q = tl.load(
        base + offs_m[:, None] * stride_n + offs_d[None, :] * stride_d,
        mask=mask_m[:, None] & mask_d[None, :], other=0.0,
    )  # fmt: skip

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running row max (base 2)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running softmax denominator
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # -- stream over key/value tiles with the online softmax
    for start_n in range(0, N, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < N
        k = tl.load(
            base + stride_3 + cols[None, :] * stride_n + offs_d[:, None] * stride_d,
            mask=mask_n[None, :] & mask_d[:, None], other=0.0,
        )  # fmt: skip  # [BLOCK_D, BLOCK_N]
        if IEEE_FP32:
            s = tl.dot(q, k, input_precision="ieee") * qk_scale
        else:
            s = tl.dot(q, k) * qk_scale
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)  # rescales what was accumulated under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            base + 2 * stride_3 + cols[:, None] * stride_n + offs_d[None, :] * stride_d,
            mask=mask_n[:, None] & mask_d[None, :], other=0.0,
        )  # fmt: skip  # [BLOCK_N, BLOCK_D]
        if IEEE_FP32:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # -- normalise and write [B, N, H*D]
    acc = acc / l_i[:, None]
    out_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def attention_launch(qkv: torch.Tensor, out: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Run the kernel: qkv [B, N, 3, H, D] (any strides) -> out [B, N, H*D] (written in place)."""
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        raise ValueError(f"fused attention expects qkv of shape [B, N, 3, H, D], got {tuple(qkv.shape)}")
    B, N, _, H, D = qkv.shape
    if not 1 <= D <= 256:
        raise ValueError(f"fused attention supports head_dim 1..256, got {D}")
    if qkv.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"fused attention supports fp16/bf16/fp32, got {qkv.dtype}")
    if out.shape != (B, N, H * D) or out.dtype != qkv.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a [B, N, H*D] {qkv.dtype} tensor with unit last stride, got {tuple(out.shape)} {out.dtype}")
    check_device(qkv, out)
    scale = D**-0.5 if scale is None else scale
    out4 = out.view(B, N, H, D)

    def grid(meta):
        return (triton.cdiv(N, meta["BLOCK_M"]), B * H)

    wrap_triton(_attention_fwd_kernel)[grid](
        qkv, out4,
        *qkv.stride(), *out4.stride(),
        N, H, scale * LOG2E,
        HEAD_DIM=D, BLOCK_D=max(next_pow2(D), 16), IEEE_FP32=qkv.dtype == torch.float32,
    )  # fmt: skip
    return out


@triton_op("vitfast::fused_attention", mutates_args=())
def fused_attention(qkv: torch.Tensor, scale: float) -> torch.Tensor:
    """qkv [B, N, 3, H, D] -> [B, N, H*D]; a torch op, so it composes with torch.compile."""
    if runs_reference(qkv):
        return attention_reference(qkv, scale)
    B, N, _, H, D = qkv.shape
    out = torch.empty((B, N, H * D), dtype=qkv.dtype, device=qkv.device)
    return attention_launch(qkv, out, scale)


def attention_reference(qkv: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Plain PyTorch: softmax(q k^T * scale) v, qkv [B, N, 3, H, D] -> [B, N, H*D], in qkv's dtype."""
    B, N, _, H, D = qkv.shape
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, N, D]
    scale = D**-0.5 if scale is None else scale
    attn = torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1)
    return (attn @ v).transpose(1, 2).reshape(B, N, H * D)
