"""A Triton Inference Server model repository from an exported artifact (`--format triton-repo`).

    OUT/
      <name>/config.pbtxt              the network: onnxruntime_onnx (from .onnx) or tensorrt_plan, warmed up; a plan's
                                       names in a comment the TensorRT version the Triton release must bundle
      <name>/labels.txt                class names, one per line, when the model has them (`label_filename`)
      <name>/1/model.onnx | model.plan   (from .plan/.engine/.trt), with its vitfast sidecar beside it
      <name>_preprocess/config.pbtxt   python backend: uint8 images [B, H, W, C] -> float [B, C, H, W]
      <name>_preprocess/1/model.py     `vitfast/export/triton_preprocess.py` verbatim (numpy only)
      <name>_uint8/config.pbtxt        ensemble: <name>_preprocess -> <name>, so clients send raw uint8
      <name>_uint8/labels.txt          the same class names, for the ensemble's `logits`
      <name>_uint8/1/                  (empty: Triton wants a version folder for ensembles too)
    OUT.json                           sidecar: the source artifact's metadata, the model names and the sha256
                                       of every file written (`contents`: what `--force` may replace)

`<name>` and `<name>_uint8` have the names, input `images` and output `logits` of `vitfast serve`'s two models, so a
client that asks for `logits` alone works with both; `serve`'s `topk_indices`, `topk_scores` and `topk_labels` are not
here: with labels, Triton's classification extension answers `class_count` requests on `logits` as "score:index:label".
(`<name>_preprocess` is the repository's own.) One exception: `<name>` from an engine built from another tool's graph
has that graph's tensor names (e.g. `pixel_values` in, `pooler_output` out), since Triton binds a TensorRT model's
tensors by the engine's own names; `<name>_uint8` maps them to `images` and `logits` all the same.
The network gets a `model_warmup` (random inputs at batch 1 and at the maximum batch) so the first
client request does not pay for ONNX Runtime / TensorRT initialisation.
`config.pbtxt` is protobuf text format for Triton's `ModelConfig` (model_config.proto).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

from vitfast.atomic import SIDECAR_SUFFIX, STAGING, check_output_free, claim_output, clean_leftovers, is_empty_folder
from vitfast.config import ViTConfig
from vitfast.errors import ArtifactError, OutputError, VitfastWarning
from vitfast.runtime import ENGINE_SUFFIXES

from .artifacts import cached_sha256, read_sidecar, sidecar_path, write_sidecar
from .triton_preprocess import PreprocessSpec

DEFAULT_NAME = "vit"
DEFAULT_MAX_BATCH = 32  # for artifacts that record no batch profile
DEFAULT_QUEUE_DELAY_US = 100
LABEL_FILE = "labels.txt"
PREPROCESS_SOURCE = Path(__file__).with_name("triton_preprocess.py")
_TRITON_DTYPES = {"float32": "TYPE_FP32"}  # vitfast artifacts take and return float32 (fp16 stays inside)


class Enum(str):
    """A protobuf enum value: written bare in text format (TYPE_FP32), not quoted."""


def check_model_name(name: str) -> None:
    """Triton model names: letters, digits, dots, underscores and dashes."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name or "") or set(name) == {"."}:
        raise ArtifactError(f"model name {name!r} is not valid for Triton: use letters, digits, '.', '_' and '-' (not only dots)")


def model_names(name: str) -> dict[str, str]:
    """The three model names in a repository (and on a `vitfast serve` server) for `name`."""
    return {"model": name, "preprocess": f"{name}_preprocess", "ensemble": f"{name}_uint8"}


