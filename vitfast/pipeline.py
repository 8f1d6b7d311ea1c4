"""The work behind `vitfast export`, `check`, `eval` and `predict`, as library functions with typed arguments.

The command line (`vitfast.cli`) parses flags and prints; everything here takes plain values and
returns paths or result dicts, so scripts and the CLI share one implementation.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from .checkpoint import describe_guesses, load_checkpoint
from .config import ViTConfig
from .data import (
    batches, empty_class_folders, find_images, labeled_images, open_image, open_images, random_images, same_preprocessing, shorten,
)  # fmt: skip
from .errors import ArtifactError, GuessedConfigWarning, InputError, ParityWarning, VitfastWarning, first_line
from .export.artifacts import read_sidecar, warn_if_parity_failed, write_sidecar
from .export.onnx_export import to_onnx
from .export.quantize import calibration_files, quantize_int8
from .export.triton_repo import DEFAULT_NAME, triton_repository
from .layerwise import compare_layers
from .parity import compare, failure, looser_precision, with_other_sizes
from .preprocessing import preprocess
from .progress import Reporter, reporting
from .runtime import Engine, TorchEngine, load_engine
from .sources import rebuild_reference

TOP_K = 5  # eval reports top-1 and top-k accuracy
CHECK_CHUNK = 16  # images per call in a parity check: memory stays bounded on --samples 1000, and progress shows


@dataclass(frozen=True)
class Calibration:
    """int8 calibration: images under `data_dir` (searched recursively), see `vitfast.export.quantize_int8`."""

    data_dir: str | os.PathLike
    method: str = "minmax"
    samples: int = 256
    target: str = "tensorrt"
    exclude: Sequence[str] = ()
    keep_float: int = 0  # the n most quantization-sensitive layers also stay float (measured)


def export_onnx(model: torch.nn.Module, out: Path, *, precision: str, batch: tuple[int, int, int], source: dict[str, Any],
                opset: int = 18, calibration: Calibration | None = None, force: bool = False,
                scratch: Path | None = None, progress: Reporter | None = None) -> Path:  # fmt: skip
    """`model` as an ONNX file at `out`: fp32/fp16 directly, int8 as an fp32 export then Q/DQ calibration.
    `scratch`: a folder for the int8 path's fp32 intermediate (e.g. `vitfast.atomic.reserve_output`'s, beside `out`).
    `progress`: told each phase (`vitfast.progress`)."""
    if precision != "int8":
        return to_onnx(model, out, precision=precision, batch=batch, opset=opset, force=force, source=source, progress=progress)
    if calibration is None:
        raise ArtifactError("an int8 export needs calibration images (Calibration(data_dir=...), --calib-dir DIR)")
    for path in (path for part in calibration_files(calibration.data_dir, calibration.samples) for path in part):
        open_image(path)  # an unreadable calibration image fails now, not after the fp32 export
    with _scratch(scratch) as folder:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ParityWarning)  # the fp32 graph is a temporary: its failure is the error below
            fp32 = to_onnx(model, folder / "fp32.onnx", batch=batch, opset=opset, source=source, progress=progress)
        failed = failure(read_sidecar(fp32)["parity"])
        if failed:  # int8 parity is measured against this graph: against a wrong one it would pass and mean nothing
            raise ArtifactError(f"the fp32 ONNX graph that int8 quantizes disagrees with PyTorch ({failed}), so nothing was "
                                "quantized; export it with --format onnx --precision fp32 to inspect it")  # fmt: skip
        return quantize_int8(fp32, out, calibration.data_dir, method=calibration.method, samples=calibration.samples,
                             target=calibration.target, exclude=calibration.exclude, keep_float=calibration.keep_float, force=force,
                             intermediate=True, progress=progress)  # fmt: skip


def export_triton_repo(model: torch.nn.Module, out: Path, *, precision: str, batch: tuple[int, int, int],
                       source: dict[str, Any], opset: int = 18, calibration: Calibration | None = None,
                       force: bool = False, scratch: Path | None = None, progress: Reporter | None = None) -> Path:  # fmt: skip
    """`model` to ONNX (at `precision`) in `scratch` (default: a temporary folder), then a Triton model repository at `out`."""
    with _scratch(scratch) as folder:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ParityWarning)  # said below of the copy in the repository: this one is a temporary
            onnx_path = export_onnx(model, folder / "model.onnx", precision=precision, batch=batch, source=source,
                                    opset=opset, calibration=calibration, scratch=folder, progress=progress)  # fmt: skip
        reporting(progress).phase(f"writing the Triton model repository {out}")
        triton_repository(onnx_path, out, max_batch_size=batch[2], force=force, intermediate=True)
        warn_if_parity_failed(repository_model(out), read_sidecar(onnx_path)["parity"])
    return out


def repository_model(repository: Path) -> Path:
    """The ONNX file in a model repository `export_triton_repo` wrote (its sidecar beside it)."""
    return Path(repository) / DEFAULT_NAME / "1" / "model.onnx"


@contextlib.contextmanager
def _scratch(folder: Path | None) -> Iterator[Path]:
    if folder is not None:
        yield Path(folder)
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


def record_engine_parity(engine_path: Path, reference: torch.nn.Module, progress: Reporter | None = None) -> dict[str, Any]:
    """Measure the built engine against the fp32 reference on this GPU and store it in the sidecar's `parity`: at img_size,
    and for a dynamic-size engine also at the smallest and largest sizes of its profile."""
    engine, reference = load_engine(engine_path), reference.float()
    x = check_inputs(reference.config, 8, None)
    reporting(progress).phase(f"parity with PyTorch fp32 on {len(x)} images")
    with torch.no_grad():
        parity = compare(_run_all(engine, x), reference(x), engine.precision, channel_axis=engine.config.channel_axis)
    parity = with_other_sizes(parity, _parity_at_other_sizes(engine, reference, len(x)))
    _store_parity(engine_path, parity)
    return parity


def _store_parity(engine_path: Path, parity: dict[str, Any]) -> None:
    """Write the parity measured on this GPU into the engine's sidecar; a failure warns (`ParityWarning`), the engine stays."""
    meta = read_sidecar(engine_path)
    meta["parity"] = parity
    write_sidecar(engine_path, meta)
    warn_if_parity_failed(engine_path, parity)


