"""GEMM + bias + LayerScale + residual add + LayerNorm (or RMSNorm) of the result, in one launch.

    r = residual + gamma * (x @ W^T + bias)        (bias, gamma optional: gamma is the branch's LayerScale)
    out = LayerNorm(r) with (ln_weight, ln_bias, eps), or RMSNorm(r) with (ln_weight, eps) (AIMv2)

A ViT block's attention projection and fc2 end this way: the new residual stream and the next
norm's output, the input of the next GEMM. Each program owns BLOCK_M whole rows (the norm needs
the full row): it sweeps the N columns in BLOCK_N chunks (GEMM, epilogue, store r, merge the
chunk's mean and M2 into the row's running ones, Chan et al.'s parallel variance; for RMSNorm
a running sum of squares), then normalises the r it stored. Statistics are taken from r as
stored (rounded to the I/O dtype), so out = norm(r) exactly as a separate norm would see r.
fp32 accumulation, IEEE fp32 products for fp32 inputs; fp16 / bf16 / fp32. Whether this beats
cuBLAS + the add+LayerNorm kernel is a per-shape measurement (benchmarks/gpu_proof.py,
kernels/mlp_dispatch.json).

On Hopper (sm_90), fp16 / bf16, eager calls, the launcher takes a form whose x and W tiles move by
TMA with 64-wide K steps (`_linear_residual_layernorm_tma_kernel`): on the first H100 run the
pointer kernel, whose K steps are 32 wide so that fp32 fits 99 KB parts, ran proj / fc2 + LayerNorm
at 0.37-0.6x of cuBLAS + the add+LayerNorm kernel at batch 256. Both passes' epilogues are shared
(`residual_chunk`, `normalise_rows`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, autotune, check_device, next_pow2, require_fitting_config, rows_view, runs_reference, vitfast_op, wrap_triton
from .linear_epilogue import (branch_tile, check_column_offsets, ensure_tma_allocator, gemm_tile, linear_epilogue_reference,
                              shared_memory_bytes, takes_tma)  # fmt: skip


def _configs() -> list[triton.Config]:
    if INTERPRET:  # the interpreter is slow and gains nothing from tuning: one small config
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4, num_stages=1)]
    # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_K 32 keeps fp32 tiles within
    # sm_89's 99 KB of shared memory
    tiles = [(64, 128, 32, 4, 3), (128, 128, 32, 8, 3), (32, 128, 32, 4, 4), (128, 64, 32, 4, 3), (64, 64, 32, 4, 4)]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in tiles
    ]


@triton.jit
def residual_chunk(acc, Bias, Gamma, Res, ResOut, offs_m, mask_m, n0, N, stride_rm, stride_om, count, mean, m2,
                   HAS_BIAS: tl.constexpr, HAS_GAMMA: tl.constexpr, RMS: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Pass 1's epilogue for the GEMM chunk acc [BLOCK_M, BLOCK_N] (fp32) of columns n0...: r = residual +
    gamma * (acc + bias), stored, and merged into the rows' running (count, mean, m2) (Chan et al.; for
    RMSNorm m2 is the sum of squares and mean stays 0). Statistics from r as stored (rounded)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    acc = branch_tile(acc, Bias, Gamma, offs_n, N, HAS_BIAS, 0, 1 + HAS_GAMMA, False)  # + bias, * gamma: linear_epilogue's RESIDUAL 1 / 2
    mask = mask_m[:, None] & mask_n[None, :]
    acc += tl.load(Res + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    r = acc.to(ResOut.dtype.element_ty)
    tl.store(ResOut + offs_m[:, None] * stride_om + offs_n[None, :], r, mask=mask)
    r = tl.where(mask_n[None, :], r.to(tl.float32), 0.0)
    if RMS:
        m2 += tl.sum(r * r, axis=1)
    else:
        n_b = tl.minimum(N - n0, BLOCK_N).to(tl.float32)
        mean_b = tl.sum(r, axis=1) / n_b
        d = tl.where(mask_n[None, :], r - mean_b[:, None], 0.0)
        m2_b = tl.sum(d * d, axis=1)
        total = count + n_b
        delta = mean_b - mean
        mean += delta * (n_b / total)
        m2 += m2_b + delta * delta * (count * n_b / total)
        count = total
    return count, mean, m2


@triton.jit
def normalise_rows(ResOut, Out, LnW, LnB, offs_m, mask_m, mean, m2, N, eps, stride_om, RMS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pass 2: normalise the r this program stored (L2-resident: it has just written it) into Out."""
    rstd = tl.math.rsqrt(m2 / N + tl.cast(eps, tl.float32))  # eps is fp64 under Inductor
    tl.debug_barrier()  # this program's stores of r are visible to all its threads
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        mask = mask_m[:, None] & mask_n[None, :]
        r = tl.load(ResOut + offs_m[:, None] * stride_om + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        w = tl.load(LnW + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        y = (r - mean[:, None]) * rstd[:, None] * w[None, :]
        if not RMS:
            y += tl.load(LnB + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(Out + offs_m[:, None] * stride_om + offs_n[None, :], y.to(Out.dtype.element_ty), mask=mask)


# tensor dtypes are part of the key too; configs too big for the device's shared memory are
# dropped before tuning (the x / W tile pipeline is linear_epilogue's, so is its estimate)
@autotune(configs=_configs(), key=["M_BUCKET", "N", "K", "HAS_BIAS", "RMS"], estimate=shared_memory_bytes)
@triton.jit(do_not_specialize=["M_BUCKET"])  # a tuning key only: no recompile per bucket
def _linear_residual_layernorm_kernel(
    X, W, Bias, Gamma, Res, LnW, LnB, ResOut, Out,
    M, N, K, M_BUCKET, eps,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_rm, stride_om,  # ResOut and Out: same row stride
    HAS_BIAS: tl.constexpr, HAS_GAMMA: tl.constexpr,
    RMS: tl.constexpr,  # RMSNorm: statistics without centring, no LnB
    IEEE_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    rows = offs_m % M  # rows past the edge read valid ones; their results are never stored
    offs_k = tl.arange(0, BLOCK_K)
    count = tl.zeros([BLOCK_M], dtype=tl.float32)
    mean = tl.zeros([BLOCK_M], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_M], dtype=tl.float32)

    # -- pass 1: per column chunk, GEMM + epilogue, store r, merge the chunk's statistics
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        x_ptrs = X + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk
        w_ptrs = W + (offs_n % N)[None, :] * stride_wn + offs_k[:, None] * stride_wk
        acc = gemm_tile(x_ptrs, w_ptrs, K, stride_xk, stride_wk, IEEE_FP32, BLOCK_M, BLOCK_N, BLOCK_K)
        count, mean, m2 = residual_chunk(acc, Bias, Gamma, Res, ResOut, offs_m, mask_m, n0, N, stride_rm, stride_om, count, mean, m2,
                                         HAS_BIAS, HAS_GAMMA, RMS, BLOCK_N)  # fmt: skip
    # -- pass 2
    normalise_rows(ResOut, Out, LnW, LnB, offs_m, mask_m, mean, m2, N, eps, stride_om, RMS, BLOCK_N)


# ---------------------------------------------------------------------------- the Hopper form (sm_90): TMA operands
def _tma_configs() -> list[triton.Config]:
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4, num_stages=1)]
    # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): wgmma tiles with 64-wide K steps (the pointer
    # kernel keeps 32 for fp32 on 99 KB parts); 64-row tiles so that batch 1 still has a program per SM
    tiles = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s) for bm, bn, bk, w, s in tiles]


