"""What a ViT looks at: attention rollout, per-head attention, position-embedding similarity and
mean attention distance (the figures of Abnar & Zuidema 2020 and the ViT paper's Figure 7).

Shapes: B images, L layers (depth), H heads, P prefix tokens (class, distillation, registers),
N = gh * gw patches in row-major order, T = P + N tokens. The class token, when there is one,
is token 0. Numbers come back as float64 CPU tensors; the plotting functions return matplotlib
`Figure`s drawn with the Agg canvas, so nothing touches pyplot's global state.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

from .atomic import claim_output
from .config import ViTConfig
from .data import open_image
from .errors import BackendUnavailable, InputError, VitfastError

DPI = 100
# Fixed canvas sizes in inches (pixels = inches * DPI); figures are saved without a tight bbox
# so every PNG of a kind has the same size whatever the model.
FIGSIZES = {
    "rollout": (8.0, 4.0),
    "heads": (8.0, 8.0),
    "pos_embed": (8.0, 8.0),
    "attention_distance": (6.4, 4.8),
}


# ---------------------------------------------------------------------------- numbers
def rollout_matrix(attentions: Sequence[torch.Tensor]) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020): L x [B, H, T, T] -> [B, T, T].

    Each layer's head-averaged attention A becomes 0.5 * A + 0.5 * I (the residual connection
    carries half the signal), rows renormalised, and the layers are chained from the first to
    the last: R = A_hat_L @ ... @ A_hat_1. Row t of R says how much each input token flows into
    output token t.
    """
    if not attentions:
        raise InputError("attention rollout needs the attention of at least one layer")
    rollout = None
    for attn in attentions:
        a = attn.detach().to("cpu", torch.float64).mean(dim=1)  # [B, T, T]
        eye = torch.eye(a.shape[-1], dtype=a.dtype)
        a = 0.5 * a + 0.5 * eye
        a = a / a.sum(dim=-1, keepdim=True)
        rollout = a if rollout is None else a @ rollout
    return rollout


def source_rows(matrix: torch.Tensor, num_prefix_tokens: int, *, class_token: bool = True, distilled: bool = False) -> torch.Tensor:
    """[..., T, T] -> [..., N]: the row of the token a model classifies from, over patch columns.

    With a class token that is row 0 (registers are ignored); `distilled` (DeiT with both heads, whose logits are the
    mean of the class token's head and the distillation token's) the mean of rows 0 and 1; without a class token
    (global_pool="avg") the mean over the patch tokens' rows, which the head pools.
    """
    patches = matrix[..., num_prefix_tokens:]
    if class_token:
        return patches[..., :2, :].mean(dim=-2) if distilled else patches[..., 0, :]
    return patches[..., num_prefix_tokens:, :].mean(dim=-2)


def attention_rollout(
    attentions: Sequence[torch.Tensor], num_prefix_tokens: int, *, class_token: bool = True, distilled: bool = False
) -> torch.Tensor:
    """L x [B, H, T, T] -> [B, N]: rolled-out attention from the class token (or the patch mean) to each patch.

    Values are the share of the source's rolled-out attention reaching each patch; the rest
    stays on prefix tokens, so a row sums to at most 1.
    """
    return source_rows(rollout_matrix(attentions), num_prefix_tokens, class_token=class_token, distilled=distilled)


def head_attention(
    attentions: Sequence[torch.Tensor], num_prefix_tokens: int, *, class_token: bool = True, distilled: bool = False,
    layer: int = -1
) -> torch.Tensor:
    """L x [B, H, T, T] -> [B, H, N]: one layer's per-head attention from the class token (or patch mean)."""
    attn = attentions[layer].detach().to("cpu", torch.float64)
    return source_rows(attn, num_prefix_tokens, class_token=class_token, distilled=distilled)


