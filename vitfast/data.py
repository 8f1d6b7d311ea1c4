"""Image folders for evaluation and calibration: `DIR/<class>/*.png|jpg`, classes sorted by name."""

from __future__ import annotations

import os
import re
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from .config import PREPROCESSING_FIELDS, ViTConfig
from .errors import InputError, VitfastWarning
from .preprocessing import has_alpha, preprocess

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff"}


def find_images(root: str | Path) -> list[Path]:
    """Every image file under `root`, recursively, in a stable order. Symlinked folders are followed (an ImageNet subset
    is usually class folders linked into one), as timm's folder reader and torchvision's ImageFolder do, where
    `Path.rglob` before Python 3.13 skips them; a link back to a folder it lies in is not entered again."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root} is a file, not a folder of images" if root.exists() else f"image folder not found: {root}")
    files = []
    above = {str(root): {os.path.realpath(root)}}  # each folder still to walk -> the real paths of it and its parents
    for folder, subfolders, names in os.walk(root, followlinks=True):
        seen = above.pop(folder)
        subfolders[:] = [d for d in subfolders if os.path.realpath(os.path.join(folder, d)) not in seen]  # a link cycle
        above.update((os.path.join(folder, d), seen | {os.path.realpath(os.path.join(folder, d))}) for d in subfolders)
        files += (Path(folder, n) for n in names if Path(n).suffix.lower() in IMAGE_SUFFIXES)
    files = sorted(p for p in files if p.is_file())
    if not files:
        raise InputError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) found under {root}")
    return files


def natural_key(name: str) -> list:
    """Sort key of timm's ImageDataset for class folders: case-folded, digit runs compared as numbers ("2" before "10")."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name.lower())]


def labeled_images(root: str | Path) -> tuple[list[Path], list[int], list[str]]:
    """(files, labels, class names) for DIR/<class>/...; a class's label is its index in natural order (`natural_key`:
    folders 0..11 are classes 0..11, where plain string order would make "10" class 2). Class folders holding no image
    are left out, as timm's folder reader leaves them out, and so are images directly in DIR (timm makes them a class
    ""), each with a warning naming them."""
    root = Path(root)
    files = find_images(root)
    classes = sorted({p.relative_to(root).parts[0] for p in files if len(p.relative_to(root).parts) > 1}, key=natural_key)
    if not classes:
        raise InputError(f"{root} has images but no class subfolders; expected {root}/<class>/<image>")
    loose = [p.name for p in files if len(p.relative_to(root).parts) == 1]
    if loose:
        warnings.warn(VitfastWarning(f"images directly in {root}, in no class folder, are left out: {len(loose)} ({shorten(loose, 3)}); "
                                     f"move them into {root}/<class>/ to count them"), stacklevel=2)  # fmt: skip
    empty = empty_class_folders(root, classes)
    if empty:
        warnings.warn(VitfastWarning(f"class folders of {root} with no images ({', '.join(sorted(IMAGE_SUFFIXES))}) are left out: "
                                     f"{shorten(empty, 5)}"), stacklevel=2)  # fmt: skip
    index = {c: i for i, c in enumerate(classes)}
    files = [p for p in files if len(p.relative_to(root).parts) > 1]
    return files, [index[p.relative_to(root).parts[0]] for p in files], classes


def empty_class_folders(root: str | Path, classes: list[str]) -> list[str]:
    """The folders directly in `root` that are not among `classes` (which hold images), in natural order; hidden ones
    (.ipynb_checkpoints, ...) are nobody's classes and not named."""
    return sorted((p.name for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in classes),
                  key=natural_key)  # fmt: skip


def shorten(names: list[str], n: int) -> str:
    """The first `n` of `names`, comma-separated, with ", ..." where there are more."""
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def upright(img: Image.Image) -> Image.Image:
    """`img` turned as its EXIF Orientation tag says (a phone photo taken sideways is stored sideways with tag 6 or 8), as
    transformers' `load_image` (its pipelines) and torchvision's `decode_image(apply_exif_orientation=True)` read files;
    `img` itself where the tag is absent or 1. timm's folder reader and a bare `Image.open` do not turn them."""
    orientation = img.getexif().get(ExifTags.Base.Orientation, 1)
    return ImageOps.exif_transpose(img) if orientation != 1 else img


def eight_bit(img: Image.Image, path: Path) -> Image.Image:
    """16-bit greyscale (Pillow's I;16 modes: PNG, TIFF) as 8-bit greyscale by the high byte of each pixel, as Pillow
    itself reads 16-bit colour files; Pillow's RGB conversion would clip it to 0..255, making nearly every pixel white
    (transformers' `load_image` and timm's folder reader do that). 32-bit integer and float pixels (modes I, F) are
    refused: their range is not in the file."""
    if img.mode.startswith("I;16"):
        return Image.fromarray((np.asarray(img) >> 8).astype(np.uint8), "L")
    if img.mode in ("I", "F"):
        kind = "32-bit integer" if img.mode == "I" else "floating-point"
        raise InputError(f"{path} holds {kind} pixels (Pillow mode {img.mode}), whose range the file does not give; "
                         "save it as an 8- or 16-bit image")  # fmt: skip
    return img


