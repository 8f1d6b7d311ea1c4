"""Artifacts on disk: atomic writes, the `.json` sidecar every artifact carries, batch profiles.

The sidecar of `PATH` is `PATH.json` (e.g. `model.onnx.json`). It records the vitfast version,
the model config, precision, input spec, preprocessing, the source's sha256, tool versions, the
GPU for engines, and the parity numbers measured at export.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from vitfast import __version__
from vitfast.config import PREPROCESSING_FIELDS, ViTConfig
from vitfast.errors import ArtifactError
from vitfast.info import library_version

SIDECAR_SUFFIX = ".json"


def sidecar_path(path: str | os.PathLike) -> Path:
    return Path(str(path) + SIDECAR_SUFFIX)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def parse_batch(spec: str | int | tuple[int, int, int]) -> tuple[int, int, int]:
    """'MIN:OPT:MAX' (or one number N = N:N:N) -> (min, opt, max), validated."""
    if isinstance(spec, tuple):
        parts = list(spec)
    elif isinstance(spec, int):
        parts = [spec] * 3
    else:
        text = str(spec).strip()
        pieces = text.split(":")
        if len(pieces) not in (1, 3) or not all(p.strip().isdigit() for p in pieces):
            raise ArtifactError(f"--batch must be MIN:OPT:MAX (e.g. 1:8:32) or one number, got {text!r}")
        parts = [int(p) for p in pieces] * (3 if len(pieces) == 1 else 1)
    lo, opt, hi = parts
    if not 1 <= lo <= opt <= hi:
        raise ArtifactError(f"--batch needs 1 <= MIN <= OPT <= MAX, got {lo}:{opt}:{hi}")
    return lo, opt, hi


def tool_versions() -> dict[str, str | None]:
    return {name: library_version(name) for name in ("torch", "onnx", "onnxruntime", "tensorrt", "triton")}


def base_metadata(kind: str, config: ViTConfig, precision: str, *, batch: tuple[int, int, int] | None,
                  dynamic_batch: bool, source: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """The sidecar fields every artifact has; exporters add their own (parity, GPU, ...)."""
    h, w = config.img_hw
    return {
        "vitfast_version": __version__,
        "kind": kind,
        "precision": precision,
        "config": config.to_dict(),
        "input": {
            "name": "images",
            "shape": ["batch" if dynamic_batch else (batch or (1, 1, 1))[1], config.in_chans, h, w],
            "dtype": "float32",
            "batch": list(batch) if batch else None,
            "layout": "NCHW, normalised",
        },
        "output": {"name": "logits", "shape": ["batch", config.num_classes or config.embed_dim], "dtype": "float32"},
        "preprocessing": {k: getattr(config, k) for k in PREPROCESSING_FIELDS} | {"img_size": [h, w]},
        "source": {"path": str(source), "sha256": sha256_file(source)} if source and Path(source).is_file() else None,
        "tools": tool_versions(),
    }


def read_sidecar(path: str | os.PathLike) -> dict[str, Any]:
    side = sidecar_path(path)
    if not side.exists():
        raise ArtifactError(f"{path} has no sidecar {side.name}; re-export it with `vitfast export`")
    try:
        data = json.loads(side.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"sidecar {side} is not readable JSON ({exc}); re-export the artifact") from None
    if not isinstance(data, dict) or "config" not in data:
        raise ArtifactError(f"sidecar {side} lacks the model config; re-export the artifact")
    return data


def check_output_free(path: str | os.PathLike, force: bool) -> Path:
    path = Path(path)
    if path.exists() and not force:
        raise ArtifactError(f"{path} already exists; pass --force (force=True) to overwrite it")
    if path.is_dir():
        raise ArtifactError(f"{path} is a directory; give a file path for the artifact")
    return path


@contextlib.contextmanager
def atomic_artifact(path: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path in the same folder; on success rename it (and its sidecar and any
    `*.data` external-weights file written beside it) into place; on failure remove them all."""
    path = check_output_free(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    tmp = tmpdir / path.name
    try:
        yield tmp
        for produced in sorted(tmpdir.iterdir(), key=lambda p: p == tmp):  # the artifact itself last
            os.replace(produced, path.parent / produced.name)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def write_sidecar(tmp_artifact: Path, metadata: dict[str, Any]) -> None:
    """Write the sidecar next to an artifact still under its temporary path."""
    sidecar_path(tmp_artifact).write_text(json.dumps(metadata, indent=1, default=str))
