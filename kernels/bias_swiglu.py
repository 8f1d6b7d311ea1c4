"""SwiGLU gate (Shazeer 2020) in one read and one write: out [..., H] = silu(gate) * value.

- packed (DINOv2 giant, timm's `SwiGLUPacked`): x [..., 2H] holds the gate half then the value
  half, fc1's bias [2H] is added here: out = silu(gate + b_gate) * (value + b_value).
- unpacked (AIMv2, timm's `SwiGLU`): gate and value [..., H] are two tensors (fc1_g's and fc1_x's
  outputs, or two column slices of one GEMM output), with their own row strides and no bias.

Used after fc1 computed by cuBLAS (without its bias when packed), as bias_gelu.py is for the GELU
MLP: it replaces PyTorch's bias add, SiLU and product (three passes over the activation).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_device, elementwise_tiles, rows_view, runs_reference, vitfast_op, wrap_triton


@triton.jit
def _bias_swiglu_kernel(
    Gate, Value, Bias, Out, M, H, stride_gate, stride_value, stride_out,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    # int64 rows: rows * stride passes 2^31 elements at large batches (DINOv2-g/14 at 518 px from batch ~190)
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (rows < M)[:, None] & (cols < H)[None, :]
    gate = tl.load(Gate + rows[:, None] * stride_gate + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    value = tl.load(Value + rows[:, None] * stride_value + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:  # the packed bias [2H]: gate half, then value half
        gate += tl.load(Bias + cols, mask=cols < H, other=0.0).to(tl.float32)[None, :]
        value += tl.load(Bias + H + cols, mask=cols < H, other=0.0).to(tl.float32)[None, :]
    # silu(g) = g / (1 + exp(-g)), exp as exp2 (times 1/ln 2), the exponent capped so it cannot overflow to inf
    y = gate / (1.0 + tl.math.exp2(tl.minimum(-1.4426950408889634 * gate, 126.0))) * value
    tl.store(Out + rows[:, None] * stride_out + cols[None, :], y.to(Out.dtype.element_ty), mask=mask)


def swiglu_launch(gate: torch.Tensor, value: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """out [..., H] = silu(gate + bias[:H]) * (value + bias[H:]) for gate, value [..., H] (each read
    through its own row stride; columns contiguous, or copied), bias [2H] or None."""
    H = gate.shape[-1]
    if value.shape != gate.shape or value.dtype != gate.dtype:
        raise ValueError(f"gate and value must agree in shape and dtype, got {tuple(gate.shape)} {gate.dtype} "
                         f"and {tuple(value.shape)} {value.dtype}")  # fmt: skip
    if bias is not None and bias.shape != (2 * H,):
        raise ValueError(f"bias must be [{2 * H}], got {tuple(bias.shape)}")
    if out.shape != gate.shape or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous tensor of shape {tuple(gate.shape)}")
    check_device(*[t for t in (gate, value, bias, out) if t is not None])
    g2, v2 = rows_view(gate, H), rows_view(value, H)
    out2 = out.view(-1, H)
    BLOCK_M, BLOCK_H, grid = elementwise_tiles(g2.shape[0], H)
    wrap_triton(_bias_swiglu_kernel, g2)[grid](
        g2, v2, bias if bias is not None else g2, out2, g2.shape[0], H, g2.stride(0), v2.stride(0), out2.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=BLOCK_M, BLOCK_H=BLOCK_H, num_warps=4,
    )  # fmt: skip


def bias_swiglu_launch(x: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> None:
    """out [..., H] = silu(x[..., :H] + bias[:H]) * (x[..., H:] + bias[H:]) for x [..., 2H], bias [2H]."""
    C = x.shape[-1]
    if C % 2:
        raise ValueError(f"x's last dimension holds the gate and value halves, so it must be even, got {C}")
    swiglu_launch(x[..., : C // 2], x[..., C // 2 :], out, bias)


@vitfast_op("bias_swiglu")
def bias_swiglu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """silu(gate) * value of x [..., 2H] + bias, as one torch op -> [..., H]."""
    if runs_reference(x):
        return bias_swiglu_reference(x, bias)
    out = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    bias_swiglu_launch(x, bias, out)
    return out


@vitfast_op("swiglu")
def swiglu(gate: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """silu(gate) * value for gate, value [..., H], as one torch op -> [..., H]."""
    if runs_reference(gate):
        return swiglu_reference(gate, value)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    swiglu_launch(gate, value, out)
    return out


def bias_swiglu_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch, in x's dtype: the halves of x + bias, gate first."""
    return swiglu_reference(*(x + bias).chunk(2, dim=-1))


def swiglu_reference(gate: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch, in the inputs' dtype."""
    return torch.nn.functional.silu(gate) * value
