"""Artifacts on disk: writing the `.json` sidecar every artifact carries, bound to its artifact; batch and image-size
profiles.

The sidecar of `PATH` is `PATH.json` (e.g. `model.onnx.json`). It records the vitfast version,
the model config, precision, input spec, preprocessing, the source's sha256, tool versions, the
GPU for engines, the parity numbers measured at export, and under `files` the size and sha256
of the artifact (and of its `.data` weights): `read_sidecar` (in `vitfast.runtime.sidecar`) refuses a
sidecar whose files differ, so a new sidecar never vouches for an old artifact. Writing goes through
`vitfast.atomic`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Iterable

from vitfast._version import __version__
from vitfast.atomic import atomic_write_text
from vitfast.config import PREPROCESSING_FIELDS, ViTConfig
from vitfast.errors import ArtifactError, ParityWarning
from vitfast.flags import MAX_BATCH
from vitfast.info import library_version
from vitfast.parity import failed_export
from vitfast.runtime.sidecar import (  # noqa: F401  (reading sidecars is the runtime's; re-exported for export's callers)
    PRECISIONS,
    cached_sha256,
    check_graph_matches,
    read_sidecar,
    sha256_file,
    sidecar_path,
    verify_binding,
)

def parse_batch(spec: str | int | tuple[int, int, int]) -> tuple[int, int, int]:
    """'MIN:OPT:MAX' (or one number N = N:N:N) -> (min, opt, max), validated."""
    if isinstance(spec, tuple):
        parts = list(spec)
    elif isinstance(spec, int):
        parts = [spec] * 3
    else:
        text = str(spec).strip()
        pieces = text.split(":")
        if len(pieces) not in (1, 3) or not all(p.strip().isascii() and p.strip().isdigit() for p in pieces):
            raise ArtifactError(f"--batch must be MIN:OPT:MAX (e.g. 1:8:32) or one number, got {text!r}")
        parts = [int(p) for p in pieces] * (3 if len(pieces) == 1 else 1)
    lo, opt, hi = parts
    if not all(type(p) is int for p in parts) or not 1 <= lo <= opt <= hi:
        raise ArtifactError(f"--batch needs whole numbers 1 <= MIN <= OPT <= MAX, got {lo}:{opt}:{hi}")
    if hi > MAX_BATCH:
        raise ArtifactError(f"--batch MAX {hi} is above {MAX_BATCH}, the largest batch axis vitfast exports; lower it")
    return lo, opt, hi


HW = tuple[int, int]


def parse_image_sizes(spec: str | tuple | None, config: ViTConfig) -> tuple[HW, HW, HW]:
    """The (min, opt, max) image sizes of a TensorRT profile for a dynamic_img_size model: 'MIN:OPT:MAX', each N
    (square) or HxW, e.g. '112:224:448x672', or three (h, w) pairs; validated: whole patches, min <= opt <= max in
    each dimension. None: `default_image_sizes`. A fixed-size model has no image-size profile: refused."""
    if not config.dynamic_img_size:
        raise ArtifactError(f"--image-sizes sets the image sizes a TensorRT engine takes, and this model takes one "
                            f"({config.img_hw[0]}x{config.img_hw[1]}); export with --dynamic-img-size for a range of sizes")  # fmt: skip
    if spec is None:
        return default_image_sizes(config)
    text = spec if isinstance(spec, str) else ":".join("x".join(map(str, hw)) for hw in spec)
    pieces = [piece.strip().lower().split("x") for piece in str(text).split(":")]
    if len(pieces) != 3 or not all(len(p) in (1, 2) and all(d.isascii() and d.isdigit() for d in p) for p in pieces):
        raise ArtifactError(f"--image-sizes must be MIN:OPT:MAX, each N or HxW (e.g. 112:224:448x672), got {text!r}")
    sizes = tuple((int(p[0]), int(p[-1])) for p in pieces)
    patch = config.patch_size
    if any(d < patch or d % patch for hw in sizes for d in hw):
        fit = ":".join("x".join(str(max(d // patch, 1) * patch) for d in hw) for hw in sizes)
        raise ArtifactError(f"--image-sizes {text} are not whole {patch}-pixel patches; e.g. {fit}")
    lo, opt, hi = sizes
    if not all(lo[i] <= opt[i] <= hi[i] for i in (0, 1)):
        raise ArtifactError(f"--image-sizes needs MIN <= OPT <= MAX in height and in width, got {text}")
    return sizes


def default_image_sizes(config: ViTConfig) -> tuple[HW, HW, HW]:
    """Half to twice img_size in each dimension (whole patches, at least one), optimised for img_size itself."""
    p = config.patch_size
    lo = tuple(max(d // 2 // p, 1) * p for d in config.img_hw)
    return lo, tuple(config.img_hw), tuple(2 * d for d in config.img_hw)


def tool_versions() -> dict[str, str | None]:
    return {name: library_version(name) for name in ("torch", "onnx", "onnxruntime", "tensorrt", "triton")}


def base_metadata(kind: str, config: ViTConfig, precision: str, *, batch: tuple[int, int, int] | None,
                  dynamic_batch: bool, source: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """The sidecar fields every artifact has; exporters add their own (parity, GPU, ...)."""
    h, w = config.img_hw
    if not dynamic_batch:  # the graph is fixed at the profile's opt: that one size is all it runs
        batch = ((batch or (1, 1, 1))[1],) * 3
    return {
        "vitfast_version": __version__,
        "kind": kind,
        "precision": precision,
        "config": config.to_dict(),
        "input": {
            "name": "images",
            "shape": ["batch" if dynamic_batch else batch[0], config.in_chans,
                      *(("height", "width") if config.dynamic_img_size else (h, w))],
            "dtype": "float32",
            "batch": list(batch) if batch else None,
            "layout": "NCHW, normalised" + (f"; any height and width in whole {config.patch_size}-pixel patches" if config.dynamic_img_size else ""),
        },
        "output": {"name": "logits", "shape": ["batch", *(d or "dynamic" for d in config.output_shape)], "dtype": "float32"},
        "preprocessing": {k: getattr(config, k) for k in PREPROCESSING_FIELDS} | {"img_size": [h, w]},
        "source": made_from(source) if source and Path(source).is_file() else None,
        "tools": tool_versions(),
    }


def made_from(path: Path, *, intermediate: bool = False) -> dict[str, Any]:
    """{path, sha256} of the file an artifact was made from. An `intermediate` is a temporary of the export that made the
    artifact, deleted with its staging folder: its path would name nothing, so it is recorded by its hash alone, not kept."""
    return {"path": None, "sha256": sha256_file(path), "kept": False} if intermediate else {"path": str(path), "sha256": sha256_file(path)}


def file_records(artifact: Path, companions: Iterable[Path] = ()) -> list[dict[str, Any]]:
    """[{role, name, size, sha256}] for the artifact and its external-weights file(s). The artifact
    is checked wherever it is moved or renamed to; companions keep their names (a graph names them)."""
    data = Path(str(artifact) + ".data")
    extra = list(companions) + ([data] if data.is_file() and data not in companions else [])
    return [{"role": "artifact" if p == artifact else "external-data", "name": p.name, "size": p.stat().st_size,
             "sha256": cached_sha256(p)} for p in [artifact, *extra]]  # fmt: skip


def write_sidecar(artifact: Path, metadata: dict[str, Any], companions: Iterable[Path] = ()) -> None:
    """Write the sidecar next to an artifact (usually still under its temporary path), recording
    the artifact's size and sha256; written atomically, so a rewrite never leaves half a sidecar."""
    artifact = Path(artifact)
    metadata = {**metadata, "files": file_records(artifact, list(companions)) if artifact.is_file() else None}
    atomic_write_text(sidecar_path(artifact), json.dumps(metadata, indent=1, default=str))


def warn_if_parity_failed(artifact: str | Path, parity: dict[str, Any] | None) -> None:
    """A `ParityWarning` when the export written to `artifact` failed its parity check. Not an error: the artifact stays
    for inspection and its sidecar records the numbers (the CLI makes it its error line and exit code 1)."""
    message = failed_export(artifact, parity)
    if message:
        warnings.warn(ParityWarning(message), stacklevel=3)
