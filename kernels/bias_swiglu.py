"""Bias + SwiGLU gate (Shazeer 2020) over the packed fc1 output of DINOv2 giant's MLP, in one read and
one write: x [..., 2H] holds the gate half then the value half (timm's `SwiGLUPacked`), and
out [..., H] = silu(gate + b_gate) * (value + b_value).

Used after fc1 computed without its bias (cuBLAS GEMM, then this kernel), as bias_gelu.py is for
the GELU MLP: it replaces PyTorch's bias add, SiLU and product (three passes over the activation).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from ._common import check_device, elementwise_tiles, rows_view, runs_reference, wrap_triton


@triton.jit
def _bias_swiglu_kernel(
    X, Bias, Out, M, H, stride_x, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    # int64 rows: rows * stride passes 2^31 elements at large batches (DINOv2-g/14 at 518 px from batch ~190)
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (rows < M)[:, None] & (cols < H)[None, :]
    gate_ptrs = X + rows[:, None] * stride_x + cols[None, :]
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    value = tl.load(gate_ptrs + H, mask=mask, other=0.0).to(tl.float32)  # the value half starts H columns on
    gate += tl.load(Bias + cols, mask=cols < H, other=0.0).to(tl.float32)[None, :]
    value += tl.load(Bias + H + cols, mask=cols < H, other=0.0).to(tl.float32)[None, :]
    # silu(g) = g / (1 + exp(-g)), exp as exp2 (times 1/ln 2), the exponent capped so it cannot overflow to inf
    y = gate / (1.0 + tl.math.exp2(tl.minimum(-1.4426950408889634 * gate, 126.0))) * value
    tl.store(Out + rows[:, None] * stride_out + cols[None, :], y.to(Out.dtype.element_ty), mask=mask)


def bias_swiglu_launch(x: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> None:
    """out [..., H] = silu(x[..., :H] + bias[:H]) * (x[..., H:] + bias[H:]) for x [..., 2H], bias [2H]."""
    C = x.shape[-1]
    if C % 2:
        raise ValueError(f"x's last dimension holds the gate and value halves, so it must be even, got {C}")
    H = C // 2
    if bias.shape != (C,):
        raise ValueError(f"bias must be [{C}], got {tuple(bias.shape)}")
    if out.shape != (*x.shape[:-1], H) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous tensor of shape {(*x.shape[:-1], H)}")
    check_device(x, bias, out)
    x2 = rows_view(x, C)
    out2 = out.view(-1, H)
    BLOCK_M, BLOCK_H, grid = elementwise_tiles(x2.shape[0], H)
    wrap_triton(_bias_swiglu_kernel)[grid](
        x2, bias, out2, x2.shape[0], H, x2.stride(0), out2.stride(0), BLOCK_M=BLOCK_M, BLOCK_H=BLOCK_H, num_warps=4,
    )  # fmt: skip


@triton_op("vitfast::bias_swiglu", mutates_args=())
def bias_swiglu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """silu(gate) * value of x [..., 2H] + bias, as one torch op -> [..., H]."""
    if runs_reference(x):
        return bias_swiglu_reference(x, bias)
    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    bias_swiglu_launch(x, bias, out)
    return out


def bias_swiglu_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch, in x's dtype: the halves of x + bias, gate first."""
    gate, value = (x + bias).chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * value
