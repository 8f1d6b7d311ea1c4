"""Where an export starts and what `check` compares against: the fp32 reference model.

`vitfast export --model NAME` exports random weights seeded with `RANDOM_SEED`; the sidecar records
that (or the checkpoint's path and sha256) so `check` and the benchmarks can rebuild the same model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .checkpoint import load_checkpoint
from .config import ViTConfig
from .errors import ArtifactError
from .registry import create_model
from .runtime.sidecar import sha256_file

RANDOM_SEED = 0  # --model NAME exports random weights; the seed lets `check` rebuild them


def source_model(*, model: str | None = None, checkpoint: str | os.PathLike | None = None, img_size: int | None = None,
                 overrides: dict[str, Any] | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:  # fmt: skip
    """The reference model named by `model` or `checkpoint` (at `img_size`, with ViTConfig `overrides`),
    and how to rebuild it: the overrides and what was still guessed go in the sidecar."""
    overrides = overrides or {}
    if checkpoint:
        reference = load_checkpoint(checkpoint, img_size=img_size, overrides=overrides)
        ckpt = Path(checkpoint)
        return reference, {"checkpoint": str(ckpt.resolve()), "sha256": sha256_file(ckpt) if ckpt.is_file() else None,
                           "img_size": img_size, "overrides": overrides, "guessed": reference.config_guesses}  # fmt: skip
    torch.manual_seed(RANDOM_SEED)
    reference = create_model(model, **overrides, **({"img_size": img_size} if img_size else {}))
    return reference, {"model": model, "weights": f"random init, torch.manual_seed({RANDOM_SEED})", "img_size": img_size,
                       "overrides": overrides}  # fmt: skip


def rebuild_reference(source: dict[str, Any] | None, checkpoint: str | os.PathLike | None, config: ViTConfig,
                      overrides: dict[str, Any] | None = None) -> torch.nn.Module:  # fmt: skip
    """The fp32 reference for `check`: `checkpoint` (with `overrides`), else what the artifact's sidecar records as its source."""
    if checkpoint:
        return load_checkpoint(checkpoint, img_size=config.img_size, overrides=overrides)
    source = source or {}
    recorded = source.get("overrides") or {}
    if source.get("checkpoint") and Path(source["checkpoint"]).exists():
        return load_checkpoint(source["checkpoint"], img_size=source.get("img_size"), overrides=recorded)
    if source.get("model"):
        torch.manual_seed(RANDOM_SEED)
        return create_model(source["model"], **recorded, **({"img_size": source["img_size"]} if source.get("img_size") else {}))
    raise ArtifactError("cannot tell which model this artifact came from; pass --checkpoint PATH with the fp32 weights "
                        "or --against OTHER (any artifact of the same model)")