def tma_shared_memory_bytes(config: triton.Config, args: dict, capability: int) -> int:
    """Upper estimate, checked against the compiled kernels on sm_90a (tests/test_aot_compile.py):
    num_stages x and W tiles and 1 KB of barriers and scratch; no TMA before sm_90 (no config fits)."""
    if capability < 90:
        return 1 << 40
    kw = config.kwargs
    return config.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * args["X"].element_size() + 1024


@autotune(configs=_tma_configs(), key=["M_BUCKET", "N", "K", "HAS_BIAS", "RMS"], estimate=tma_shared_memory_bytes)
@triton.jit(do_not_specialize=["M_BUCKET"])
def _linear_residual_layernorm_tma_kernel(
    X, W, Bias, Gamma, Res, LnW, LnB, ResOut, Out,
    M, N, K, M_BUCKET, eps,
    stride_xm, stride_wn, stride_rm, stride_om,
    HAS_BIAS: tl.constexpr, HAS_GAMMA: tl.constexpr, RMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """As `_linear_residual_layernorm_kernel`, x and W tiles by TMA (rows, columns and K past the edge
    read as zero); r and out by plain stores, since pass 2 reads r back in this program."""
    x_desc = tl.make_tensor_descriptor(X, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(W, shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
    row = tl.program_id(0) * BLOCK_M
    offs_m = row.to(tl.int64) + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    count = tl.zeros([BLOCK_M], dtype=tl.float32)
    mean = tl.zeros([BLOCK_M], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            acc = tl.dot(x_desc.load([row, k]), w_desc.load([n0, k]).T, acc)
        count, mean, m2 = residual_chunk(acc, Bias, Gamma, Res, ResOut, offs_m, mask_m, n0, N, stride_rm, stride_om, count, mean, m2,
                                         HAS_BIAS, HAS_GAMMA, RMS, BLOCK_N)  # fmt: skip
    normalise_rows(ResOut, Out, LnW, LnB, offs_m, mask_m, mean, m2, N, eps, stride_om, RMS, BLOCK_N)


def linear_residual_layernorm_launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    gamma: torch.Tensor | None,
    ln_weight: torch.Tensor,
    ln_bias: torch.Tensor | None,
    eps: float,
    residual_out: torch.Tensor,
    out: torch.Tensor,
    rms: bool = False,
    kernel: str = "auto",
) -> None:
    """x [..., K], weight [N, K], residual [..., N] -> residual_out = residual + gamma * (x @ W^T + bias),
    out = LayerNorm(residual_out) (both written in place; contiguous, not `residual` itself).
    bias and gamma [N] are optional; `rms=True`: out = RMSNorm(residual_out), ln_bias None.
    `kernel`: as linear_epilogue_launch's ("auto": the TMA kernel on Hopper in eager calls when x and
    weight are TMA-ready)."""
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x [..., K] and weight [N, K] must agree on K, got {tuple(x.shape)} and {tuple(weight.shape)}")
    N, K = weight.shape
    out_shape = (*x.shape[:-1], N)
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"linear + LayerNorm supports fp16/bf16/fp32, got {x.dtype}")
    if rms != (ln_bias is None):
        raise ValueError("RMSNorm takes no bias, LayerNorm needs one: pass ln_bias=None exactly when rms=True")
    named = {"weight": weight, "bias": bias, "residual": residual, "gamma": gamma, "ln_weight": ln_weight,
             "ln_bias": ln_bias, "residual_out": residual_out, "out": out}  # fmt: skip
    wrong_dtype = [f"{k} {t.dtype}" for k, t in named.items() if t is not None and t.dtype != x.dtype]
    if wrong_dtype:
        raise ValueError(f"all tensors must be {x.dtype} like x, got {', '.join(wrong_dtype)}")
    vectors = {"bias": bias, "gamma": gamma, "ln_weight": ln_weight, "ln_bias": ln_bias}
    wrong_shape = [f"{k} {tuple(t.shape)}" for k, t in vectors.items() if t is not None and t.shape != (N,)]
    if wrong_shape:
        raise ValueError(f"bias, gamma and the LayerNorm weight/bias must be [{N}], got {', '.join(wrong_shape)}")
    if residual.shape != out_shape:
        raise ValueError(f"residual must be {out_shape}, got {tuple(residual.shape)}")
    for name, t in (("residual_out", residual_out), ("out", out)):
        if t.shape != out_shape or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous tensor of shape {out_shape}, got {tuple(t.shape)}")
    if residual is residual_out:  # (no data_ptr() here: torch.compile traces this with fake tensors)
        raise ValueError("residual_out must not be residual itself (the autotuner runs the kernel more than once)")
    check_device(*[t for t in (x, *named.values()) if t is not None])
    M = math.prod(x.shape[:-1])
    if M == 0 or N == 0:
        return
    x2 = x.reshape(M, K)
    tma = takes_tma(kernel, "linear + LayerNorm", x2, weight)
    if x.is_cuda and not tma:
        require_fitting_config(_linear_residual_layernorm_kernel, {"X": x2}, x.device,
                               f"linear + LayerNorm ({str(x.dtype).removeprefix('torch.')})")
    res2 = rows_view(residual, N)
    ro2, out2 = residual_out.view(M, N), out.view(M, N)
    check_column_offsets("linear + LayerNorm", weight, x2, res2, ro2, out2)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]),)

    # an absent bias / gamma / ln_bias is never read: weight stands in for it
    vectors = (bias if bias is not None else weight, gamma if gamma is not None else weight, res2,
               ln_weight, ln_bias if ln_bias is not None else weight, ro2, out2)  # fmt: skip
    flags = dict(HAS_BIAS=bias is not None, HAS_GAMMA=gamma is not None, RMS=rms)
    if tma:
        ensure_tma_allocator(x2)
        wrap_triton(_linear_residual_layernorm_tma_kernel, x2)[grid](
            x2, weight, *vectors, M, N, K, next_pow2(M), eps, x2.stride(0), weight.stride(0), res2.stride(0), out2.stride(0), **flags
        )
        return
    wrap_triton(_linear_residual_layernorm_kernel, x2)[grid](
        x2, weight, *vectors, M, N, K, next_pow2(M), eps, *x2.stride(), *weight.stride(), res2.stride(0), out2.stride(0),
        **flags, IEEE_FP32=x.dtype == torch.float32,
    )  # fmt: skip


