"""Tiled GEMM `x @ W^T + bias` (bias optional) with the MLP's elementwise work as its epilogue.

- fc1: gelu(x @ W^T + bias), any form of bias_gelu.py (erf, tanh, sigmoid), so the 4x-wide
  activation is written once instead of written by the GEMM, then read and written again by
  bias + GELU.
- fc2: residual + gamma * (x @ W^T + bias), gamma being the block's LayerScale (optional), so
  the branch output is never written and read back for the residual add.

x [..., K] (leading dims flattened; a 2-D x is read through its strides as it is) and W [N, K]
as nn.Linear stores it (read through its strides: never transposed or copied). fp32
accumulation (IEEE fp32 products for fp32 inputs, no TF32), one rounding to the output dtype at
the end; masked edges for any M, N, K; fp16 / bf16 / fp32. Whether this beats cuBLAS plus the
standalone kernels is a per-shape measurement (`benchmarks/gpu_kernels.py`), and FusedBlock
uses it only where that measurement says so (vitfast/fused.py, kernels/mlp_dispatch.json).

Two kernels compute it. The pointer kernel runs everywhere. On Hopper (sm_90), fp16 / bf16, the
launcher takes a persistent form whose tiles move by TMA instead (`_linear_epilogue_tma_kernel`;
the first H100 run timed the pointer kernel's fc1 + GELU at ~55% of cuBLAS's GEMM rate, below the
~62% at which the fused GELU pays for itself: benchmarks/NOTES.md):
- x, W, the residual and the output move through TMA descriptors made on the device
  (`tl.make_tensor_descriptor`): bulk async copies, no address arithmetic or masks per element
  (rows and K columns past the edge read as zero, stores past it are dropped by the copy engine),
  the operand tiles landing in shared memory laid out for wgmma;
- one or two programs per SM (the config's PER_SM) walk the output tiles (grouped order, so W stays
  in L2) in one flattened loop, so the next tile's loads are in flight while this tile's epilogue
  runs (and, two per SM, the other program's main loop);
- the wide 128x256 tile stores its result in two 128-column halves: half the epilogue's staging
  memory, room for a fourth pipeline stage.
It is taken in eager calls when every operand meets TMA's rules (`tma_ready`), unless the
environment sets VITFAST_TMA=0 (the pointer kernels everywhere: the way out should a driver or
Triton version mishandle TMA; the GPU proof sets it when its TMA check fails); under
torch.compile / torch.export the pointer kernel runs, whose launch needs no device-side scratch
memory. The GPU proof's fc1 rows time both beside cuBLAS.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Optional

import torch
import triton
import triton.language as tl

from vitfast.errors import InputError

from ._common import (BLOCK_RESERVED_SHARED, INT32_MAX, INTERPRET, autotune, check_device, next_pow2, require_fitting_config,
                      runs_reference, shared_memory_budget, span, tracing, vitfast_op, wrap_triton)  # fmt: skip
from .bias_gelu import GELU_FORMS, gelu_reference
from .bias_gelu import gelu as gelu_tile

ACTIVATIONS = {None: 0} | {form: 1 + code for form, code in GELU_FORMS.items()}  # ACTIVATION: no GELU, or 1 + FORM
KERNELS = ("auto", "tma", "pointer")  # linear_epilogue_launch's `kernel`
INTERPRETED_PROGRAMS = 3  # the TMA kernel's persistent grid under the interpreter: several tiles per program
HOPPER_SM_SHARED = 233472  # shared memory per SM on sm_90 (228 KB), which PER_SM programs share (with BLOCK_RESERVED_SHARED each)
TMA_ALIGN = 16  # TMA's rule for a tensor it reads or writes: 16-byte aligned base and row stride (and unit column stride)


def _configs() -> list[triton.Config]:
    if INTERPRET:  # the interpreter is slow and gains nothing from tuning: one small config
        return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4}, num_warps=4, num_stages=1)]
    # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): large tiles for the big-batch GEMMs,
    # smaller ones so batch 1 (M = 197) still fills the SMs. Tiles too big for the device's shared
    # memory (fp32 inputs, 99 KB parts) are dropped before tuning (`shared_memory_bytes`).
    tiles = [
        (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4),
        (128, 128, 64, 4, 4), (128, 128, 32, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
        (64, 64, 64, 4, 4), (64, 256, 32, 4, 4), (64, 64, 32, 4, 2),
    ]  # fmt: skip
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in tiles
    ]


def shared_memory_bytes(config: triton.Config, args: dict, capability: int) -> int:
    """Upper estimate of the kernel's shared memory for one config, fitted to and checked against
    the compiled kernels' `metadata.shared` on sm_80/89/90a (tests/test_aot_compile.py): buffered
    x and W tiles, num_stages of them for fp16/bf16 on Hopper, num_stages - 1 with cp.async before
    it and for fp32."""
    elsize, kw = args["X"].element_size(), config.kwargs
    buffers = config.num_stages if capability >= 90 and elsize == 2 else config.num_stages - 1
    return max(buffers, 1) * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * elsize


@triton.jit
def gemm_tile(x_ptrs, w_ptrs, K, stride_xk, stride_wk, IEEE_FP32: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """The K loop: x tile [BLOCK_M, BLOCK_K] (pointers) times W^T tile [BLOCK_K, BLOCK_N] summed over
    K into an fp32 [BLOCK_M, BLOCK_N] accumulator; the K tail is masked to zero."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k
        a = tl.load(x_ptrs, mask=mask_k[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=mask_k[:, None], other=0.0)
        if IEEE_FP32:  # fp32 inputs: IEEE products, not TF32
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit
def grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of linear tile index `tile`: GROUP_M row tiles sweep the columns together."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile // per_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@triton.jit
def branch_tile(acc, Bias, Gamma, offs_n, N, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr,
                OUT_16BIT: tl.constexpr):  # fmt: skip
    """The epilogue before the residual add, on an fp32 [rows, len(offs_n)] tile of columns offs_n:
    + bias, then GELU (ACTIVATION > 0; its fast form for a 16-bit output) or the LayerScale gamma (RESIDUAL == 2)."""
    mask_n = offs_n < N
    if HAS_BIAS:
        acc += tl.load(Bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if ACTIVATION > 0:
        acc = gelu_tile(acc, ACTIVATION - 1, OUT_16BIT)
    if RESIDUAL == 2:
        acc *= tl.load(Gamma + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    return acc


# Keyed on the GEMM shape (M by power-of-two bucket, so a new batch size does not always retune)
# and the epilogue; tensor dtypes are part of the key too.
@autotune(configs=_configs(), key=["M_BUCKET", "N", "K", "HAS_BIAS", "ACTIVATION", "RESIDUAL"], estimate=shared_memory_bytes)
@triton.jit(do_not_specialize=["M_BUCKET"])  # a tuning key only: no recompile per bucket
def _linear_epilogue_kernel(
    X, W, Bias, Res, Gamma, Out,
    M, N, K, M_BUCKET,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_rm, stride_rn, stride_om, stride_on,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # 0: none, else GELU of form ACTIVATION - 1 (bias_gelu.GELU_FORMS)
    RESIDUAL: tl.constexpr,  # 0: none, 1: + Res, 2: Res + Gamma * (...)
    IEEE_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    # -- grouped tile order, so W stays in L2
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    # row offsets in int64 (rows * stride passes 2^31 elements at large batches); column and K
    # offsets stay int32 (the launcher checks they fit)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # rows / columns past the edge wrap around to valid ones (loads need no mask on M and N);
    # their results are never stored
    x_ptrs = X + (offs_m % M)[:, None] * stride_xm + offs_k[None, :] * stride_xk  # [BLOCK_M, BLOCK_K]
    w_ptrs = W + (offs_n % N)[None, :] * stride_wn + offs_k[:, None] * stride_wk  # W^T tile [BLOCK_K, BLOCK_N]

    acc = gemm_tile(x_ptrs, w_ptrs, K, stride_xk, stride_wk, IEEE_FP32, BLOCK_M, BLOCK_N, BLOCK_K)

    # -- epilogue in fp32 registers: bias, then GELU or the (scaled) residual add; one rounding
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    acc = branch_tile(acc, Bias, Gamma, offs_n, N, HAS_BIAS, ACTIVATION, RESIDUAL, Out.dtype.element_ty != tl.float32)
    if RESIDUAL > 0:
        res_ptrs = Res + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn
        acc += tl.load(res_ptrs, mask=mask, other=0.0).to(tl.float32)
    out_ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------- the Hopper form (sm_90): persistent, TMA
def _tma_configs() -> list[triton.Config]:
    if INTERPRET:  # one small config, the wide tile's split store and the grid's PER_SM included
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4, "SPLIT_N": 2, "PER_SM": 2}, num_warps=4, num_stages=1)]
    # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_N, PER_SM): the wgmma tiles of Triton's Hopper
    # matmul tutorial (128 rows, 128 or 256 columns) for the large batches, 64-row tiles so batch 1
    # (M = 197) still spreads over the SMs. PER_SM = 2: two programs share each SM, so one's epilogue
    # (GELU on its whole tile, the store) runs while the other's wgmma main loop does, as cuBLAS's
    # ping-pong kernels overlap them with two consumer warpgroups; one program per SM leaves the tensor
    # cores idle for its epilogue (the first H100 profile: fc1 + GELU at 467 TFLOP/s, cuBLASLt's tanh
    # epilogue 588). Those tiles fit two per SM on sm_90a: 115 KB of shared memory each (of 228 KB), 101 and
    # 178 registers (`python -m vitfast.kernels.aot` checks both). No 4-warp 128x128 tile with one program per
    # SM: it spills in the GELU epilogue (204 bytes at 255 registers with libdevice's erf; 4-8 bytes with the
    # erfc form, sm_90a) and leaves half of the SM's warp slots empty.
    tiles = [
        (128, 256, 64, 8, 3, 2, 1), (128, 256, 64, 8, 4, 2, 1), (128, 128, 64, 8, 4, 1, 1), (128, 128, 128, 8, 3, 1, 1),
        (128, 128, 64, 8, 3, 2, 2), (128, 128, 64, 4, 3, 2, 2), (64, 128, 64, 4, 4, 1, 1), (64, 64, 64, 4, 4, 1, 1),
    ]  # fmt: skip
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SPLIT_N": split, "PER_SM": per_sm},
                      num_warps=w, num_stages=s)
        for bm, bn, bk, w, s, split, per_sm in tiles
    ]