def triton_repository(
    artifact: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    name: str = DEFAULT_NAME,
    max_batch_size: int | None = None,
    instance_count: int = 1,
    max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
    force: bool = False,
    intermediate: bool = False,
) -> Path:
    """Write a Triton model repository for an ONNX file or TensorRT engine (with its sidecar) to `out_dir`.

    `max_batch_size` defaults to the artifact's batch profile maximum; `instance_count` is the
    number of execution instances of the network (and of the preprocessing model). Written to a
    temporary folder and renamed into place; an existing empty `out_dir` (a volume's mount point) is filled in place, and
    a repository vitfast wrote there is replaced with `force=True` (`check_repository_free`). `intermediate`: `artifact` is the
    caller's temporary, copied in and not kept, so the sidecar's `artifact` is None rather than a path that names nothing.
    """
    artifact = Path(artifact)
    check_model_name(name)
    platform = _platform(artifact)
    meta = read_sidecar(artifact)
    config = ViTConfig.from_dict(meta["config"])
    max_batch = _max_batch(meta, platform, max_batch_size)
    check_native_size(meta["input"].get("image_sizes"), meta["preprocessing"]["img_size"], artifact,
                      "a Triton repository's warm-up and uint8 preprocessing send")  # fmt: skip
    if instance_count < 1 or max_queue_delay_us < 0:
        raise ArtifactError("instance_count must be >= 1 and max_queue_delay_us >= 0")
    spec = PreprocessSpec.from_config(config)
    out = check_repository_free(out_dir, force)
    names = model_names(name)
    labels = config.labels if config.classifies else None  # Triton's classification reads one score per class and image
    configs = {
        names["model"]: model_config(names["model"], platform, meta, max_batch, instance_count, max_queue_delay_us, labels=bool(labels)),
        names["preprocess"]: preprocess_config(names["preprocess"], spec, meta, max_batch, instance_count, max_queue_delay_us),
        names["ensemble"]: ensemble_config(names, spec, meta, max_batch, labels=bool(labels)),
    }
    with claim_output(out, force, directory=True) as claim:
        check_repository_free(out, force)  # again, under the claim: what we replace is still ours
        tmp = claim.tmp
        for model, text in configs.items():
            (tmp / model / "1").mkdir(parents=True)
            (tmp / model / "config.pbtxt").write_text(text)
        for model in (names["model"], names["ensemble"]) if labels else ():
            (tmp / model / LABEL_FILE).write_text("".join(f"{label}\n" for label in labels))
        _copy_artifact(artifact, tmp / names["model"] / "1" / ("model.onnx" if platform == "onnxruntime_onnx" else "model.plan"))
        shutil.copyfile(PREPROCESS_SOURCE, tmp / names["preprocess"] / "1" / "model.py")
        sidecar = {**meta, "kind": "triton-repository", "artifact": None if intermediate else str(artifact.resolve()), "platform": platform,
                   "models": names, "max_batch_size": max_batch, "contents": repository_contents(tmp)}  # fmt: skip
        write_sidecar(tmp, sidecar)
    return out


def check_native_size(sizes, img_hw, artifact: Any, sent_by: str) -> None:
    """A dynamic-size engine's `sizes` (min, opt, max) must take the model's own `img_hw`: uint8 preprocessing resizes
    every image to it (in a repository and in `vitfast serve`), and Triton refuses a model whose warm-up shape the engine
    rejects. `sent_by` ends the message's "which ..." clause: what sends that size."""
    h, w = img_hw
    if sizes and not all(lo <= d <= hi for lo, d, hi in zip(sizes[0], (h, w), sizes[2])):
        (h0, w0), (h1, w1) = sizes[0], sizes[2]
        raise ArtifactError(f"{artifact} takes images of {h0}x{w0} to {h1}x{w1}, not the model's own {h}x{w}, which {sent_by}; "
                            f"rebuild it with --image-sizes covering {h}x{w}")  # fmt: skip


# ---------------------------------------------------------------------------- configs


def model_config(name: str, platform: str, meta: dict[str, Any], max_batch: int, instances: int, delay_us: int,
                 labels: bool = False) -> str:  # fmt: skip
    """config.pbtxt of the network itself (`labels`: its output names labels.txt)."""
    kind = "KIND_GPU" if platform == "tensorrt_plan" else "KIND_AUTO"  # ONNX Runtime: GPU when the server has one
    input_name, input_dims = meta["input"]["name"], meta["input"]["shape"][1:]
    native = [input_dims[0], *meta["preprocessing"]["img_size"]]  # a --dynamic-img-size graph warms up at its own size
    # a plan deserializes only under the TensorRT version that built it: Triton's own, fixed per release
    built_with = (meta.get("tensorrt") or {}).get("version", "that built it")
    note = f"# model.plan loads only in a Triton release whose bundled TensorRT is {built_with} (NVIDIA's support matrix)\n"
    return (note if platform == "tensorrt_plan" else "") + to_pbtxt({
        "name": name,
        "platform": platform,
        "max_batch_size": max_batch,
        "input": [_tensor(input_name, _dtype(meta["input"]), input_dims)],
        "output": [_output(meta["output"], labels)],
        "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
        "instance_group": [{"count": instances, "kind": Enum(kind)}],
        "model_warmup": [
            {"name": f"random_batch_{batch}", "batch_size": batch, "inputs": [{"key": input_name, "value": {
                "data_type": Enum(_dtype(meta["input"])), "dims": native, "random_data": True}}]}
            for batch in sorted({1, max_batch})
        ],
    })  # fmt: skip