def pos_embed_similarity(model: torch.nn.Module) -> torch.Tensor | None:
    """Cosine similarity of the learned patch position embeddings: [N', N'] over the N' positions of `config.pos_grid`;
    None for a model without them (DINOv3's positions are rotary, computed, not learned).

    Row i reshaped to `config.pos_grid` is the heatmap for patch position i: the grid the table is stored at, which a
    model resizing it to the image's grid (an HF DINOv2 stored at 37x37, run at 224 px) has apart from `grid_size`.
    Prefix-token rows of `pos_embed` are skipped (with `no_embed_class=True` there are none).
    """
    cfg: ViTConfig = model.config
    if model.pos_embed is None:
        return None
    pos = model.pos_embed.detach().to("cpu", torch.float64)[0]
    if not cfg.no_embed_class:
        pos = pos[cfg.num_prefix_tokens :]
    gh, gw = cfg.pos_grid
    if pos.shape[0] != gh * gw:
        raise InputError(f"pos_embed has {pos.shape[0]} patch rows but the config's {gh}x{gw} position grid has {gh * gw}")
    unit = torch.nn.functional.normalize(pos, dim=-1)
    sim = unit @ unit.T
    # cos(u, v) is symmetric and cos(v, v) is 1 by definition; make both exact (matmul rounding
    # differs by an ulp between sim[i, j] and sim[j, i], and |u|^2 by an ulp from 1).
    sim = (sim + sim.T) / 2
    sim.fill_diagonal_(1.0)
    return sim.clamp_(-1.0, 1.0)


def patch_centres(config: ViTConfig) -> torch.Tensor:
    """[N, 2] (y, x) pixel coordinates of the patch centres on the model's input image, row-major."""
    gh, gw = config.grid_size
    p = config.patch_size
    ys, xs = torch.meshgrid(
        (torch.arange(gh, dtype=torch.float64) + 0.5) * p, (torch.arange(gw, dtype=torch.float64) + 0.5) * p, indexing="ij"
    )
    return torch.stack([ys.reshape(-1), xs.reshape(-1)], dim=-1)


def mean_attention_distance(
    attentions: Sequence[torch.Tensor], config: ViTConfig, *, renormalize: bool = False
) -> torch.Tensor:
    """L x [B, H, T, T] -> [L, H]: mean attention distance in pixels (ViT paper, Figure 7 right).

    For each query patch: sum over key patches of attention weight x distance between the patch
    centres; then the mean over query patches and images. Attention paid to prefix tokens has no
    position and adds nothing, as in the paper's definition; `renormalize=True` divides by the
    attention that lands on patches instead, which keeps heads that park attention on a class or
    register token comparable.
    """
    centres = patch_centres(config)
    dist = torch.cdist(centres, centres)  # [N, N]
    P, N = config.num_prefix_tokens, config.num_patches
    out = []
    for attn in attentions:
        if attn.shape[-1] != P + N or attn.shape[-2] != P + N:
            raise InputError(
                f"attention over {attn.shape[-1]} tokens does not fit the config ({P} prefix + {N} patch tokens)"
            )
        a = attn.detach().to("cpu", torch.float64)[..., P:, P:]  # [B, H, N, N] patch -> patch
        per_query = (a * dist).sum(dim=-1)  # [B, H, N]
        if renormalize:
            per_query = per_query / a.sum(dim=-1).clamp_min(torch.finfo(a.dtype).tiny)
        out.append(per_query.mean(dim=(0, 2)))
    return torch.stack(out)


def uniform_attention_distance(config: ViTConfig) -> float:
    """Mean attention distance in pixels of a head that attends uniformly to all patches (a reference level)."""
    centres = patch_centres(config)
    return torch.cdist(centres, centres).mean().item()


def max_patch_distance(config: ViTConfig) -> float:
    """Largest distance in pixels between two patch centres (the top of the distance axis)."""
    gh, gw = config.grid_size
    return math.hypot((gh - 1) * config.patch_size, (gw - 1) * config.patch_size)


# ---------------------------------------------------------------------------- one call
@dataclass
class Inspection:
    """Everything `vitfast inspect` computes for a batch of images."""

    config: ViTConfig
    pixels: np.ndarray  # [B, H, W, 3] or [B, H, W] (non-RGB models) in [0, 1], what the model saw (whole patches)
    rollout: torch.Tensor  # [B, gh, gw]
    head_attention: torch.Tensor  # [B, heads, gh, gw], last layer (the attention pool's, with global_pool="map")
    pos_similarity: torch.Tensor | None  # [N', N'] over config.pos_grid's positions; None without learned position embeddings
    attention_distance: torch.Tensor  # [depth, heads], pixels, averaged over the images
    source: str  # which token the maps start from, for titles

    def to_dict(self, index: int = 0) -> dict[str, Any]:
        """JSON-ready numbers for image `index` (distances are over the whole batch)."""
        return {
            "source": self.source,
            "grid_size": list(self.config.grid_size),
            "pos_grid": list(self.config.pos_grid),  # pos_embed_similarity's rows and columns
            "patch_size": self.config.patch_size,
            "num_prefix_tokens": self.config.num_prefix_tokens,
            "rollout": _rounded(self.rollout[index]),
            "head_attention": _rounded(self.head_attention[index]),
            "pos_embed_similarity": None if self.pos_similarity is None else _rounded(self.pos_similarity),
            "mean_attention_distance": _rounded(self.attention_distance),
        }