def tma_shared_memory_bytes(config: triton.Config, args: dict, capability: int) -> int:
    """Upper estimate of one program's shared memory, checked against the compiled kernels'
    `metadata.shared` on sm_90a (tests/test_aot_compile.py): num_stages x and W tiles, the output
    staging tile (and the residual's), and 1 KB for the pipeline's barriers. No TMA before sm_90, and
    no room for a PER_SM = 2 config's second program (the fc2 epilogue's residual tile doubles its staging):
    larger than any budget there, so the prune drops them."""
    if capability < 90:
        return 1 << 40
    elsize, kw = args["X"].element_size(), config.kwargs
    operands = config.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * elsize
    staging = kw["BLOCK_M"] * kw["BLOCK_N"] // kw["SPLIT_N"] * elsize * (2 if args["RESIDUAL"] else 1)
    one = operands + staging + 1024
    return one if kw["PER_SM"] * (one + BLOCK_RESERVED_SHARED) <= HOPPER_SM_SHARED else 1 << 40


@triton.jit
def _epilogue_store(acc, out_desc, res_desc, Bias, Gamma, row, col, N,
                    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """acc [BLOCK_M, BLOCK_N] fp32 at (row, col) of the output: bias, GELU or the (scaled) residual, one rounding, TMA store."""
    acc = branch_tile(acc, Bias, Gamma, col + tl.arange(0, BLOCK_N), N, HAS_BIAS, ACTIVATION, RESIDUAL, out_desc.dtype != tl.float32)
    if RESIDUAL > 0:
        acc += res_desc.load([row, col]).to(tl.float32)
    out_desc.store([row, col], acc.to(out_desc.dtype))


# Same tuning key as the pointer kernel: shape (M by power-of-two bucket) and epilogue; dtypes too.
@autotune(configs=_tma_configs(), key=["M_BUCKET", "N", "K", "HAS_BIAS", "ACTIVATION", "RESIDUAL"], estimate=tma_shared_memory_bytes)
@triton.jit(do_not_specialize=["M_BUCKET"])
def _linear_epilogue_tma_kernel(
    X, W, Bias, Res, Gamma, Out,
    M, N, K, M_BUCKET,
    stride_xm, stride_wn, stride_rm, stride_om,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # 0: none, else GELU of form ACTIVATION - 1 (bias_gelu.GELU_FORMS)
    RESIDUAL: tl.constexpr,  # 0: none, 1: + Res, 2: Res + Gamma * (...)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_N: tl.constexpr,  # the output tile is stored in SPLIT_N (1 or 2) column pieces
    PER_SM: tl.constexpr,  # persistent programs per SM (1 or 2): read by the launcher's grid only
):  # fmt: skip
    # -- descriptors: global shapes and strides, so the copy engine handles every edge
    STORE_N: tl.constexpr = BLOCK_N // SPLIT_N
    x_desc = tl.make_tensor_descriptor(X, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(W, shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
    out_desc = tl.make_tensor_descriptor(Out, shape=[M, N], strides=[stride_om, 1], block_shape=[BLOCK_M, STORE_N])
    res_desc = tl.make_tensor_descriptor(Res, shape=[M, N], strides=[stride_rm, 1], block_shape=[BLOCK_M, STORE_N])

    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # the epilogue keeps its own tile counter: shared with the loads, it would tie the next tile's
    # prologue to this tile's epilogue and stop the flattened loop from overlapping them
    tile_c = pid - programs
    for tile in tl.range(pid, num_pid_m * num_pid_n, programs, flatten=True):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in range(k_tiles):
            a = x_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])  # [BLOCK_M, BLOCK_K]
            b = w_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])  # [BLOCK_N, BLOCK_K]: W as stored, transposed in the dot
            acc = tl.dot(a, b.T, acc)

        # -- epilogue in fp32 registers, stored in SPLIT_N column pieces
        tile_c += programs
        pid_m, pid_n = grouped_tile(tile_c, num_pid_m, num_pid_n, GROUP_M)
        row, col = pid_m * BLOCK_M, pid_n * BLOCK_N
        if SPLIT_N == 2:
            left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, STORE_N)), (0, 2, 1)))
            _epilogue_store(left, out_desc, res_desc, Bias, Gamma, row, col, N, HAS_BIAS, ACTIVATION, RESIDUAL, STORE_N)
            _epilogue_store(right, out_desc, res_desc, Bias, Gamma, row, col + STORE_N, N, HAS_BIAS, ACTIVATION, RESIDUAL, STORE_N)
        else:
            _epilogue_store(acc, out_desc, res_desc, Bias, Gamma, row, col, N, HAS_BIAS, ACTIVATION, RESIDUAL, STORE_N)


