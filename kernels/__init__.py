"""Triton kernels for the ViT hot paths (fused attention, add+LayerNorm, bias+GELU, GEMM epilogues, RoPE).

Installed as `vitfast.kernels`: one module per op (kernel, launcher, torch op, reference), used by
`vitfast.optimize` through `vitfast.fused`; nothing here is imported by the reference model.
`mlp_dispatch.json` is the measured per-shape choice between the MLP paths (see vitfast/fused.py).
"""
