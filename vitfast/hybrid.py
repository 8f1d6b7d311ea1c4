"""Hybrid ViT stem: a BiT-style ResNet-v2 (weight-standardised convs + GroupNorm) whose feature
map becomes the patch tokens, as in the ViT paper's hybrids and timm's `vit_base_r50_s16_*`.

Parameter names follow timm's `ResNetV2` (non pre-activation variant used for ViT), so timm
hybrid checkpoints load unchanged under `patch_embed.backbone.*`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import hybrid_stride
from .layers import check_image_shape


def pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    """TensorFlow 'SAME' padding (the extra pixel goes right/bottom), as the JAX BiT weights expect."""
    ih, iw = x.shape[-2:]
    # integer ceil division: exact, and under torch.export (dynamic_img_size) an expression of whole patches that folds
    pad_h = max((-(-ih // stride) - 1) * stride + kernel - ih, 0)
    pad_w = max((-(-iw // stride) - 1) * stride + kernel - iw, 0)
    if pad_h or pad_w:
        x = F.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2], value=value)
    return x


class StdConv2dSame(nn.Conv2d):
    """Conv2d with weight standardisation (Qiao et al. 2019) and TF 'SAME' padding, no bias."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int, stride: int = 1, eps: float = 1e-8):
        super().__init__(in_chs, out_chs, kernel_size, stride=stride, padding=0, bias=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_same(x, self.kernel_size[0], self.stride[0])
        # Standardise each output filter over (in, kh, kw) with the biased variance.
        w = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1), None, None, training=True, momentum=0.0, eps=self.eps
        ).reshape_as(self.weight)
        return F.conv2d(x, w, None, self.stride)


class GroupNormAct(nn.GroupNorm):
    """GroupNorm(32 groups) optionally followed by ReLU."""

    def __init__(self, num_channels: int, apply_act: bool = True, num_groups: int = 32, eps: float = 1e-5):
        super().__init__(num_groups, num_channels, eps=eps)
        self.apply_act = apply_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        return F.relu(x) if self.apply_act else x


class DownsampleConv(nn.Module):
    """Projection shortcut: 1x1 strided StdConv + GroupNorm (no activation)."""

    def __init__(self, in_chs: int, out_chs: int, stride: int):
        super().__init__()
        self.conv = StdConv2dSame(in_chs, out_chs, 1, stride=stride)
        self.norm = GroupNormAct(out_chs, apply_act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Bottleneck(nn.Module):
    """Non pre-activation bottleneck (1x1 -> 3x3 strided -> 1x1, width out/4), ReLU after the sum."""

    def __init__(self, in_chs: int, out_chs: int, stride: int):
        super().__init__()
        mid = out_chs // 4
        self.downsample = DownsampleConv(in_chs, out_chs, stride) if (in_chs != out_chs or stride != 1) else None
        self.conv1 = StdConv2dSame(in_chs, mid, 1)
        self.norm1 = GroupNormAct(mid)
        self.conv2 = StdConv2dSame(mid, mid, 3, stride=stride)
        self.norm2 = GroupNormAct(mid)
        self.conv3 = StdConv2dSame(mid, out_chs, 1)
        self.norm3 = GroupNormAct(out_chs, apply_act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.norm1(self.conv1(x))
        x = self.norm2(self.conv2(x))
        x = self.norm3(self.conv3(x))
        return F.relu(x + shortcut)


class ResNetStage(nn.Module):
    def __init__(self, in_chs: int, out_chs: int, stride: int, depth: int):
        super().__init__()
        self.blocks = nn.Sequential(
            *[Bottleneck(in_chs if i == 0 else out_chs, out_chs, stride if i == 0 else 1) for i in range(depth)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class Stem(nn.Module):
    """7x7/2 StdConv + GroupNorm + ReLU, then 3x3/2 'SAME' max-pool: stride 4, 64 channels."""

    def __init__(self, in_chans: int, out_chs: int = 64):
        super().__init__()
        self.conv = StdConv2dSame(in_chans, out_chs, 7, stride=2)
        self.norm = GroupNormAct(out_chs)
        self.num_features = out_chs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x))
        return F.max_pool2d(pad_same(x, 3, 2, value=float("-inf")), 3, 2)


class ResNetV2(nn.Module):
    """Feature extractor [B, in_chans, H, W] -> [B, num_features, H / reduction, W / reduction]."""

    def __init__(self, layers: tuple[int, ...], in_chans: int):
        super().__init__()
        self.stem = Stem(in_chans)
        chs, stages = 64, []
        for i, depth in enumerate(layers):
            out_chs = 256 * 2**i
            stages.append(ResNetStage(chs, out_chs, 1 if i == 0 else 2, depth))
            chs = out_chs
        self.stages = nn.Sequential(*stages)
        self.num_features = chs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))


class HybridEmbed(nn.Module):
    """ResNet-v2 features, then a Conv2d projection (kernel = patch / reduction) to tokens [B, N, C]."""

    def __init__(
        self, img_size: tuple[int, int], patch_size: int, in_chans: int, embed_dim: int, layers: tuple[int, ...], bias: bool = True,
        dynamic_patch: int | None = None,
    ):  # fmt: skip
        super().__init__()
        self.img_size = img_size
        self.in_chans = in_chans
        self.dynamic_patch = dynamic_patch
        # no stages: timm builds the stem alone as the backbone (create_resnetv2_stem), so its names are backbone.conv/norm
        self.backbone = ResNetV2(layers, in_chans) if layers else Stem(in_chans)
        kernel = patch_size // hybrid_stride(layers)
        self.proj = nn.Conv2d(self.backbone.num_features, embed_dim, kernel_size=kernel, stride=kernel, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_image_shape(x, self.in_chans, self.img_size, self.dynamic_patch)
        return self.proj(self.backbone(x)).flatten(2).transpose(1, 2)
