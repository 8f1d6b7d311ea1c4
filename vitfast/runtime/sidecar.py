"""Reading an artifact's `.json` sidecar: the metadata every engine needs to run it, checked.

The sidecar of `PATH` is `PATH.json` (e.g. `model.onnx.json`); `vitfast.export` writes it, the
runtime reads it (config, precision, batch profile, preprocessing, TensorRT version and GPU). Under
`files` it records the size and sha256 of the artifact (and of its `.data` weights): `read_sidecar`
refuses a sidecar whose files differ, so a new sidecar never vouches for an old artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from vitfast.atomic import SIDECAR_SUFFIX
from vitfast.config import ViTConfig
from vitfast.errors import ArtifactError, ConfigError, first_line
from vitfast.precision import PRECISIONS


def sidecar_path(path: str | os.PathLike) -> Path:
    return Path(str(path) + SIDECAR_SUFFIX)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_verified: dict[tuple, str] = {}  # (path, inode, size, mtime_ns) -> sha256: a file is hashed once per process



def cached_sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _verified:
        _verified[key] = sha256_file(path)
    return _verified[key]


def read_sidecar(path: str | os.PathLike, *, verify: bool = True) -> dict[str, Any]:
    """The sidecar of `path`, type-checked; `verify`: also check that it belongs to this artifact."""
    side = sidecar_path(path)
    if verify and not Path(path).exists():  # checked first: "no sidecar" would send a mistyped path to be re-exported
        raise ArtifactError(f"no such artifact: {path}")
    if not side.exists():
        raise ArtifactError(f"{path} has no sidecar {side.name}; re-export it with `vitfast export`")
    try:
        data = json.loads(side.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"sidecar {side} is not readable JSON ({exc}); re-export the artifact") from None
    if not isinstance(data, dict) or "config" not in data:
        raise ArtifactError(f"sidecar {side} lacks the model config; re-export the artifact")
    _check_fields(side, data)
    if verify:
        verify_binding(Path(path), data)
    return data


def _check_fields(side: Path, data: dict[str, Any]) -> None:
    """Wrong types in a hand-edited or corrupted sidecar: one clear error instead of a crash later."""
    bad = lambda what: ArtifactError(f"sidecar {side}: {what}; re-export the artifact")  # noqa: E731
    if not isinstance(data["config"], dict):
        raise bad("'config' is not an object")
    try:
        ViTConfig.from_dict(data["config"])
    except (ConfigError, TypeError, ValueError) as exc:
        raise bad(f"invalid config ({first_line(exc)})") from None
    if data.get("precision", "fp32") not in PRECISIONS:
        raise bad(f"'precision' must be one of {PRECISIONS}, got {data.get('precision')!r}")
    spec = data.get("input", {})
    if not isinstance(spec, dict):
        raise bad("'input' is not an object")
    shape = spec.get("shape", ["batch", 0, 0, 0])
    named = ("batch", "channels", "height", "width")
    if not (isinstance(shape, list) and len(shape) == 4 and all(type(d) is int or d == named[i] for i, d in enumerate(shape) if i != 1)
            and type(shape[1]) is int):  # fmt: skip
        raise bad(f"'input.shape' must be [B, C, H, W] (B an int or \"batch\", H and W ints or \"height\", \"width\"), got {shape!r}")
    pre = data.get("preprocessing", {})
    if not isinstance(pre, dict) or not all(isinstance(pre.get(k, []), list) for k in ("mean", "std")):
        raise bad("'preprocessing' must be an object with 'mean' and 'std' lists")
    batch = spec.get("batch")
    if batch is not None:
        if not (isinstance(batch, list) and len(batch) == 3 and all(type(b) is int for b in batch) and 1 <= batch[0] <= batch[1] <= batch[2]):
            raise bad(f"'input.batch' must be [MIN, OPT, MAX] with 1 <= MIN <= OPT <= MAX, got {batch!r}")
    elif type(shape[0]) is int:  # a fixed batch is its own profile (sidecars before 2026-11-28 left it out)
        spec["batch"] = [shape[0]] * 3
    sizes = spec.get("image_sizes")
    if sizes is not None:
        pairs = isinstance(sizes, list) and len(sizes) == 3 and all(isinstance(hw, list) and len(hw) == 2 and all(type(d) is int and d > 0
                                                                                                             for d in hw) for hw in sizes)  # fmt: skip
        if not (pairs and all(sizes[0][i] <= sizes[1][i] <= sizes[2][i] for i in (0, 1)) and shape[2:] == ["height", "width"]):
            raise bad(f"'input.image_sizes' must be [[H, W] min, opt, max], ascending, for an input of any height and width, got {sizes!r}")
    if not isinstance(data.get("files") or [], list):
        raise bad("'files' is not a list")
    for key in ("source", "parity"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise bad(f"{key!r} is not an object")


def verify_binding(path: Path, meta: dict[str, Any]) -> None:
    """Refuse a sidecar whose recorded files are not the ones beside it (size first: it costs nothing)."""
    files = meta.get("files")
    side = sidecar_path(path)
    if not files:
        raise ArtifactError(f"sidecar {side} does not record which file it describes (written by an older "
                            "vitfast, or by hand), so it cannot be trusted with this artifact; re-export it with `vitfast export`")  # fmt: skip
    for record in files:
        name = record.get("name") if isinstance(record, dict) else None
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise ArtifactError(f"sidecar {side} has a malformed 'files' entry {record!r}; re-export the artifact")
        target = path if record.get("role") == "artifact" else path.parent / name
        mismatch = ArtifactError(f"{target} is not the file its sidecar {side.name} describes (an interrupted or "
                                 "mixed-up export); re-export it with `vitfast export`")  # fmt: skip
        if not target.is_file() or target.stat().st_size != record.get("size"):
            raise mismatch
        if cached_sha256(target) != record.get("sha256"):
            raise mismatch


def check_graph_matches(path: Path, meta: dict[str, Any], inputs: list[tuple], outputs: list[tuple]) -> None:
    """Refuse a sidecar that disagrees with the graph it sits beside. `inputs` / `outputs`:
    (name, shape) per graph tensor, shape entries ints or None/str for dynamic axes."""
    config = ViTConfig.from_dict(meta["config"])
    side = sidecar_path(path).name
    wrong = lambda what: ArtifactError(f"{path} does not match its sidecar {side}: {what}; re-export the artifact")  # noqa: E731
    h, w = config.img_hw
    if len(inputs) != 1 or len(inputs[0][1]) != 4:
        raise wrong(f"the graph takes {[(n, list(s)) for n, s in inputs]}, not one image tensor [B, C, H, W]")
    for got, want, axis in zip(inputs[0][1][1:], (config.in_chans, h, w), "CHW"):
        if isinstance(got, int) and got != want:
            raise wrong(f"input axis {axis} is {got} in the graph and {want} in the sidecar")
    want = config.output_shape
    got = list(outputs[0][1]) if outputs else []
    if len(got) != 1 + len(want) or any(isinstance(g, int) and g != w for g, w in zip(got[1:], want)):
        raise wrong(f"the graph outputs {[(n, list(s)) for n, s in outputs]}, the sidecar says [B, {', '.join(map(str, want))}]")
    graph_batch, spec = inputs[0][1][0], meta.get("input") or {}
    batch = spec.get("batch")
    if isinstance(graph_batch, int) and (spec.get("shape") or ["batch"])[0] == "batch":
        raise wrong(f"the graph's batch axis is fixed at {graph_batch}, the sidecar says it is dynamic")
    if isinstance(graph_batch, int) and batch and batch != [graph_batch] * 3:
        raise wrong(f"the graph's batch is fixed at {graph_batch}, the sidecar's profile is {batch}")
    pre = meta.get("preprocessing") or {}
    for key in ("mean", "std"):
        if key in pre and list(pre[key]) != list(getattr(config, key)):
            raise wrong(f"preprocessing {key} {pre[key]} differs from the config's {list(getattr(config, key))}")
