"""Triton kernels for the ViT hot paths (fused attention, add+LayerNorm, bias+GELU).

Installed as `vitfast.kernels`. The kernels themselves are not written yet (issue #3);
nothing here is imported by the reference model.
"""
