"""Fused residual add + LayerNorm or RMSNorm, one pass over each row.

Reads the residual stream x and the branch output y, writes the new residual stream x + y (or
x + gamma * y, gamma being the branch's LayerScale) and its LayerNorm, or its RMSNorm
(x * rsqrt(mean(x^2) + eps) * weight: no centring, no bias; AIMv2); without y it is a plain
LayerNorm / RMSNorm. Statistics are fp32 whatever the I/O dtype.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import check_device, next_pow2, rows_view, runs_reference, vitfast_op, wrap_triton


@triton.jit
def _add_layernorm_kernel(
    X, Y, Gamma, W, Bias, Res, Out,
    stride_x, stride_y, stride_res, stride_out,  # row strides; columns are contiguous
    C, eps,
    HAS_BRANCH: tl.constexpr, HAS_GAMMA: tl.constexpr,
    RMS: tl.constexpr,  # RMSNorm: no centring, no bias (Bias unused)
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # row * stride passes 2^31 elements at large batches
    cols = tl.arange(0, BLOCK_C)
    mask = cols < C
    # -- new residual stream (fp32 in registers; stored in the I/O dtype)
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BRANCH:
        y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_GAMMA:
            y *= tl.load(Gamma + cols, mask=mask, other=0.0).to(tl.float32)
        x += y
        tl.store(Res + row * stride_res + cols, x.to(Res.dtype.element_ty), mask=mask)
    # -- statistics over the row held in registers: two-pass mean / variance, or the mean square
    if RMS:
        xc = x  # masked columns loaded as 0
    else:
        xc = tl.where(mask, x - tl.sum(x, axis=0) / C, 0.0)
    rstd = tl.math.rsqrt(tl.sum(xc * xc, axis=0) / C + tl.cast(eps, tl.float32))  # eps is fp64 under Inductor
    # -- affine and store
    y = xc * rstd * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if not RMS:
        y += tl.load(Bias + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_out + cols, y.to(Out.dtype.element_ty), mask=mask)


def add_layernorm_launch(
    x: torch.Tensor,
    branch: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    out: torch.Tensor,
    residual_out: torch.Tensor | None = None,
    gamma: torch.Tensor | None = None,
    rms: bool = False,
) -> None:
    """x, branch [..., C] -> residual_out = x + gamma * branch, out = LayerNorm(residual_out) (in place).

    gamma [C] (a LayerScale) is optional. With `branch=None`: out = LayerNorm(x) and
    residual_out is unused. `rms=True`: RMSNorm instead, weight [C] and bias None.
    """
    C = x.shape[-1]
    if rms != (bias is None):
        raise ValueError("RMSNorm takes no bias, LayerNorm needs one: pass bias=None exactly when rms=True")
    wrong = [f"{k} {tuple(t.shape)}" for k, t in (("weight", weight), ("bias", bias)) if t is not None and t.shape != (C,)]
    if wrong:
        raise ValueError(f"the norm's weight and bias must be [{C}], got {', '.join(wrong)}")
    if branch is not None and (branch.shape != x.shape or residual_out is None or residual_out.shape != x.shape):
        raise ValueError(f"branch and residual_out must match x {tuple(x.shape)}")
    if gamma is not None and (branch is None or gamma.shape != (C,)):
        raise ValueError(f"gamma scales the branch: pass a branch and gamma [{C}], got {tuple(gamma.shape)}")
    if out.shape != x.shape or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous tensor of shape {tuple(x.shape)}")
    check_device(*[t for t in (x, branch, residual_out if branch is not None else None, weight, bias, gamma, out) if t is not None])
    x2 = rows_view(x, C)
    y2 = rows_view(branch, C) if branch is not None else x2
    res2 = residual_out.view(-1, C) if branch is not None else x2
    out2 = out.view(-1, C)
    BLOCK_C = next_pow2(C)
    num_warps = min(max(BLOCK_C // 256, 1), 16)  # one row per program: more warps for wider rows
    wrap_triton(_add_layernorm_kernel, x2)[(x2.shape[0],)](
        x2, y2, gamma if gamma is not None else weight, weight, bias if bias is not None else weight, res2, out2,
        x2.stride(0), y2.stride(0), res2.stride(0), out2.stride(0),
        C, eps,
        HAS_BRANCH=branch is not None, HAS_GAMMA=gamma is not None, RMS=rms, BLOCK_C=BLOCK_C, num_warps=num_warps,
    )  # fmt: skip


def _add_norm(x, branch, weight, bias, eps, gamma, rms):
    """The four ops' body: (x + gamma * branch or None without a branch, its LayerNorm or RMSNorm)."""
    if runs_reference(x):
        return add_rmsnorm_reference(x, branch, weight, eps, gamma) if rms else add_layernorm_reference(x, branch, weight, bias, eps, gamma)
    residual = torch.empty(x.shape, dtype=x.dtype, device=x.device) if branch is not None else None
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    add_layernorm_launch(x, branch, weight, bias, eps, out, residual, gamma, rms=rms)
    return residual, out


@vitfast_op("add_layernorm")
def add_layernorm(
    x: torch.Tensor, branch: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
    gamma: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, LayerNorm(r)) with r = x + gamma * branch (gamma None: 1) for [..., C] tensors, as one torch op."""
    return _add_norm(x, branch, weight, bias, eps, gamma, rms=False)


@vitfast_op("layernorm")
def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim of x [..., C], as one torch op."""
    return _add_norm(x, None, weight, bias, eps, None, rms=False)[1]


@vitfast_op("add_rmsnorm")
def add_rmsnorm(
    x: torch.Tensor, branch: torch.Tensor, weight: torch.Tensor, eps: float, gamma: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, RMSNorm(r)) with r = x + gamma * branch (gamma None: 1) for [..., C] tensors, as one torch op."""
    return _add_norm(x, branch, weight, None, eps, gamma, rms=True)


@vitfast_op("rmsnorm")
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x [..., C], as one torch op."""
    return _add_norm(x, None, weight, None, eps, None, rms=True)[1]


def add_layernorm_reference(x, branch, weight, bias, eps, gamma=None):
    """Plain PyTorch: (x + gamma * branch, its layer_norm) in x's dtype (LayerNorm alone if no branch)."""
    res = _residual_reference(x, branch, gamma)
    return res, torch.nn.functional.layer_norm(res, (x.shape[-1],), weight, bias, eps)


def add_rmsnorm_reference(x, branch, weight, eps, gamma=None):
    """Plain PyTorch: (x + gamma * branch, its rms_norm, what nn.RMSNorm runs) in x's dtype (RMSNorm alone if no branch)."""
    res = _residual_reference(x, branch, gamma)
    return res, torch.nn.functional.rms_norm(res, (x.shape[-1],), weight, eps)


def _residual_reference(x, branch, gamma):
    return x if branch is None else x + (branch if gamma is None else branch * gamma)
