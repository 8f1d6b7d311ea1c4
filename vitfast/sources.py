"""Where an export starts and what `check` compares against: the fp32 reference model.

`vitfast export --model NAME` exports random weights seeded with `RANDOM_SEED`; the sidecar records
that (or the checkpoint's path and sha256, `checkpoint_sha256`) so `check` and the benchmarks can rebuild the same model.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from .checkpoint import folder_files, load_checkpoint
from .config import ViTConfig
from .errors import ArtifactError
from .registry import create_model
from .runtime.sidecar import sha256_file

RANDOM_SEED = 0  # --model NAME exports random weights; the seed lets `check` rebuild them


def source_model(*, model: str | None = None, checkpoint: str | os.PathLike | None = None, img_size: int | None = None,
                 overrides: dict[str, Any] | None = None, guessed: dict[str, str] | None = None,
                 use_ema: bool = True) -> tuple[torch.nn.Module, dict[str, Any]]:  # fmt: skip
    """The reference model named by `model` or `checkpoint` (at `img_size`, with ViTConfig `overrides`; `use_ema`: a
    training checkpoint's EMA weights, see `load_checkpoint`), and how to rebuild it: the overrides, the weights taken
    and what was still guessed go in the sidecar. `guessed`: what the overrides themselves guessed ({field: reason};
    e.g. read from an HF preprocessor_config.json), recorded with the rest."""
    overrides, guessed = overrides or {}, guessed or {}
    if checkpoint:
        reference = load_checkpoint(checkpoint, img_size=img_size, overrides=overrides, use_ema=use_ema)
        ckpt = Path(checkpoint)
        return reference, {"checkpoint": str(ckpt.resolve()), "sha256": checkpoint_sha256(ckpt),
                           "img_size": img_size, "overrides": overrides, "use_ema": use_ema,
                           "guessed": reference.config_guesses | guessed}  # fmt: skip
    reference = random_model(model, overrides, img_size)
    return reference, {"model": model, "weights": f"random init, torch.manual_seed({RANDOM_SEED})", "img_size": img_size,
                       "overrides": overrides, "guessed": guessed}  # fmt: skip


def checkpoint_sha256(path: Path) -> str:
    """The sha256 of a checkpoint file; of a model folder (Hugging Face's, a timm Hub one), the sha256 of its sorted
    "name sha256" lines for the files loading it reads (`folder_files`), so changed weights or preprocessing are seen."""
    if not path.is_dir():
        return sha256_file(path)
    return hashlib.sha256("".join(f"{f.relative_to(path)} {sha256_file(f)}\n" for f in folder_files(path)).encode()).hexdigest()


def random_model(name: str, overrides: dict[str, Any] | None = None, img_size: int | None = None) -> torch.nn.Module:
    """The registered model `name` (with ViTConfig `overrides`, at `img_size`) with random weights seeded by `RANDOM_SEED`:
    the same weights on every call, so an export of it can be checked and its attention maps inspected again."""
    torch.manual_seed(RANDOM_SEED)
    return create_model(name, **(overrides or {}), **({"img_size": img_size} if img_size else {}))


def rebuild_reference(source: dict[str, Any] | None, checkpoint: str | os.PathLike | None, config: ViTConfig,
                      overrides: dict[str, Any] | None = None) -> torch.nn.Module:  # fmt: skip
    """The fp32 reference for `check`: `checkpoint` (with `overrides`), else what the artifact's sidecar records as its
    source; a training checkpoint's weights (its EMA or not) as the export took them."""
    source = source or {}
    use_ema = source.get("use_ema", True)
    if checkpoint:
        return load_checkpoint(checkpoint, img_size=config.img_size, overrides=overrides, use_ema=use_ema)
    recorded = source.get("overrides") or {}
    if source.get("checkpoint"):
        ckpt = Path(source["checkpoint"])
        if not ckpt.exists():
            raise ArtifactError(f"the artifact was exported from {ckpt}, which is gone; pass --checkpoint PATH with its fp32 weights "
                                "or --against OTHER (any artifact of the same model)")  # fmt: skip
        # compared before loading: weights changed since the export would fail the check with nothing to say why;
        # older sidecars recorded None for a folder, which is loaded unchecked as then
        if source.get("sha256") and checkpoint_sha256(ckpt) != source["sha256"]:
            raise ArtifactError(f"{ckpt} has changed since the artifact was exported from it (its sha256 differs from the sidecar's); "
                                f"to compare with the weights as they are now, pass --checkpoint {ckpt}, or export again")  # fmt: skip
        return load_checkpoint(ckpt, img_size=source.get("img_size"), overrides=recorded, use_ema=use_ema)
    if source.get("model"):
        return random_model(source["model"], recorded, source.get("img_size"))
    raise ArtifactError("cannot tell which model this artifact came from; pass --checkpoint PATH with the fp32 weights "
                        "or --against OTHER (any artifact of the same model)")