def band_values(img: Image.Image) -> Image.Image:
    """`img` (a new image, not the file's) in a mode whose bands `preprocess` takes as channels: L, LA, RGB, RGBA and CMYK
    as they are (an LA file is a 2-channel model's input, a CMYK one a 4-channel model's, where converting them here to
    RGBA or RGB would make up or drop bands; a 3-channel model gets the same RGB either way), a transparent colour (a
    greyscale or RGB PNG's `transparency`) as an alpha band, any other mode (a palette, bilevel, YCbCr, LAB) as RGB, or
    RGBA where it has transparency."""
    if img.mode in ("L", "RGB") and has_alpha(img):
        return img.convert("LA" if img.mode == "L" else "RGBA")
    if img.mode in ("L", "LA", "RGB", "RGBA", "CMYK"):
        return img.copy()  # loaded: the file closes when `open_image` returns
    return img.convert("RGBA" if has_alpha(img) else "RGB")


def open_image(path: Path) -> Image.Image:
    """The image at `path`, upright (`upright`: its EXIF orientation applied), 16-bit greyscale taken to 8 bits
    (`eight_bit`), its bands made values (`band_values`); `preprocess` makes them the model's channels (RGB for a
    3-channel model, transparent pixels as its `alpha_on_white` says). Unreadable files and decompression bombs (more pixels than
    Pillow's `Image.MAX_IMAGE_PIXELS`, decoded to gigabytes) are one `InputError` naming the file.
    Safe in threads: the pixel count is checked here, from the header, not by a process-wide warnings filter."""
    try:
        with Image.open(path) as img:  # reads the header only; Pillow itself refuses twice the limit
            pixels = img.width * img.height
            if not Image.MAX_IMAGE_PIXELS or pixels <= Image.MAX_IMAGE_PIXELS:
                return band_values(eight_bit(upright(img), path))
    except InputError:
        raise
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:  # the warning: under an "error" filter
        raise InputError(f"{path} is too large to decode safely ({exc}); remove it or resize it") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"{path} is not an image Pillow can read ({exc.__class__.__name__}); remove or replace it") from None
    raise InputError(f"{path} is too large to decode safely ({pixels} pixels, more than Pillow's limit {Image.MAX_IMAGE_PIXELS}); "
                     "remove it or resize it")  # fmt: skip


def default_workers() -> int:
    """Threads that decode and resize images: the CPUs this process may use, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


AHEAD = 2  # batches decoded ahead of the one the caller is running, so the model never waits for the files


def batches(files: list[Path], config: ViTConfig, batch_size: int, workers: int | None = None) -> Iterator[torch.Tensor]:
    """Preprocessed float batches [b, C, H, W] in file order. `workers` threads (default `default_workers()`) decode
    and resize up to `AHEAD` batches ahead: Pillow releases the GIL while it does, so they run beside the model.
    The first unreadable file in order raises its `InputError` when its batch is reached, as one thread would."""
    chunks = [files[i : i + batch_size] for i in range(0, len(files), batch_size)]
    workers = default_workers() if workers is None else workers
    if workers <= 1:
        yield from (torch.stack([_load(p, config) for p in chunk]) for chunk in chunks)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="vitfast-images")
    try:
        pending: deque[list[Future]] = deque()
        for chunk in chunks:
            pending.append([pool.submit(_load, p, config) for p in chunk])
            if len(pending) > AHEAD:
                yield torch.stack([f.result() for f in pending.popleft()])
        while pending:
            yield torch.stack([f.result() for f in pending.popleft()])
    finally:  # the caller stopped early (an error, a closed generator): drop what was queued
        pool.shutdown(wait=True, cancel_futures=True)


def open_images(files: list[Path], workers: int | None = None) -> list[Image.Image]:
    """`open_image` of every file, in order, decoded by `workers` threads (default `default_workers()`); the first
    unreadable file in order raises its `InputError`."""
    workers = default_workers() if workers is None else workers
    if workers <= 1 or len(files) <= 1:
        return [open_image(p) for p in files]
    with ThreadPoolExecutor(min(workers, len(files)), thread_name_prefix="vitfast-images") as pool:
        return list(pool.map(open_image, files))


def same_preprocessing(a: ViTConfig, b: ViTConfig) -> bool:
    """Whether an image file becomes the same input tensor for models of configs `a` and `b`."""
    fields = ("img_hw", "in_chans", *PREPROCESSING_FIELDS)
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def _load(path: Path, config: ViTConfig) -> torch.Tensor:
    """One image file -> normalised float [C, H, W], exactly as `preprocess` makes it in a batch."""
    return preprocess(open_image(path), config)[0]


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