def record_engine_parity_vs_onnx(engine_path: Path, onnx_path: Path, overrides: dict[str, Any] | None = None,
                                 progress: Reporter | None = None) -> dict[str, Any] | None:  # fmt: skip
    """Measure an engine built from another tool's ONNX against that graph run by ONNX Runtime (there is no PyTorch
    reference), at the engine's precision's tolerances, and store it in the sidecar's `parity`. None, with a
    warning, where ONNX Runtime cannot run the graph (e.g. fp8 Q/DQ on its CPU kernels): check it another way."""
    engine = load_engine(engine_path)
    x = check_inputs(engine.config, 8, None)
    reporting(progress).phase(f"parity with ONNX Runtime running {onnx_path.name} on {len(x)} images")
    try:
        reference = load_engine(onnx_path, backend="onnxruntime", overrides=overrides)
        expected = _run_all(reference, x)
    except Exception as exc:  # ORT's own exception types, for ops or types its kernels lack
        warnings.warn(f"parity not measured: ONNX Runtime cannot run {onnx_path} ({first_line(exc)}); compare the engine with "
                      f"`vitfast check {engine_path} --against OTHER` (e.g. the model's checkpoint or float ONNX)", VitfastWarning)  # fmt: skip
        return None
    with torch.no_grad():
        precision = looser_precision(engine.precision, reference.precision)  # an fp16 graph bounds an fp32 engine's agreement
        parity = compare(_run_all(engine, x), expected, precision, channel_axis=engine.config.channel_axis) | {"against": "onnxruntime"}
    _store_parity(engine_path, parity)
    return parity