def inspect_model(model: torch.nn.Module, images: torch.Tensor) -> Inspection:
    """Run `model` on preprocessed `images` [B, C, H, W] and compute every inspection number."""
    cfg: ViTConfig = model.config
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()  # dropout would perturb the layers after the first
    try:
        with torch.no_grad():
            tokens, attentions = model.forward_features(images.to(device), return_attention=True)
            P, grid = cfg.num_prefix_tokens, cfg.grid_size
            read = 0 if cfg.pool_include_prefix else P  # PE's pool reads the class token too
            pooled = cfg.global_pool == "map" and not cfg.features_only  # features_only builds no head
            pool_attention = model.attn_pool(tokens[:, read:], return_attention=True)[1] if pooled else None
    finally:
        model.train(was_training)
    if pool_attention is not None:  # the head reads the attention pool's query: one more attention layer
        pool_attention = pool_attention.detach().to("cpu", torch.float64)  # [B, H, N - read]
        rollout = (pool_attention.mean(1).unsqueeze(1) @ rollout_matrix(attentions)[:, read:]).squeeze(1)[:, P:]
        heads = pool_attention[..., P - read :]  # its attention to the patches (to the prefix tokens left out of the maps)
        source = "attention-pool query" + (" (its share on the class token not drawn)" if read == 0 and P else "")
    else:
        # the head's readout: the class token, else the mean patch token; unpooled, the class token if there is one
        unpooled = cfg.global_pool == "" or cfg.features_only
        from_token = cfg.class_token if unpooled else cfg.global_pool in ("token", "token_avg")
        both_heads = cfg.distilled and cfg.dist_head and not unpooled  # DeiT's logits average the class and distillation heads
        rollout = attention_rollout(attentions, P, class_token=from_token, distilled=both_heads)
        heads = head_attention(attentions, P, class_token=from_token, distilled=both_heads)
        source = "class token" if from_token else "mean of patch tokens"
        if both_heads:
            source = "mean of the class and distillation tokens (the logits average their two heads)"
        if cfg.global_pool == "token_avg" and not unpooled:
            source += " (the head also reads the mean patch token)"
        if cfg.features_only:
            source += f" (the model returns the feature maps of blocks {list(cfg.feature_indices)}; drawn through block {len(attentions) - 1})"
        elif unpooled:
            source += " (the model pools nothing: every token is an output)"
    return Inspection(
        config=cfg,
        pixels=display_pixels(images, cfg),
        rollout=rollout.reshape(-1, *grid),
        head_attention=heads.reshape(*heads.shape[:2], *grid),
        pos_similarity=pos_embed_similarity(model),
        attention_distance=mean_attention_distance(attentions, cfg),
        source=source,
    )