def _linear_residual_norm(x, weight, bias, residual, gamma, ln_weight, ln_bias, eps, rms):
    """Both ops' body: (r, LayerNorm(r) or RMSNorm(r)) with r = residual + gamma * (x @ weight^T + bias)."""
    if runs_reference(x):
        if rms:
            return linear_residual_rmsnorm_reference(x, weight, bias, residual, gamma, ln_weight, eps)
        return linear_residual_layernorm_reference(x, weight, bias, residual, gamma, ln_weight, ln_bias, eps)
    shape = (*x.shape[:-1], weight.shape[0])
    residual_out = torch.empty(shape, dtype=x.dtype, device=x.device)
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    linear_residual_layernorm_launch(x, weight, bias, residual, gamma, ln_weight, ln_bias, eps, residual_out, out, rms=rms)
    return residual_out, out


@vitfast_op("linear_residual_layernorm")
def linear_residual_layernorm(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor, gamma: Optional[torch.Tensor],
    ln_weight: torch.Tensor, ln_bias: torch.Tensor, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, LayerNorm(r)) with r = residual + gamma * (x @ weight^T + bias) (bias None: 0, gamma None: 1), as one torch op."""
    return _linear_residual_norm(x, weight, bias, residual, gamma, ln_weight, ln_bias, eps, rms=False)


@vitfast_op("linear_residual_rmsnorm")
def linear_residual_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor, gamma: Optional[torch.Tensor],
    ln_weight: torch.Tensor, eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, RMSNorm(r)) with r = residual + gamma * (x @ weight^T + bias) (bias None: 0, gamma None: 1), as one torch op."""
    return _linear_residual_norm(x, weight, bias, residual, gamma, ln_weight, None, eps, rms=True)


def linear_residual_layernorm_reference(x, weight, bias, residual, gamma, ln_weight, ln_bias, eps):
    """Plain PyTorch, rounding after every step like the reference block: linear, LayerScale, add, LayerNorm."""
    r = linear_epilogue_reference(x, weight, bias, residual=residual, gamma=gamma)
    return r, torch.nn.functional.layer_norm(r, (r.shape[-1],), ln_weight, ln_bias, eps)


def linear_residual_rmsnorm_reference(x, weight, bias, residual, gamma, ln_weight, eps):
    """As linear_residual_layernorm_reference, ending in rms_norm (what nn.RMSNorm runs)."""
    r = linear_epilogue_reference(x, weight, bias, residual=residual, gamma=gamma)
    return r, torch.nn.functional.rms_norm(r, (r.shape[-1],), ln_weight, eps)
