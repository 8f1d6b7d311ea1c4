"""Parameter and multiply-accumulate counts from a config alone (no weights, no forward pass).

MACs count the matrix products (linear layers, convolutions, q k^T and attn v); GFLOPs = 2 x GMACs.
Normalisation, softmax and activations are left out, as fvcore/timm and most papers do.
"""

from __future__ import annotations

import torch

from .config import ViTConfig
from .model import VisionTransformer


def count_params(config: ViTConfig) -> int:
    """Exact parameter count, built on the meta device (no memory is allocated)."""
    with torch.device("meta"):
        model = VisionTransformer(config)
    return sum(p.numel() for p in model.parameters())


def count_macs(config: ViTConfig) -> int:
    """Multiply-accumulates of one forward pass for one image."""
    c = config
    dim, n_tokens = c.embed_dim, c.seq_len
    if c.hybrid_layers is None:
        macs = c.num_patches * c.in_chans * c.patch_size**2 * dim
    else:
        macs, feat_hw, feat_ch = _resnet_macs(c)
        k = c.patch_size // c.hybrid_reduction
        macs += c.num_patches * feat_ch * k * k * dim
    fc2_in = c.mlp_hidden // 2 if c.mlp_layer == "swiglu_packed" else c.mlp_hidden  # fc2's input width
    fc1_out = 2 * c.mlp_hidden if c.mlp_layer == "swiglu" else c.mlp_hidden  # SwiGLU's gate and value Linears apart
    per_block = (
        n_tokens * dim * 3 * dim  # qkv projection
        + 2 * n_tokens * n_tokens * dim  # q k^T and attn v, all heads
        + n_tokens * dim * dim  # output projection
        + n_tokens * dim * (fc1_out + fc2_in)  # fc1 and fc2
    )
    macs += c.built_depth * per_block
    if c.features_only:  # no head
        return macs
    if c.global_pool == "map":  # one learned query over the patch tokens (PE's: every token), then an MLP of its own width
        n = c.seq_len if c.pool_include_prefix else c.num_patches
        macs += dim * dim + n * dim * 2 * dim + 2 * n * dim + dim * dim + 2 * dim * c.pool_mlp_hidden
    head_in, head_rows = c.num_features, c.seq_len if c.global_pool == "" else 1  # unpooled: the head runs on every token
    if c.representation_size:
        macs += head_rows * head_in * c.representation_size
        head_in = c.representation_size
    macs += head_rows * head_in * c.num_classes * (2 if c.distilled and c.dist_head else 1)
    return macs


def _conv_out(size: int, stride: int) -> int:
    return -(-size // stride)  # TF 'SAME' padding: ceil(size / stride)


def _resnet_macs(c: ViTConfig) -> tuple[int, tuple[int, int], int]:
    """(MACs, feature map size, channels) of the hybrid ResNet-v2 stem."""
    h, w = c.img_hw
    h, w = _conv_out(h, 2), _conv_out(w, 2)
    macs = h * w * c.in_chans * 64 * 49  # 7x7/2 stem conv
    h, w = _conv_out(h, 2), _conv_out(w, 2)  # 3x3/2 max-pool
    chs = 64
    for i, depth in enumerate(c.hybrid_layers):
        out_chs, mid = 256 * 2**i, 64 * 2**i
        for b in range(depth):
            stride = 2 if (i > 0 and b == 0) else 1
            oh, ow = _conv_out(h, stride), _conv_out(w, stride)
            if b == 0:
                macs += oh * ow * chs * out_chs  # 1x1 projection shortcut
            macs += h * w * chs * mid  # conv1 1x1
            macs += oh * ow * mid * mid * 9  # conv2 3x3 (strided)
            macs += oh * ow * mid * out_chs  # conv3 1x1
            h, w, chs = oh, ow, out_chs
    return macs, (h, w), chs