def preprocess_config(name: str, spec: PreprocessSpec, meta: dict[str, Any], max_batch: int, instances: int, delay_us: int) -> str:
    """config.pbtxt of the python-backend preprocessing model (its parameters are the PreprocessSpec)."""
    return to_pbtxt({
        "name": name,
        "backend": "python",
        "max_batch_size": max_batch,
        "input": [_tensor("images", "TYPE_UINT8", [-1, -1, spec.in_chans])],
        "output": [_tensor("pixels", _dtype(meta["input"]), [spec.in_chans, *meta["preprocessing"]["img_size"]])],  # resized to img_size
        "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
        "instance_group": [{"count": instances, "kind": Enum("KIND_CPU")}],
        "parameters": [{"key": k, "value": {"string_value": v}} for k, v in spec.to_parameters().items()],
    })  # fmt: skip


def ensemble_config(names: dict[str, str], spec: PreprocessSpec, meta: dict[str, Any], max_batch: int, labels: bool = False) -> str:
    """config.pbtxt of the ensemble: raw uint8 images in, `logits` out (`labels`: named by labels.txt), whatever the network's
    own tensor names (an engine built from another tool's graph keeps that graph's: pixel_values, pooler_output)."""
    input_name, output_name = meta["input"]["name"], meta["output"]["name"]
    return to_pbtxt({
        "name": names["ensemble"],
        "platform": "ensemble",
        "max_batch_size": max_batch,
        "input": [_tensor("images", "TYPE_UINT8", [-1, -1, spec.in_chans])],
        "output": [_output(meta["output"] | {"name": "logits"}, labels)],
        "ensemble_scheduling": {"step": [
            {"model_name": names["preprocess"], "model_version": -1,
             "input_map": [{"key": "images", "value": "images"}], "output_map": [{"key": "pixels", "value": "pixels"}]},
            {"model_name": names["model"], "model_version": -1,
             "input_map": [{"key": input_name, "value": "pixels"}], "output_map": [{"key": output_name, "value": "logits"}]},
        ]},
    })  # fmt: skip


def to_pbtxt(message: dict[str, Any], indent: int = 0) -> str:
    """A dict as protobuf text format: lists of dicts are repeated messages (maps included, as
    key/value entries), lists of scalars are repeated scalars, `Enum` values are written bare."""
    pad = "  " * indent
    lines = []
    for field, value in message.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{field} {{\n{to_pbtxt(value, indent + 1)}{pad}}}")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.extend(f"{pad}{field} {{\n{to_pbtxt(v, indent + 1)}{pad}}}" for v in value)
        elif isinstance(value, list):
            lines.append(f"{pad}{field}: [ {', '.join(_scalar(v) for v in value)} ]")
        else:
            lines.append(f"{pad}{field}: {_scalar(value)}")
    return "".join(line + "\n" for line in lines)


