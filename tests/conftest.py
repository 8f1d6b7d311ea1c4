"""Shared fixtures. Everything here runs on CPU; no test touches CUDA at collection time."""

from __future__ import annotations

import os

# Kernels run under Triton's CPU interpreter unless GPU testing is asked for explicitly; this
# must happen before anything imports triton.
if os.environ.get("VITFAST_TEST_DEVICE", "cpu") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import vitfast


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def device() -> str:
    """'cpu' under the Triton interpreter, 'cuda' with VITFAST_TEST_DEVICE=cuda (checked at run time)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("VITFAST_TEST_DEVICE=cuda but no CUDA GPU is visible")
    return "cuda"


# AIMv2's block and head (registry._AIMV2: RMSNorm, SwiGLU apart, no projection biases, normalised patch tokens)
AIMV2 = dict(class_token=False, global_pool="avg", fc_norm=False, qkv_bias=False, proj_bias=False, norm_layer="rmsnorm",
             embed_norm=True, norm_eps=1e-5, mlp_layer="swiglu", act_layer="silu", mlp_ratio=2.6667, num_classes=0)  # fmt: skip


# DINOv3's block and tokens (registry._DINOV3): rotary positions instead of learned ones, 4 registers, layer scale
DINOV3 = dict(abs_pos_embed=False, rope="dinov3", rope_theta=100.0, reg_tokens=4, init_values=0.1, norm_eps=1e-5)
# EVA-02 B/L's structure at a tiny size: learned and axial rotary positions (interleaved pairs), SwiGLU with a norm before fc2
EVA02 = dict(rope="axial", rope_ref_grid=(16, 16), global_pool="avg", mlp_layer="swiglu", act_layer="silu", mlp_ratio=8 / 3, scale_mlp_norm=True)


def tiny_config(**overrides) -> vitfast.ViTConfig:
    """A small ViT (32x32 images, 8x8 patches, 2 blocks) for fast tests."""
    fields = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=7)
    fields.update(overrides)
    return vitfast.ViTConfig(**fields)


def randomize(model: torch.nn.Module, scale: float = 0.05) -> torch.nn.Module:
    """Give every parameter non-trivial random values (norm scales around 1, everything else
    around 0), so a parameter loaded into the wrong place changes the output."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm_scale = p.ndim == 1 and "norm" in name and name.endswith("weight")
            p.copy_((1.0 if is_norm_scale else 0.0) + scale * torch.randn_like(p))
    return model


def traced_vitfast_ops(fn, x: torch.Tensor, ref: torch.Tensor, device: str) -> set[str]:
    """Trace `fn` (a function or module of one tensor): `torch._dynamo.explain` finds one graph and no break,
    `torch.compile(fullgraph=True)` (Inductor on a GPU, aot_eager on CPU, sparing CI Inductor's C++ build) and
    `torch.export` both give `ref`. Returns the `vitfast.*` ops in the exported graph."""
    explained = torch._dynamo.explain(fn)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    torch.testing.assert_close(torch.compile(fn, fullgraph=True, backend=backend)(x), ref, atol=1e-4, rtol=1e-4)
    exported = torch.export.export(fn if isinstance(fn, torch.nn.Module) else _AsModule(fn), (x,))
    torch.testing.assert_close(exported.module()(x), ref, atol=1e-4, rtol=1e-4)
    return {str(n.target) for n in exported.graph.nodes if str(n.target).startswith("vitfast.")}


class _AsModule(torch.nn.Module):
    """A function as a module, for torch.export."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)
