"""`FusedBlock`: a reference `Block`'s own parameters run through the Triton kernels.

Per block: LayerNorm kernel -> qkv GEMM -> fused attention read straight from the packed qkv ->
proj GEMM -> fused residual add + LayerNorm -> fc1 GEMM without bias -> bias + GELU kernel ->
fc2 GEMM -> residual add. GEMMs stay on cuBLAS (`F.linear`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from .layers import Attention, Block, Mlp


@functools.cache
def kernel_ops():
    """The Triton-backed torch ops, imported on first use (triton is an optional dependency)."""
    from vitfast.kernels import add_layernorm, attention, bias_gelu

    return attention.fused_attention, add_layernorm.layernorm, add_layernorm.add_layernorm, bias_gelu.bias_gelu


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
    )


class FusedBlock(nn.Module):
    """Same submodules (same names, same Parameter objects) as the wrapped `Block`, so
    `state_dict()` is unchanged; only the forward differs.

    Attention maps (`return_attention=True`) and training mode (dropout, drop-path) run the
    reference block's math path on the same parameters.
    """

    def __init__(self, block: Block):
        super().__init__()
        kernel_ops()  # import (and register) the Triton ops now, not on the first forward
        for name, child in block.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "reference", block)  # kept for restore(); not a submodule (no duplicate keys)
        self.train(block.training)

    def train(self, mode: bool = True) -> "FusedBlock":
        self.reference.training = mode  # the fallback path must see the same mode
        return super().train(mode)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """x [B, N, C] -> [B, N, C]."""
        if return_attention or self.training:
            return self.reference(x, return_attention=return_attention)
        fused_attention, layernorm, add_layernorm, bias_gelu = kernel_ops()
        attn, mlp = self.attn, self.mlp
        B, N, C = x.shape
        h = layernorm(x, self.norm1.weight, self.norm1.bias, self.norm1.eps)
        qkv = F.linear(h, attn.qkv.weight, attn.qkv.bias).view(B, N, 3, attn.num_heads, attn.head_dim)
        a = F.linear(fused_attention(qkv, attn.scale), attn.proj.weight, attn.proj.bias)
        x, h = add_layernorm(x, self.ls1(a), self.norm2.weight, self.norm2.bias, self.norm2.eps)
        m = bias_gelu(F.linear(h, mlp.fc1.weight), mlp.fc1.bias, mlp.act.approximate)
        return x + self.ls2(F.linear(m, mlp.fc2.weight, mlp.fc2.bias))