def load_image(path: str | os.PathLike) -> Image.Image:
    """An image file read as predict and eval read it (`vitfast.data.open_image`: upright, 16-bit greyscale in 8 bits,
    decompression bombs refused), or `InputError` saying why it cannot be used."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path} is a folder; inspect looks at one image: give --image a file such as {path / 'img.png'}")
    if not path.is_file():
        raise InputError(f"image not found: {path}")
    return open_image(path)


def display_pixels(images: torch.Tensor, config: ViTConfig) -> np.ndarray:
    """Normalised [B, C, H, W] -> [B, H', W', 3] RGB in [0, 1] (or [B, H', W'] grey from channel 0 if C != 3),
    cut to the whole patches the model sees (H' = gh * patch_size), so the maps lie on the pixels they cover."""
    mean = torch.tensor(config.mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(config.std, dtype=torch.float32).view(1, -1, 1, 1)
    (gh, gw), p = config.grid_size, config.patch_size
    x = (images.detach().to("cpu", torch.float32)[..., : gh * p, : gw * p] * std + mean).clamp(0, 1)
    if x.shape[1] == 3:
        return x.permute(0, 2, 3, 1).numpy()
    return x[:, 0].numpy()


def _rounded(t: torch.Tensor) -> list:
    return np.round(t.numpy(), 6).tolist()


# ---------------------------------------------------------------------------- figures
def _new_figure(kind: str):
    """A fixed-size matplotlib Figure on an Agg canvas (matplotlib imported here, on first use)."""
    try:
        import matplotlib  # noqa: F401  (imported alone first so a missing package is reported as such)
    except ImportError:
        raise BackendUnavailable("the inspect figures need matplotlib: pip install vitfast[plot]") from None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZES[kind], dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _show_image(ax, pixels: np.ndarray) -> None:
    ax.imshow(pixels, cmap="gray" if pixels.ndim == 2 else None, vmin=0, vmax=1)
    ax.set_axis_off()


def _overlay(ax, pixels: np.ndarray, heat: np.ndarray, alpha: float = 0.6):
    """Draw `heat` [gh, gw] stretched over `pixels` [H, W(, 3)]; returns the heat image for a colorbar."""
    _show_image(ax, pixels)
    h, w = pixels.shape[:2]
    # imshow puts pixel centres on integers, so the image spans -0.5 .. size - 0.5.
    extent = (-0.5, w - 0.5, h - 0.5, -0.5)
    return ax.imshow(heat, cmap="inferno", alpha=alpha, extent=extent, interpolation="bilinear")


def plot_rollout(pixels: np.ndarray, rollout: torch.Tensor | np.ndarray, *, source: str = "class token"):
    """Input image [H, W(, 3)] next to it with the rollout map [gh, gw] overlaid."""
    fig = _new_figure("rollout")
    left, right = fig.subplots(1, 2)
    _show_image(left, pixels)
    left.set_title("input (as the model sees it)")
    im = _overlay(right, pixels, np.asarray(rollout))
    right.set_title(f"attention rollout from the {source}", fontsize=9)
    fig.colorbar(im, ax=right, shrink=0.8, label="rolled-out attention")
    return fig


def plot_head_attention(pixels: np.ndarray, maps: torch.Tensor | np.ndarray, *, source: str = "class token"):
    """Per-head maps [H, gh, gw] of the last layer, each overlaid on the image, in a near-square grid."""
    maps = np.asarray(maps)
    fig = _new_figure("heads")
    cols = math.ceil(math.sqrt(len(maps)))
    rows = math.ceil(len(maps) / cols)
    axes = np.asarray(fig.subplots(rows, cols, squeeze=False)).reshape(-1)
    for i, ax in enumerate(axes):
        if i < len(maps):
            _overlay(ax, pixels, maps[i])
            ax.set_title(f"head {i + 1}", fontsize=8)
        else:
            ax.set_axis_off()
    fig.suptitle(f"last layer: attention from the {source}, per head")
    return fig


def similarity_mosaic(sim: torch.Tensor | np.ndarray, grid_size: tuple[int, int]) -> np.ndarray:
    """[N, N] -> one image of gh x gw tiles (tile (r, c) = row r * gw + c as a [gh, gw] map), NaN gaps between tiles."""
    gh, gw = grid_size
    tiles = np.asarray(sim, dtype=np.float64).reshape(gh, gw, gh, gw)
    mosaic = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)
    for r in range(gh):
        for c in range(gw):
            mosaic[r * (gh + 1) : r * (gh + 1) + gh, c * (gw + 1) : c * (gw + 1) + gw] = tiles[r, c]
    return mosaic


def plot_pos_embed_similarity(sim: torch.Tensor | np.ndarray, grid_size: tuple[int, int]):
    """ViT paper Figure 7 centre: for each patch position, its embedding's cosine similarity to all others."""
    gh, gw = grid_size
    fig = _new_figure("pos_embed")
    ax = fig.subplots()
    from matplotlib import colormaps

    # One imshow of a tiled mosaic instead of gh * gw axes: fast even for 24x24 or 37x37 grids;
    # the NaN gaps between tiles draw white.
    cmap = colormaps["viridis"].with_extremes(bad="white")
    im = ax.imshow(similarity_mosaic(sim, grid_size), cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    for axis, g, setter, labeler in ((0, gh, ax.set_yticks, ax.set_ylabel), (1, gw, ax.set_xticks, ax.set_xlabel)):
        step = max(1, math.ceil(g / 16))  # keep tick labels readable on big grids
        idx = list(range(0, g, step))
        setter([i * (g + 1) + (g - 1) / 2 for i in idx], [str(i + 1) for i in idx])
        labeler("input patch row" if axis == 0 else "input patch column")
    ax.tick_params(length=0, labelsize=7)
    ax.set_title("position embedding similarity")
    fig.colorbar(im, ax=ax, shrink=0.8, label="cosine similarity")
    return fig


def plot_attention_distance(
    distance: torch.Tensor | np.ndarray, *, max_distance: float, uniform_distance: float, num_images: int = 1
):
    """ViT paper Figure 7 right: [L, H] mean attention distance (pixels) against depth, one dot per head.

    A dashed line marks `uniform_distance`, where a head that attends everywhere equally would sit.
    """
    distance = np.asarray(distance)
    depth, heads = distance.shape
    fig = _new_figure("attention_distance")
    ax = fig.subplots()
    layers = np.arange(1, depth + 1)
    for h in range(heads):
        ax.scatter(layers, distance[:, h], s=14, label=f"head {h + 1}")
    ax.axhline(uniform_distance, color="grey", linestyle="--", linewidth=1, label="uniform attention")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xlim(0.5, depth + 0.5)
    ax.set_ylim(0, max_distance * 1.05)
    ax.set_xticks(layers if depth <= 24 else layers[:: math.ceil(depth / 24)])
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right", markerscale=0.8)
    ax.set_title(f"mean attention distance over {num_images} image{'s' if num_images != 1 else ''}")
    return fig


def figures(inspection: Inspection, index: int = 0) -> dict[str, Any]:
    """All four figures for image `index`, keyed by the names in `FIGSIZES` (three without learned
    position embeddings: no pos_embed figure)."""
    pixels = inspection.pixels[index]
    pos = {} if inspection.pos_similarity is None else {
        "pos_embed": plot_pos_embed_similarity(inspection.pos_similarity, inspection.config.pos_grid)}
    return {
        "rollout": plot_rollout(pixels, inspection.rollout[index], source=inspection.source),
        "heads": plot_head_attention(pixels, inspection.head_attention[index], source=inspection.source),
        **pos,
        "attention_distance": plot_attention_distance(
            inspection.attention_distance,
            max_distance=max_patch_distance(inspection.config),
            uniform_distance=uniform_attention_distance(inspection.config),
            num_images=len(inspection.pixels),
        ),
    }


def save_figures(
    inspection: Inspection, out_dir: str | os.PathLike, *, index: int = 0, overwrite: bool = False
) -> dict[str, Path]:
    """Write `<name>.png` for every figure into `out_dir` (created if missing); returns the paths.

    All PNGs are rendered into a staging folder first and renamed into place only when every one
    succeeded, so a failure leaves none of them. Existing files are refused unless `overwrite`, which also removes a
    figure of an earlier run that this one does not make (pos_embed.png of a model with position embeddings).
    """
    out = check_figures_free(out_dir, overwrite)
    names = [n for n in FIGSIZES if n != "pos_embed" or inspection.pos_similarity is not None]
    paths = {name: out / f"{name}.png" for name in names}
    with contextlib.ExitStack() as claims:  # exits (publishes) only after the last figure rendered
        for name, fig in figures(inspection, index).items():
            claims.enter_context(claim_output(paths[name], overwrite)).tmp.write_bytes(_png(fig))
    for name in FIGSIZES.keys() - names:  # an earlier run's pos_embed.png would pass for this model's
        with contextlib.suppress(FileNotFoundError):
            (out / f"{name}.png").unlink()
    return paths


def check_figures_free(out_dir: str | os.PathLike, overwrite: bool) -> Path:
    """`out_dir` as a Path if `save_figures` may write there: every figure name it may write or remove is refused when it
    exists, unless `overwrite`. Cheap: a caller checks before building and running the model."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file; give --out a folder for the PNGs")
    existing = [f"{name}.png" for name in FIGSIZES if (out / f"{name}.png").exists()]
    if existing and not overwrite:
        raise VitfastError(f"{out} already holds {', '.join(existing)}; pass --force to replace them")
    return out


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()