# ---------------------------------------------------------------------------- launchers
def check_column_offsets(what: str, weight: torch.Tensor, *rows: torch.Tensor) -> None:
    """Row offsets are 64-bit in the GEMM kernels, offsets within a row of x / residual / out [M, *]
    and within the weight are 32-bit: refuse a layout that would overflow them."""
    if max(span(weight), *(span(t, slice(1, None)) for t in rows)) > INT32_MAX:
        raise InputError(f"{what}: the weight, or one row of x / residual / out, spans 2^31 elements "
                         "or more (column offsets are 32-bit); pass contiguous rows or split the layer")


def linear_epilogue_launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    *,
    gelu: str | None = None,
    residual: torch.Tensor | None = None,
    gamma: torch.Tensor | None = None,
    kernel: str = "auto",
) -> torch.Tensor:
    """out = epilogue(x @ weight^T + bias) for x [..., K], weight [N, K], bias [N] or None (written in place).

    gelu 'none' (erf), 'tanh' or 'sigmoid' applies GELU; `residual` [..., N] adds it, the GEMM result first
    scaled by `gamma` [N] when given: out = residual + gamma * (x @ weight^T + bias). `out` is a
    contiguous [..., N] tensor that must not be `residual` itself.

    `kernel` "auto" takes the persistent TMA kernel (the Hopper form) on an sm_90 GPU outside
    traces when every operand is TMA-ready, else the pointer kernel; "tma" / "pointer" force one (tests,
    benchmarks).
    """
    if gelu not in ACTIVATIONS:
        raise ValueError(f"gelu must be None or one of {', '.join(GELU_FORMS)}, got {gelu!r}")
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x [..., K] and weight [N, K] must agree on K, got {tuple(x.shape)} and {tuple(weight.shape)}")
    N, K = weight.shape
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"linear epilogue supports fp16/bf16/fp32, got {x.dtype}")
    out_shape = (*x.shape[:-1], N)
    named = {"weight": weight, "bias": bias, "out": out, "residual": residual, "gamma": gamma}
    wrong_dtype = [f"{k} {t.dtype}" for k, t in named.items() if t is not None and t.dtype != x.dtype]
    if wrong_dtype:
        raise ValueError(f"all tensors must be {x.dtype} like x, got {', '.join(wrong_dtype)}")
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias must be [{N}], got {tuple(bias.shape)}")
    if out.shape != out_shape or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous tensor of shape {out_shape}, got {tuple(out.shape)}")
    if residual is None and gamma is not None:
        raise ValueError("gamma scales the branch of a residual add: pass residual too")
    if residual is not None and residual.shape != out_shape:
        raise ValueError(f"residual must be {out_shape}, got {tuple(residual.shape)}")
    if residual is out:  # (no data_ptr() here: torch.compile traces this with fake tensors)
        raise ValueError("out must not be residual itself (the autotuner runs the kernel more than once)")
    if gamma is not None and gamma.shape != (N,):
        raise ValueError(f"gamma must be [{N}], got {tuple(gamma.shape)}")
    check_device(*[t for t in (x, *named.values()) if t is not None])
    M = math.prod(x.shape[:-1])
    if M == 0 or N == 0:
        return out
    x2 = x.reshape(M, K)  # a view whenever the leading dims allow it; its strides are passed as they are
    out2 = out.view(M, N)
    mode = 0 if residual is None else 1 if gamma is None else 2
    res2 = residual.reshape(M, N) if residual is not None else out2  # placeholders when unused
    check_column_offsets("linear epilogue", weight, x2, res2, out2)
    if takes_tma(kernel, "linear epilogue", x2, weight, res2 if residual is not None else None, out2):
        sms = _sm_count(x.device) if x.is_cuda else INTERPRETED_PROGRAMS
        _tma_launch(x2, weight, bias, res2, gamma, out2, ACTIVATIONS[gelu], mode, sms)
        return out
    if x.is_cuda:
        require_fitting_config(_linear_epilogue_kernel, {"X": x2}, x.device, f"linear epilogue ({str(x.dtype).removeprefix('torch.')})")

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    # an absent bias / gamma is never read: weight stands in for it
    wrap_triton(_linear_epilogue_kernel, x2)[grid](
        x2, weight, bias if bias is not None else weight, res2, gamma if gamma is not None else weight, out2,
        M, N, K, next_pow2(M),
        *x2.stride(), *weight.stride(), *res2.stride(), *out2.stride(),
        HAS_BIAS=bias is not None, ACTIVATION=ACTIVATIONS[gelu], RESIDUAL=mode,
        IEEE_FP32=x.dtype == torch.float32,
    )  # fmt: skip
    return out


def tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether TMA may read / write each 2-D tensor as it is: fp16 / bf16, unit column stride, base
    and row stride 16-byte aligned (a ViT's activations and nn.Linear weights are, for widths
    divisible by 8)."""
    return all(
        t.dtype in (torch.float16, torch.bfloat16)
        and t.stride(1) == 1
        and (t.stride(0) * t.element_size()) % TMA_ALIGN == 0
        and t.data_ptr() % TMA_ALIGN == 0
        for t in tensors
    )


def takes_tma(kernel: str, what: str, *operands: torch.Tensor | None) -> bool:
    """Whether a launch of the GEMM `what` runs its TMA kernel, given the 2-D tensors that kernel moves by
    TMA (None: absent): forced ("tma", refused where it cannot run), or "auto" on compute capability >= 9.0,
    on real tensors (a trace, `tracing`, keeps the pointer kernel: the TMA kernel's launch allocates its
    descriptors' scratch), with TMA-ready operands, unless VITFAST_TMA=0 (read per call, so a running process can set it)."""
    x2 = operands[0]
    if kernel == "auto":  # the common case first, cheapest checks first: this runs on every launch
        if not x2.is_cuda or shared_memory_budget(x2.device)[0] < 90 or tracing(x2):
            return False
        if os.environ.get("VITFAST_TMA") == "0":
            return False
        return tma_ready(*(t for t in operands if t is not None))
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    tensors = [t for t in operands if t is not None]
    if kernel == "pointer":
        return False
    if kernel == "tma":
        if x2.is_cuda and shared_memory_budget(x2.device)[0] < 90:
            raise InputError(f"{what}: kernel='tma' needs a GPU of compute capability 9.0 (Hopper) or newer")
        if not tma_ready(*tensors):
            raise InputError(f"{what}: kernel='tma' needs fp16/bf16 operands with contiguous rows whose start "
                             "and row stride are 16-byte aligned (widths divisible by 8); use kernel='auto'")
    return True


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator for the descriptors' global scratch (128 bytes per descriptor and program)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_tma_allocator(x: torch.Tensor) -> None:
    """Before a TMA kernel's launch on x's device: give Triton an allocator for the device-side
    descriptors unless the caller has set one (it is per context, so a server's worker thread gets its
    own here). The interpreter needs none."""
    if not x.is_cuda:
        return
    from triton.runtime import _allocation  # private, so guarded: where it moved, always set ours

    try:
        unset = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except AttributeError:
        unset = True
    if unset:
        triton.set_allocator(_scratch)


def _tma_launch(x2, weight, bias, res2, gamma, out2, activation: int, residual_mode: int, sms: int) -> None:
    """The launch, on 2-D views already checked by `linear_epilogue_launch` (and `tma_ready`):
    x2 [M, K], weight [N, K], res2 / out2 [M, N]; `sms`: the SM count (the persistent grid is at most
    the config's PER_SM programs on each)."""
    M, K = x2.shape
    N = weight.shape[0]
    ensure_tma_allocator(x2)

    def grid(meta):
        return (min(sms * meta["PER_SM"], triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)

    wrap_triton(_linear_epilogue_tma_kernel, x2)[grid](
        x2, weight, bias if bias is not None else weight, res2, gamma if gamma is not None else weight, out2,
        M, N, K, next_pow2(M),
        x2.stride(0), weight.stride(0), res2.stride(0), out2.stride(0),
        HAS_BIAS=bias is not None, ACTIVATION=activation, RESIDUAL=residual_mode,
    )  # fmt: skip


@vitfast_op("linear_bias_gelu")
def linear_bias_gelu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], approximate: str) -> torch.Tensor:
    """gelu(x @ weight^T + bias) (bias None: 0) for x [..., K], weight [N, K], as one torch op (fc1 + bias + GELU)."""
    if runs_reference(x):
        return linear_epilogue_reference(x, weight, bias, gelu=approximate)
    out = torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype, device=x.device)
    return linear_epilogue_launch(x, weight, bias, out, gelu=approximate)


@vitfast_op("linear_bias_residual")
def linear_bias_residual(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor, gamma: Optional[torch.Tensor]
) -> torch.Tensor:
    """residual + gamma * (x @ weight^T + bias) (bias None: 0, gamma None: 1), as one torch op (fc2 + LayerScale + residual)."""
    if runs_reference(x):
        return linear_epilogue_reference(x, weight, bias, residual=residual, gamma=gamma)
    out = torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype, device=x.device)
    return linear_epilogue_launch(x, weight, bias, out, residual=residual, gamma=gamma)


def linear_epilogue_reference(x, weight, bias, gelu=None, residual=None, gamma=None):
    """Plain PyTorch, rounding after every step like the reference block: linear, GELU, LayerScale, add."""
    y = torch.nn.functional.linear(x, weight, bias)
    if gelu is not None:
        y = gelu_reference(y, gelu)
    if residual is not None:
        y = residual + (y if gamma is None else y * gamma)
    return y