def check_inputs(config: ViTConfig, n: int, data: str | os.PathLike | None) -> torch.Tensor:
    """Inputs [n, C, H, W] for a parity check (fewer if `data` holds fewer): images from `data`, else seeded random
    pixels. All n are compared, run in chunks that an engine's batch profile takes (`_chunks`, `_run`)."""
    if data:
        return next(batches(find_images(data)[:n], config, n))
    return random_images(config, n, seed=1)


def check_artifact(engine: Engine, artifact: str | os.PathLike, *, checkpoint: str | os.PathLike | None = None,
                   data: str | os.PathLike | None = None, samples: int = 16, overrides: dict[str, Any] | None = None,
                   atol: float | None = None, rtol: float | None = None, progress: Reporter | None = None) -> dict[str, Any]:  # fmt: skip
    """Parity of `engine` (loaded from `artifact`) vs its fp32 reference (`checkpoint` with ViTConfig
    `overrides`, else the sidecar's source): `vitfast.parity.compare`'s numbers plus artifact, backend,
    inputs and `guessed` (the config fields the reference's checkpoint did not store, repeated as a
    `GuessedConfigWarning`). `progress`: told each phase and the images run so far."""
    overrides = overrides or {}
    if isinstance(engine, TorchEngine):
        reference = load_checkpoint(checkpoint or artifact, overrides=overrides)
        guessed = reference.config_guesses
    else:
        reference = rebuild_reference(engine.metadata.get("source"), checkpoint, engine.config, overrides)
        guessed = getattr(reference, "config_guesses", None) if checkpoint else (engine.metadata.get("source") or {}).get("guessed")
        if guessed and not checkpoint:  # the export warned once; the artifact still carries the guesses
            warnings.warn(GuessedConfigWarning(describe_guesses(artifact, engine.config, guessed)), stacklevel=2)
    ours, theirs = engine.config, reference.config
    if (theirs.img_hw, theirs.num_classes, theirs.output_shape) != (ours.img_hw, ours.num_classes, ours.output_shape):
        raise ArtifactError(f"the reference model does not match the artifact's config (image size {list(theirs.img_hw)} vs {list(ours.img_hw)}, "
                            f"output [B, {', '.join(map(str, theirs.output_shape))}] vs [B, {', '.join(map(str, ours.output_shape))}]); "
                            "pass the right --checkpoint and the artifact's --num-classes / --global-pool / --features-only")  # fmt: skip
    if (theirs.feature_indices, theirs.feature_norm) != (ours.feature_indices, ours.feature_norm):
        raise ArtifactError(f"the reference model's feature maps are not the artifact's (blocks {list(theirs.feature_indices)} vs "
                            f"{list(ours.feature_indices)}, feature_norm {theirs.feature_norm} vs {ours.feature_norm}); pass the "
                            "artifact's --out-indices and --feature-norm")  # fmt: skip
    if theirs.dynamic_img_size != ours.dynamic_img_size:
        raise ArtifactError(f"the artifact takes {'any image size' if ours.dynamic_img_size else 'one image size'} and the reference "
                            f"{'any' if theirs.dynamic_img_size else 'one'}; pass --dynamic-img-size to check a --dynamic-img-size "
                            "export (and leave it out for a fixed-size one)")  # fmt: skip
    x = check_inputs(engine.config, samples, data)
    reference.eval()
    outs, refs = [], []
    for part in reporting(progress).track(_chunks(x, engine), f"running {len(x)} images through {Path(artifact).name} and the fp32 "
                                          "reference", total=len(x), size=len):  # fmt: skip
        with torch.no_grad():
            outs.append(_run(engine, part).cpu())
            refs.append(reference(part))
    result = compare(torch.cat(outs), torch.cat(refs), engine.precision, atol=atol, rtol=rtol, channel_axis=ours.channel_axis)
    result = with_other_sizes(result, _parity_at_other_sizes(engine, reference, min(len(x), 4), atol=atol, rtol=rtol))
    return result | {"artifact": str(artifact), "backend": engine.kind, "inputs": str(data) if data else "seeded random-pixel images",
                     "guessed": guessed or {}, "classifies": ours.classifies}  # fmt: skip


