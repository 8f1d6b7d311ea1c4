"""Image folders for evaluation and calibration: `DIR/<class>/*.png|jpg`, classes sorted by name."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Iterator

import torch
from PIL import Image, UnidentifiedImageError

from .config import ViTConfig
from .errors import InputError
from .preprocessing import preprocess

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff"}


def find_images(root: str | Path) -> list[Path]:
    """Every image file under `root`, recursively, in a stable order."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"image folder not found: {root}")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise InputError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) found under {root}")
    return files


def labeled_images(root: str | Path) -> tuple[list[Path], list[int], list[str]]:
    """(files, labels, class names) for DIR/<class>/...; a class's label is its index in sorted order."""
    root = Path(root)
    files = find_images(root)
    classes = sorted({p.relative_to(root).parts[0] for p in files if len(p.relative_to(root).parts) > 1})
    if not classes:
        raise InputError(f"{root} has images but no class subfolders; expected {root}/<class>/<image>")
    index = {c: i for i, c in enumerate(classes)}
    files = [p for p in files if len(p.relative_to(root).parts) > 1]
    return files, [index[p.relative_to(root).parts[0]] for p in files], classes


def open_image(path: Path) -> Image.Image:
    """The image at `path` as RGB; unreadable files and decompression bombs (more pixels than
    Pillow's `Image.MAX_IMAGE_PIXELS`, decoded to gigabytes) are one `InputError` naming the file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                return img.convert("RGB")
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise InputError(f"{path} is too large to decode safely ({exc}); remove it or resize it") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"{path} is not an image Pillow can read ({exc.__class__.__name__}); remove or replace it") from None


def batches(files: list[Path], config: ViTConfig, batch_size: int) -> Iterator[torch.Tensor]:
    """Preprocessed float batches [b, C, H, W] in file order."""
    for start in range(0, len(files), batch_size):
        yield preprocess([open_image(p) for p in files[start : start + batch_size]], config)


def random_images(config: ViTConfig, n: int, seed: int = 0, hw: tuple[int, int] | None = None) -> torch.Tensor:
    """n seeded random RGB images (uniform uint8 pixels) through the model's preprocessing:
    inputs inside the range real images reach, unlike N(0, 1) tensors. `hw`: another size than img_size's."""
    if hw is not None:
        config = config.replace(img_size=hw)
    h, w = config.img_hw
    pixels = torch.randint(0, 256, (n, h, w, config.in_chans), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return preprocess(pixels, config)


def other_sizes(config: ViTConfig) -> list[tuple[int, int]]:
    """Image sizes besides img_size a parity check of a dynamic_img_size model runs at (none for a fixed one): a taller
    and a wider non-square grid, one larger and one smaller than the model's own in patches."""
    if not config.dynamic_img_size:
        return []
    (gh, gw), p = config.grid_size, config.patch_size
    return [((gh + 3) * p, max(gw - 2, 1) * p), (max(gh // 2, 1) * p, (gw + 5) * p)]
