"""Resizing learned position embeddings to a new patch grid (ViT paper, section 3.2)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: tuple[int, int],
    *,
    num_prefix_tokens: int = 1,
    old_grid: tuple[int, int] | None = None,
    antialias: bool = True,
) -> torch.Tensor:
    """[1, prefix + gh*gw, C] -> [1, prefix + new_gh*new_gw, C], bicubic over the 2-D grid.

    Prefix (class / distillation / register) embeddings are kept as they are. `antialias=True`
    is timm's convention (PIL-style bicubic, a = -0.5); Hugging Face's `interpolate_pos_encoding`
    uses `antialias=False` (a = -0.75). `old_grid` defaults to a square grid.
    """
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    n = grid.shape[1]
    if old_grid is None:
        side = math.isqrt(n)
        if side * side != n:
            raise ValueError(f"position embeddings for {n} patches are not a square grid; pass old_grid=(h, w)")
        old_grid = (side, side)
    if tuple(old_grid) == tuple(new_grid):
        return pos_embed
    return torch.cat([prefix, interpolate_grid(grid, old_grid, new_grid, antialias=antialias)], dim=1)


def interpolate_grid(grid: torch.Tensor, old_grid: tuple[int, int], new_grid, *, antialias: bool) -> torch.Tensor:
    """Patch position embeddings [1, gh*gw, C] -> [1, new_gh*new_gw, C], bicubic in fp32, always (no shortcut for an
    equal grid: `new_grid` may be symbolic under torch.export, and at scale 1 bicubic returns its input)."""
    dim, dtype = grid.shape[-1], grid.dtype
    grid = grid.float().reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", align_corners=False, antialias=antialias)
    return grid.permute(0, 2, 3, 1).reshape(1, -1, dim).to(dtype)