def _parity_at_other_sizes(engine: Engine, reference: torch.nn.Module, n: int, **tolerances) -> list[dict[str, Any]]:
    """`compare` of engine vs reference at each of `engine.parity_sizes()` (a dynamic_img_size artifact: two more grids, or a
    TensorRT profile's ends; none for a fixed-size one), on n seeded random-pixel images each, with its `img_size`."""
    others = []
    for hw in engine.parity_sizes():
        images = random_images(engine.config, n, seed=1, hw=hw)
        with torch.no_grad():
            result = compare(_run_all(engine, images), reference(images), engine.precision, channel_axis=engine.config.channel_axis,
                             **tolerances)  # fmt: skip
        others.append(result | {"img_size": list(hw)})
    return others


def check_against(engine: Engine, other: Engine, *, samples: int = 16, data: str | os.PathLike | None = None,
                  atol: float | None = None, rtol: float | None = None, mark_all: bool = False,
                  progress: Reporter | None = None) -> dict[str, Any]:  # fmt: skip
    """`engine` vs `other` on the same raw images, each with its own preprocessing; when both take any image size,
    also at `engine`'s other sizes that `other` takes (under "other_sizes"); `mark_all` adds the layer-by-layer
    comparison of two ONNX graphs under "layers". `progress`: told each phase."""
    report = reporting(progress)
    images = raw_images(engine.config, samples, data)
    n = len(images)
    outs, refs = [], []
    for part in report.track(_chunks(images, engine, other), f"running {n} images through both", total=n, size=len):
        with torch.no_grad():
            outs.append(_run(engine, part).cpu())
            refs.append(_run(other, part).cpu())
    out, ref = torch.cat(outs), torch.cat(refs)
    if out.shape != ref.shape:
        raise ArtifactError(f"{engine.path} gives logits {tuple(out.shape)} but {other.path} gives {tuple(ref.shape)}; "
                            "compare artifacts of the same model")  # fmt: skip
    precision = looser_precision(engine.precision, other.precision)
    result = compare(out, ref, precision, atol=atol, rtol=rtol, channel_axis=engine.config.channel_axis)
    others = []
    for hw in _shared_other_sizes(engine, other):  # two dynamic-size artifacts: at other sizes too
        ours, theirs = _at_size(engine, other, hw, min(n, 4))
        others.append(compare(ours, theirs, precision, atol=atol, rtol=rtol, channel_axis=engine.config.channel_axis) | {"img_size": list(hw)})
    result = with_other_sizes(result, others)
    result |= {"backend": engine.kind, "against_backend": other.kind, "inputs": str(data) if data else "seeded random-pixel images",
               "classifies": engine.config.classifies and other.config.classifies}  # fmt: skip
    if mark_all:
        report.phase("comparing every intermediate tensor")
        result["layers"] = compare_layers(engine, other, images, precision, atol=atol, rtol=rtol)
    return result


def _shared_other_sizes(engine: Engine, other: Engine) -> list[tuple[int, int]]:
    """`engine`'s other parity sizes that `other` takes too: none unless both take any image size."""
    if not (engine.config.dynamic_img_size and other.config.dynamic_img_size):
        return []
    patch = other.config.patch_size
    return [(h, w) for h, w in engine.parity_sizes() if h % patch == w % patch == 0 and other.within_image_sizes(h, w)]


