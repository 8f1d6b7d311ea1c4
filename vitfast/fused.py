"""`FusedBlock`: a reference `Block`'s own parameters run through the Triton kernels.

Per block: LayerNorm kernel -> qkv GEMM -> fused attention read straight from the packed qkv ->
proj GEMM -> fused residual add + LayerNorm -> MLP -> residual add. The qkv and proj GEMMs stay
on cuBLAS (`F.linear`; proj's output feeds the add + LayerNorm kernel). The MLP takes one of two
paths, per GEMM and per shape:

- "cublas": fc1 GEMM without bias (cuBLAS) -> standalone bias + GELU kernel; fc2 GEMM with bias
  (cuBLAS) -> LayerScale and residual add in PyTorch.
- "epilogue": Triton GEMMs with the elementwise work as their epilogue (kernels/linear_epilogue.py):
  fc1 + bias + GELU writes the 4x-wide activation once; fc2 + bias + LayerScale + residual add.

`optimize(model, mlp="auto")` takes, for each shape, the path that `benchmarks/gpu_kernels.py`
measured faster on a GPU of the same compute capability (kernels/mlp_dispatch.json, see
`choose_mlp_paths`). Where nothing was measured it takes "cublas". No GPU measurement has been
committed yet, so today "auto" is "cublas" everywhere; "epilogue" is implemented and tested and
can be forced with `mlp="epilogue"`.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
import types

import torch
import torch.nn.functional as F
from torch import nn

from vitfast.kernels._common import next_pow2  # triton-free: the launchers' own bucketing
from .layers import Attention, Block, LayerScale, Mlp

MLP_PATHS = ("auto", "cublas", "epilogue")
DEFAULT_MLP_PATHS = ("cublas", "cublas")  # (fc1, fc2) where no measurement exists


@functools.cache
def kernel_ops() -> types.SimpleNamespace:
    """The Triton-backed torch ops, imported on first use (triton is an optional dependency)."""
    from vitfast.kernels import add_layernorm, attention, bias_gelu, linear_epilogue

    return types.SimpleNamespace(
        fused_attention=attention.fused_attention,
        layernorm=add_layernorm.layernorm,
        add_layernorm=add_layernorm.add_layernorm,
        bias_gelu=bias_gelu.bias_gelu,
        linear_bias_gelu=linear_epilogue.linear_bias_gelu,
        linear_bias_residual=linear_epilogue.linear_bias_residual,
    )


# ---------------------------------------------------------------------------- MLP dispatch
def m_bucket(rows: int) -> int:
    """The dispatch table's M bucket: GEMM rows (batch x tokens) rounded up to a power of two,
    the same bucket the epilogue GEMM's autotuner keys on."""
    return next_pow2(rows)


@functools.cache
def mlp_dispatch_table() -> tuple[dict, ...]:
    """The measured entries of kernels/mlp_dispatch.json (read once; `cache_clear()` after rewriting it)."""
    text = importlib.resources.files("vitfast.kernels").joinpath("mlp_dispatch.json").read_text()
    return tuple(json.loads(text)["entries"])


@functools.cache
def _capability(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


@functools.cache
def _lookup(capability: str, dtype: str, C: int, hidden: int, bucket: int) -> tuple[str, str]:
    same = [
        e for e in mlp_dispatch_table()
        if (e["compute_capability"], e["dtype"], e["C"], e["hidden"]) == (capability, dtype, C, hidden)
    ]  # fmt: skip
    if not same:
        return DEFAULT_MLP_PATHS
    nearest = min(same, key=lambda e: abs(math.log2(e["m_bucket"]) - math.log2(bucket)))
    return nearest["fc1"], nearest["fc2"]


def choose_mlp_paths(mode: str, device: torch.device, dtype: torch.dtype, C: int, hidden: int, rows: int) -> tuple[str, str]:
    """(fc1 path, fc2 path), each "cublas" or "epilogue".

    mode "cublas" / "epilogue" forces both. "auto" looks up the measured table: the entry for this
    GPU's compute capability, dtype, C and hidden whose M bucket is nearest (log scale) to
    `m_bucket(rows)`; with no such entry (CPU, an unmeasured GPU or shape) both are "cublas".
    """
    if mode != "auto":
        return mode, mode
    if device.type != "cuda" or not mlp_dispatch_table():
        return DEFAULT_MLP_PATHS
    return _lookup(_capability(device), str(dtype).removeprefix("torch."), C, hidden, m_bucket(rows))


# ---------------------------------------------------------------------------- the block
def can_fuse(block: nn.Module) -> bool:
    """Only the reference classes are fused; injected custom layers keep their own forward."""
    return (
        type(block) is Block
        and type(block.attn) is Attention
        and type(block.mlp) is Mlp
        and type(block.norm1) is nn.LayerNorm
        and type(block.norm2) is nn.LayerNorm
        and block.norm1.elementwise_affine
        and block.norm2.elementwise_affine
        and type(block.ls2) in (nn.Identity, LayerScale)  # what the fc2 epilogue computes
    )


class FusedBlock(nn.Module):
    """Same submodules (same names, same Parameter objects) as the wrapped `Block`, so
    `state_dict()` is unchanged; only the forward differs.

    `mlp_path` is "auto", "cublas" or "epilogue" (see the module docstring). Attention maps
    (`return_attention=True`) and training mode (dropout, drop-path) run the reference block's
    math path on the same parameters.
    """

    def __init__(self, block: Block, mlp: str = "auto"):
        super().__init__()
        if mlp not in MLP_PATHS:
            raise ValueError(f"mlp must be one of {MLP_PATHS}, got {mlp!r}")
        kernel_ops()  # import (and register) the Triton ops now, not on the first forward
        mlp_dispatch_table()  # read the table now too
        for name, child in block.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "reference", block)  # kept for restore(); not a submodule (no duplicate keys)
        self.mlp_path = mlp
        self.train(block.training)

    def train(self, mode: bool = True) -> "FusedBlock":
        self.reference.training = mode  # the fallback path must see the same mode
        return super().train(mode)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """x [B, N, C] -> [B, N, C]."""
        if return_attention or self.training:
            return self.reference(x, return_attention=return_attention)
        ops = kernel_ops()
        attn, mlp = self.attn, self.mlp
        B, N, C = x.shape
        h = ops.layernorm(x, self.norm1.weight, self.norm1.bias, self.norm1.eps)
        qkv = F.linear(h, attn.qkv.weight, attn.qkv.bias).view(B, N, 3, attn.num_heads, attn.head_dim)
        a = F.linear(ops.fused_attention(qkv, attn.scale), attn.proj.weight, attn.proj.bias)
        x, h = ops.add_layernorm(x, self.ls1(a), self.norm2.weight, self.norm2.bias, self.norm2.eps)
        fc1, fc2 = choose_mlp_paths(self.mlp_path, x.device, x.dtype, C, mlp.fc1.out_features, B * N)
        if fc1 == "epilogue":
            m = ops.linear_bias_gelu(h, mlp.fc1.weight, mlp.fc1.bias, mlp.act.approximate)
        else:
            m = ops.bias_gelu(F.linear(h, mlp.fc1.weight), mlp.fc1.bias, mlp.act.approximate)
        if fc2 == "epilogue":
            gamma = self.ls2.gamma if isinstance(self.ls2, LayerScale) else None
            return ops.linear_bias_residual(m, mlp.fc2.weight, mlp.fc2.bias, x, gamma)
        return x + self.ls2(F.linear(m, mlp.fc2.weight, mlp.fc2.bias))
