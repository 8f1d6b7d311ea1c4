"""Bias + GELU over the MLP's 4x-wide activation in one read and one write: the erf form, or one of
the two approximations of Hendrycks & Gimpel, tanh and sigmoid (x sigmoid(1.702 x), CLIP's
"QuickGELU"). The form is named as torch names GELU's `approximate`: 'none', 'tanh', 'sigmoid'.

Used after fc1 computed without its bias (cuBLAS GEMM, then this kernel). `gelu` is also the
epilogue of the Triton GEMM in linear_epilogue.py; FusedBlock picks between the two paths per
shape (see vitfast/fused.py).

16-bit outputs take a cheaper erf GELU (`gelu_erfc`): Numerical Recipes' erfc fit (fractional error
< 1.2e-7), its reciprocal and exp2 single approximate instructions on an NVIDIA GPU. On sm_90a it
compiles to 20 SASS instructions per fp16 element against 35 with libdevice's erf (loads and stores
included; `python benchmarks/gelu_sass.py`): an H200 reads and writes an fp16 element in ~28
instruction issues, so by that count libdevice's erf makes a GELU pass issue-bound there and this
one memory-bound (not yet timed on a GPU). fp32 outputs keep libdevice's erf. The inline PTX is
NVIDIA's: under the interpreter or a ROCm build the 16-bit forms divide as usual.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, check_device, elementwise_tiles, rows_view, runs_reference, vitfast_op, wrap_triton

GELU_FORMS = {"none": 0, "tanh": 1, "sigmoid": 2}  # `approximate` -> the FORM constexpr
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # 1 / ln 2: exp(v) = exp2(v / ln 2)
# Inline PTX runs on an NVIDIA GPU only: the interpreter (and a ROCm build) divide as usual instead
_PTX: tl.constexpr = tl.constexpr(not INTERPRET and torch.version.hip is None)


@triton.jit
def _div(x, d, APPROX: tl.constexpr):
    """x / d; APPROX: x times rcp.approx.ftz(d) (1 ulp of fp32) in place of Triton's fp32 division, div.full.f32
    (2 ulp, with range checks around the same reciprocal: 3 instructions per element more, `gelu_sass.py`)."""
    if APPROX and _PTX:
        y = x * tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [d], dtype=tl.float32, is_pure=True, pack=1)
    else:
        y = x / d
    return y


@triton.jit
def gelu_erfc(x):
    """x Phi(x) of an fp32 tile through erfc: Phi(x) = 1 - h for x >= 0, h for x < 0, h = erfc(z) / 2 at
    z = |x| / sqrt 2. erfc(z) = t exp(-z^2 + P(t)) with t = 1 / (1 + z/2) is Numerical Recipes' Chebyshev
    fit `erfcc` (fractional error < 1.2e-7 for every z >= 0; in fp32, <= 1e-5 relative down to |GELU| = 1e-30, from
    rounding the exponent), so the negative tail keeps its relative accuracy where 1 + erf(x / sqrt 2) cancels in
    fp32; the exponent is taken in log2 units for one exp2 (ex2.approx.ftz on a GPU, as tl.math.exp2 compiles)."""
    t = _div(1.0, 1.0 + 0.35355339059327373 * tl.abs(x), True)  # z / 2 = |x| / (2 sqrt 2)
    # P(t) / ln 2 by Horner, minus 1 for the halving (h = t 2^(P / ln 2 - 1 - z^2 / ln 2))
    p = 0.17087277 * LOG2E
    p = p * t - 0.82215223 * LOG2E
    p = p * t + 1.48851587 * LOG2E
    p = p * t - 1.13520398 * LOG2E
    p = p * t + 0.27886807 * LOG2E
    p = p * t - 0.18628806 * LOG2E
    p = p * t + 0.09678418 * LOG2E
    p = p * t + 0.37409196 * LOG2E
    p = p * t + 1.00002368 * LOG2E
    p = p * t - (1.26551223 * LOG2E + 1.0)
    h = t * tl.math.exp2(p - (0.5 * LOG2E) * x * x)  # z^2 = x^2 / 2
    return x * tl.where(x < 0, h, 1.0 - h)


@triton.jit
def gelu(x, FORM: tl.constexpr, FAST: tl.constexpr):
    """GELU of an fp32 tile: FORM 0 erf, 1 tanh approximation, 2 sigmoid approximation. FAST (a 16-bit
    output, whose rounding is ~1e3x the difference): erf through `gelu_erfc`, and the approximate reciprocal."""
    if FORM == 1:
        # tanh(u) = 2 sigmoid(2u) - 1, so 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u))
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)  # sqrt(2/pi) (x + 0.044715 x^3)
        # exp(-2u) as exp2(-2u / ln 2), the exponent capped so it cannot overflow to inf
        y = _div(x, 1.0 + tl.math.exp2(tl.minimum(-2.0 * LOG2E * u, 126.0)), FAST)
    elif FORM == 2:
        # x sigmoid(1.702 x) = x / (1 + exp(-1.702 x)), exp as exp2 (times 1/ln 2), capped as above
        y = _div(x, 1.0 + tl.math.exp2(tl.minimum(-1.702 * LOG2E * x, 126.0)), FAST)
    elif FAST:
        y = gelu_erfc(x)
    else:
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))  # x / sqrt(2)
    return y


@triton.jit
def _bias_gelu_kernel(
    X, Bias, Out, M, C, stride_x, stride_out,
    FORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # int64 rows: rows * stride passes 2^31 elements at large batches (ViT-B/16 from batch ~3,500)
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < M)[:, None] & (cols < C)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x += tl.load(Bias + cols, mask=cols < C, other=0.0).to(tl.float32)[None, :]
    y = gelu(x, FORM, Out.dtype.element_ty != tl.float32)
    tl.store(Out + rows[:, None] * stride_out + cols[None, :], y.to(Out.dtype.element_ty), mask=mask)


def bias_gelu_launch(x: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, approximate: str = "none") -> None:
    """out = gelu(x + bias) for x [..., C], bias [C]; approximate 'none' (erf), 'tanh' or 'sigmoid'."""
    C = x.shape[-1]
    if approximate not in GELU_FORMS:
        raise ValueError(f"approximate must be one of {', '.join(GELU_FORMS)}, got {approximate!r}")
    if bias.shape != (C,):
        raise ValueError(f"bias must be [{C}], got {tuple(bias.shape)}")
    if out.shape != x.shape or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous tensor of shape {tuple(x.shape)}")
    check_device(x, bias, out)
    x2 = rows_view(x, C)
    out2 = out.view(-1, C)
    BLOCK_M, BLOCK_C, grid = elementwise_tiles(x2.shape[0], C)
    wrap_triton(_bias_gelu_kernel, x2)[grid](
        x2, bias, out2, x2.shape[0], C, x2.stride(0), out2.stride(0),
        FORM=GELU_FORMS[approximate], BLOCK_M=BLOCK_M, BLOCK_C=BLOCK_C, num_warps=4,
    )  # fmt: skip


@vitfast_op("bias_gelu")
def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str) -> torch.Tensor:
    """gelu(x + bias) for x [..., C], as one torch op."""
    if runs_reference(x):
        return bias_gelu_reference(x, bias, approximate)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    bias_gelu_launch(x, bias, out, approximate)
    return out


def bias_gelu_reference(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """Plain PyTorch: gelu(x + bias) in x's dtype."""
    return gelu_reference(x + bias, approximate)


def gelu_reference(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """Plain PyTorch GELU in x's dtype: torch's ('none', 'tanh'), or x sigmoid(1.702 x) ('sigmoid')."""
    if approximate == "sigmoid":
        return x * torch.sigmoid(1.702 * x)
    return torch.nn.functional.gelu(x, approximate=approximate)