def _at_size(engine: Engine, other: Engine, hw: tuple[int, int], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Both outputs on the same n seeded random-pixel images of size hw, each preprocessed its own way at that size."""
    pixels = torch.randint(0, 256, (n, *hw, engine.config.in_chans), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    with torch.no_grad():
        return tuple(_run_all(e, preprocess(pixels, e.config.replace(img_size=hw))) for e in (engine, other))


def _chunks(items, *engines: Engine) -> list:
    """`items` (a batch tensor or a list of images) in runs of `CHECK_CHUNK`, fewer when an engine's profile says so."""
    size = min([CHECK_CHUNK, *(e.batch[2] for e in engines if e.batch)])
    return [items[i : i + size] for i in range(0, len(items), size)]


def _run_all(engine: Engine, items) -> torch.Tensor:
    """engine(items) on the CPU, however many `items` (a batch tensor or a list of images): run in chunks its profile takes."""
    return torch.cat([_run(engine, part).cpu() for part in _chunks(items, engine)])


def _run(engine: Engine, part):
    """engine(part), a short `part` (a batch tensor or a list of images) padded up to the profile's minimum batch."""
    n = len(part)
    extra = engine.batch[0] - n if engine.batch else 0
    if extra > 0:
        padding = part[:1].expand(extra, *part.shape[1:]) if isinstance(part, torch.Tensor) else [part[0]] * extra
        part = torch.cat([part, padding]) if isinstance(part, torch.Tensor) else [*part, *padding]
    return engine(part)[:n]


def raw_images(config: ViTConfig, n: int, data: str | os.PathLike | None):
    """n raw images both sides of a comparison preprocess their own way: files, or seeded random pixels [n, H, W, C] uint8."""
    if data:
        return open_images(find_images(data)[:n])
    h, w = config.img_hw
    return torch.randint(0, 256, (n, h, w, config.in_chans), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)


def evaluate(engine: Engine, data: str | os.PathLike, *, labels: Sequence[str] | None = None, class_ids: Sequence[str] | None = None,
             against: Engine | None = None, batch_size: int = 32, workers: int | None = None,
             progress: Reporter | None = None) -> dict[str, Any]:  # fmt: skip
    """Top-1 / top-5 accuracy of `engine` on the image folder `data` (DIR/<class>/*).

    Folders are matched to `labels` (default: the model's own) by name when they are all labels,
    else taken in natural order (`vitfast.data.natural_key`) as class indices; `class_ids` (ImageNet's WordNet ids, one
    per class as `labels`) are matched instead where the folders are named by them and by no label. `against`: a second artifact (e.g. the fp32
    checkpoint) evaluated on the same images, reported under "against" with the accuracy difference
    and top-1 agreement. `workers`: threads decoding the images (`vitfast.data.batches`). `progress`: told the images
    evaluated so far.
    Returns artifact, backend, precision, top1, top5, k, n, classes (and against)."""
    for model in (engine, *([against] if against else [])):  # the same for both: their top-k are scored alike
        if len(model.config.output_shape) > 1:
            what, flag = ("feature maps (features_only)", "--features-only") if model.config.features_only else (
                "every token (global_pool none)", "--global-pool none")
            raise ArtifactError(f"{model.path} returns {what}, not one prediction per image; eval needs a pooled classifier: export "
                                f"the checkpoint without {flag}")  # fmt: skip
        if model.config.embedding_head:
            raise ArtifactError(f"{model.path} returns an image embedding (CLIP's image_embeds: {model.config.num_classes} dimensions), "
                                "not class logits: an embedding model has no classes to score, so eval does not apply (zero-shot "
                                "classification needs the text tower's class embeddings, which vitfast does not load)")  # fmt: skip
    files, folder_targets, classes = labeled_images(data)
    labels = tuple(labels) if labels is not None else engine.config.labels
    if class_ids is not None and not set(classes) & set(labels or ()) and set(classes) & set(class_ids):
        labels = tuple(class_ids)  # an ImageNet subset's folders are named n01440764, not tench
    targets = torch.tensor(class_indices(engine.config.num_classes, labels, classes, folder_targets, data))
    if against and against.config.num_classes != engine.config.num_classes:
        raise ArtifactError(f"--against {against.path} has {against.config.num_classes} classes, {engine.path} has "
                            f"{engine.config.num_classes}; compare artifacts of the same model")  # fmt: skip
    ours, *refs = predict_topk([engine, *([against] if against else [])], files, batch_size, progress, workers)
    result = {"artifact": str(engine.path), "backend": engine.kind, "precision": engine.precision,
              **_accuracy(ours, targets), "classes": len(classes)}  # fmt: skip
    if against:
        ref = refs[0]
        theirs = _accuracy(ref, targets)
        result["against"] = {"artifact": str(against.path), "backend": against.kind, "precision": against.precision, **theirs,
                             "top1_diff": result["top1"] - theirs["top1"], "top5_diff": result["top5"] - theirs["top5"],
                             "top1_agreement": int((ours[:, 0] == ref[:, 0]).sum()) / len(ours)}  # fmt: skip
    return result


def class_indices(num_classes: int, labels: Sequence[str] | None, classes: list[str], folder_targets: list[int],
                  data: str | os.PathLike) -> list[int]:  # fmt: skip
    """The model's class index for each image: by name when every folder is one of the model's labels
    (an ImageNet subset named by class works), else by the folders' natural order (`labeled_images`), which needs one
    folder per class and none named after a label."""
    if num_classes == 0:
        raise ArtifactError("this model has no classifier head (num_classes 0); eval needs one")
    if labels is not None and len(labels) != num_classes:
        raise InputError(f"{len(labels)} labels for a model with {num_classes} classes; give one name per class")
    known = set(labels or ())
    if known and set(classes) <= known:
        # a folder named after a label the model has twice (ImageNet's "crane": 134 the bird, 517 the machine) is either class
        ambiguous = [f"{name} ({', '.join(str(i) for i, label in enumerate(labels) if label == name)})"
                     for name in classes if labels.count(name) > 1]  # fmt: skip
        if ambiguous:
            raise InputError(f"class folders of {data} name labels the model has more than once: {'; '.join(ambiguous)} (class "
                             "indices in brackets); pass --labels FILE with one distinct name per class and name the folders after "
                             "those")  # fmt: skip
        index = {name: i for i, name in enumerate(labels)}
        return [index[classes[t]] for t in folder_targets]
    named = [c for c in classes if c in known]
    if named:  # some folders are labels, some not (a typo, a plural): folder order would score them against other classes
        others = [c for c in classes if c not in named]
        raise InputError(f"{len(named)} class folders of {data} are the model's labels ({', '.join(named[:3])}"
                         f"{', ...' if len(named) > 3 else ''}) but {len(others)} are not: {', '.join(others[:5])}"
                         f"{', ...' if len(others) > 5 else ''}; rename those after the model's labels (or pass --labels FILE)")  # fmt: skip
    if len(classes) != num_classes:
        empty = empty_class_folders(data, classes)
        held = f"; {len(empty)} more without images: {shorten(empty, 5)}" if empty else ""
        raise InputError(
            f"the model has {num_classes} classes but {data} has {len(classes)} class folders ({shorten(classes, 5)}{held}); give a folder "
            "with one subfolder of images per model class (natural order = class index: 2 before 10), or subfolders named by the "
            "model's labels (its own, or --labels FILE)"
        )
    if labels and classes != list(labels):
        warnings.warn(VitfastWarning(f"the folders of {data} are not the model's labels; folder i in natural order (2 before 10, as "
                                     "timm's ImageDataset sorts them) is taken as class i"), stacklevel=2)  # fmt: skip
    return folder_targets


def predict_topk(engines: Sequence[Engine], files: list[Path], batch_size: int, progress: Reporter | None = None,
                 workers: int | None = None) -> list[torch.Tensor]:  # fmt: skip
    """For each engine, the top-k (k = min(TOP_K, classes)) class indices [N, k] of every image file, best first.
    Engines that preprocess alike (an int8 export and its checkpoint) share one pass: each image is decoded and resized
    once and goes through all of them."""
    passes: list[list[int]] = []  # indices into engines, grouped by preprocessing
    for i, engine in enumerate(engines):
        group = next((g for g in passes if same_preprocessing(engines[g[0]].config, engine.config)), None)
        if group:
            group.append(i)
        else:
            passes.append([i])
    tops: list[list[torch.Tensor]] = [[] for _ in engines]
    for group in passes:
        size, batch_iter = _tracked_batches([engines[i] for i in group], files, batch_size, workers, progress, "evaluating")
        for x, start in zip(batch_iter, range(0, len(files), size)):  # batches first: the tracker counts the last one on resuming
            for i in group:
                logits = _finite(engines[i], files[start : start + size], _run(engines[i], x).float().cpu())
                # best first, ties by class index as predict ranks them (topk orders ties arbitrarily)
                tops[i].append(torch.sort(-logits, dim=-1, stable=True).indices[:, : min(TOP_K, engines[i].config.num_classes)])
    return [torch.cat(t) for t in tops]


def _finite(engine: Engine, files: list[Path], out: torch.Tensor) -> torch.Tensor:
    """`out` (one row per file), or `ArtifactError` naming the images whose outputs hold NaN or inf: their scores and
    ranks would mean nothing (softmax of a NaN row is NaN everywhere; NaN sorts last in one ranking and first in another)."""
    bad = (~torch.isfinite(out.reshape(len(out), -1))).any(dim=1)
    if bad.any():
        first = files[int(bad.nonzero()[0])]
        raise ArtifactError(f"{engine.path} ({engine.kind}, {engine.precision}) gave NaN or inf outputs for {int(bad.sum())} of {len(files)} "
                            f"images in a batch, {first} the first: the model overflows or is broken there (an fp16 export "
                            "overflowing: export fp32 or bf16); no results were kept")  # fmt: skip
    return out


def predict(engine: Engine, files: list[Path], *, batch_size: int = 32, workers: int | None = None,
            progress: Reporter | None = None) -> Iterator[tuple[list[Path], torch.Tensor]]:  # fmt: skip
    """(files, outputs [b, *engine.config.output_shape] float32 on the CPU) batch by batch, in file order: what the engine
    returns for each image file (logits, pooled features, every token or feature maps). `workers`: decoding threads."""
    size, batch_iter = _tracked_batches([engine], files, batch_size, workers, progress, "running")
    for x, start in zip(batch_iter, range(0, len(files), size)):  # batches first: the tracker counts the last one on resuming
        chunk = files[start : start + size]
        yield chunk, _finite(engine, chunk, _run(engine, x).float().cpu())


def _tracked_batches(engines: Sequence[Engine], files: list[Path], batch_size: int, workers: int | None,
                     progress: Reporter | None, verb: str) -> tuple[int, Iterator[torch.Tensor]]:  # fmt: skip
    """(size, batches): the files preprocessed as `engines` (which preprocess alike) take them, in batches of `size`
    (at most `batch_size` and what every engine's profile allows), counted on `progress`."""
    size = min([batch_size, *(e.batch[2] for e in engines if e.batch)])
    names = " and ".join(Path(e.path).name for e in engines)
    return size, reporting(progress).track(batches(files, engines[0].config, size, workers), f"{verb} {names} on {len(files)} images",
                                           total=len(files), size=len)  # fmt: skip


def _accuracy(topk: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
    hits, n = topk == targets[:, None], len(targets)  # fractions as hits / n in Python: exact, not float32 means
    return {"top1": int(hits[:, 0].sum()) / n, "top5": int(hits.any(dim=1).sum()) / n, "k": topk.shape[1], "n": n}