def _scalar(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string of printable ASCII is a valid text-format string
    return str(value)


def _tensor(name: str, dtype: str, dims) -> dict[str, Any]:
    return {"name": name, "data_type": Enum(dtype), "dims": [d if isinstance(d, int) else -1 for d in dims]}  # "height", "dynamic": -1


def _output(tensor: dict[str, Any], labels: bool) -> dict[str, Any]:
    out = _tensor(tensor["name"], _dtype(tensor), tensor["shape"][1:])
    return out | {"label_filename": LABEL_FILE} if labels else out


def _dtype(tensor: dict[str, Any]) -> str:
    dtype = tensor.get("dtype", "float32")
    if dtype not in _TRITON_DTYPES:
        raise ArtifactError(f"tensor {tensor.get('name')!r} has dtype {dtype}; Triton configs are written for {sorted(_TRITON_DTYPES)}")
    return _TRITON_DTYPES[dtype]


# ---------------------------------------------------------------------------- checks and files


def _platform(artifact: Path) -> str:
    if not artifact.is_file():
        raise ArtifactError(f"no such artifact: {artifact}")
    suffix = artifact.suffix.lower()
    if suffix == ".onnx":
        return "onnxruntime_onnx"
    if suffix in ENGINE_SUFFIXES:
        return "tensorrt_plan"
    raise ArtifactError(
        f"{artifact} is not an ONNX file or TensorRT engine; export one first "
        "(`vitfast export --format triton-repo` does that for a checkpoint or model name)"
    )


def _max_batch(meta: dict[str, Any], platform: str, requested: int | None) -> int:
    """Triton's max_batch_size: requested or the profile's maximum, within what the artifact runs."""
    if meta["input"]["shape"][0] != "batch":
        raise ArtifactError("this artifact has a fixed batch size; Triton's dynamic batching needs one exported with a dynamic batch axis")
    profile = meta["input"].get("batch")
    max_batch = requested if requested is not None else (profile[2] if profile else DEFAULT_MAX_BATCH)
    if max_batch < 1:
        raise ArtifactError(f"max_batch_size must be >= 1, got {max_batch}")
    if platform == "tensorrt_plan" and profile:
        if profile[0] > 1:  # the dynamic batcher sends any batch from 1 up
            raise ArtifactError(f"this engine's batch profile starts at {profile[0]}; Triton needs 1: rebuild with --batch 1:OPT:MAX")
        if max_batch > profile[2]:
            raise ArtifactError(f"max_batch_size {max_batch} exceeds this engine's profile maximum {profile[2]}")
    return max_batch


def _copy_artifact(artifact: Path, target: Path) -> None:
    """Copy the artifact under Triton's default file name, with the files its sidecar records beside it (external ONNX
    weights, which keep their own name because the graph refers to them by it) and its sidecar, bound to the copy. Only
    those: a `.data` file beside the artifact that its sidecar does not record is not its graph's (a stale or a
    stranger's file)."""
    meta = read_sidecar(artifact)  # verified: the files it records are the ones beside the artifact
    shutil.copyfile(artifact, target)
    companions = [target.parent / r["name"] for r in meta["files"] if r["role"] != "artifact"]
    for copy in companions:
        shutil.copyfile(artifact.parent / copy.name, copy)
    write_sidecar(target, meta, companions=companions)


def check_repository_free(path: str | os.PathLike, force: bool) -> Path:
    """The repository path, if it may be written: absent, an empty folder, or with `force` a repository vitfast wrote. A
    staging folder that a killed write left in it is removed first, with a warning (`vitfast.atomic.clean_leftovers`).

    `force` never deletes what vitfast did not write: the `OUT.json` sidecar records the sha256 of every file in the
    repository, and a folder holding anything else, or a file changed since, is refused by name."""
    path = Path(path)
    if clean_leftovers(path):  # tritonserver takes every subfolder for a model, and refuses to start on this one
        warnings.warn(VitfastWarning(f"removed {path / STAGING}, which a vitfast run killed while writing {path} left there"), stacklevel=2)
    if path.is_dir() and not is_empty_folder(path):
        problem = _not_ours(path)
        if problem:  # before the --force check: never advise --force where it would be refused
            raise OutputError(f"{path} {problem}, so --force will not replace it; move it away or choose another --out")
    return check_output_free(path, force, directory=True, beside=(SIDECAR_SUFFIX,))


def _not_ours(path: Path) -> str | None:
    """Why the folder `path` is not a repository vitfast wrote and nobody changed since; None if it is."""
    side = sidecar_path(path)
    try:
        meta = json.loads(side.read_text())
    except (OSError, ValueError):
        meta = None
    if path.is_symlink() or not isinstance(meta, dict) or meta.get("kind") != "triton-repository":
        return f"is not a model repository vitfast wrote (no {side.name} of one beside it)"
    recorded = meta.get("contents")
    if not isinstance(recorded, dict):  # vitfast < this change recorded names only: a user's edit looks like its own file
        return (f"is a model repository an older vitfast wrote, whose {side.name} records no sha256 of its files, so changes "
                "made to it since cannot be told apart")  # fmt: skip
    found = repository_contents(path)
    extra = [name for name in found if name not in recorded]
    changed = [name for name in found if name in recorded and found[name] != recorded[name]]
    if extra or changed:
        return "holds " + " and ".join(
            f"{what} ({', '.join(names[:5])}{f' and {len(names) - 5} more' if len(names) > 5 else ''})"
            for what, names in (("files vitfast did not write", extra), ("files changed since vitfast wrote them", changed)) if names
        )  # fmt: skip
    return None


def repository_contents(root: Path) -> dict[str, str | None]:
    """Every entry under `root` (but vitfast's staging folder) by relative path: a file's sha256, None for a folder,
    "link" or "other" for what vitfast never writes (a symbolic link is not followed)."""
    contents: dict[str, str | None] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not (folder == str(root) and d == STAGING)]
        for entry in (Path(folder, name) for name in dirs + files):
            kind = "link" if entry.is_symlink() else None if entry.is_dir() else cached_sha256(entry) if entry.is_file() else "other"
            contents[entry.relative_to(root).as_posix() + ("/" if kind is None else "")] = kind
    return dict(sorted(contents.items()))
