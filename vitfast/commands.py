"""`vitfast export`, `vitfast check` and `vitfast eval`: the export pipeline from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from .errors import ArtifactError, BackendUnavailable, InputError

RANDOM_SEED = 0  # --model NAME exports random weights; the seed lets `check` rebuild them


# ---------------------------------------------------------------------------- export
def source_model(args: argparse.Namespace) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The reference model named by --model / --checkpoint (at --img-size, with --config and the
    field overrides), and how to rebuild it: the overrides and what was still guessed go in the sidecar."""
    from .checkpoint import load_checkpoint
    from .config_args import config_overrides
    from .export.artifacts import sha256_file
    from .registry import create_model

    overrides = config_overrides(args)
    if args.checkpoint:
        model = load_checkpoint(args.checkpoint, img_size=args.img_size, overrides=overrides)
        ckpt = Path(args.checkpoint)
        return model, {"checkpoint": str(ckpt.resolve()), "sha256": sha256_file(ckpt) if ckpt.is_file() else None,
                       "img_size": args.img_size, "overrides": overrides, "guessed": model.config_guesses}  # fmt: skip
    torch.manual_seed(RANDOM_SEED)
    model = create_model(args.model, **overrides, **({"img_size": args.img_size} if args.img_size else {}))
    return model, {"model": args.model, "weights": f"random init, torch.manual_seed({RANDOM_SEED})", "img_size": args.img_size,
                   "overrides": overrides}  # fmt: skip


def rebuild_reference(source: dict[str, Any] | None, checkpoint: str | None, config, overrides=None) -> torch.nn.Module:
    """The fp32 reference for `check`: --checkpoint (with `overrides`), else what the artifact's sidecar records."""
    from .checkpoint import load_checkpoint
    from .registry import create_model

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


def cmd_export(args: argparse.Namespace) -> int:
    from .atomic import check_output_free, reserve_output
    from .export.artifacts import parse_batch

    batch = parse_batch(args.batch)
    if args.format == "triton-repo":
        from .export.triton_repo import check_repository_free

        out = check_repository_free(args.out, args.force)  # replaces only a repository vitfast wrote
    else:
        out = check_output_free(args.out, args.force)
    if args.precision == "int8" and not args.calib_dir:
        raise InputError("--precision int8 needs --calib-dir DIR with calibration images (searched recursively)")
    if args.calib_dir:
        from .data import find_images

        find_images(args.calib_dir)  # fail early on an empty or missing folder
    # held from here to the end: a second export to the same path fails now, not after minutes of work
    with reserve_output(out, args.force, directory=args.format == "triton-repo") as scratch:
        return _export(args, out, batch, scratch)


def _export(args: argparse.Namespace, out: Path, batch: tuple[int, int, int], scratch: Path) -> int:
    if args.format == "triton-repo":
        from .serve import export_triton_repo

        return export_triton_repo(args, batch, scratch)
    model, source = source_model(args)
    onnx_out = out if args.format == "onnx" else out.with_suffix(".onnx")
    _export_onnx(args, model, source, onnx_out, batch, scratch)
    if args.format == "onnx":
        _report(onnx_out, args)
        return 0
    from .export.tensorrt import build_engine, require_tensorrt

    try:
        require_tensorrt()
    except BackendUnavailable as exc:
        raise BackendUnavailable(f"{str(exc).rstrip('.')}; the ONNX it would have used is at {onnx_out}") from None
    build_engine(onnx_out, out, precision=args.precision, batch=batch, workspace_gib=args.workspace,
                 optimization_level=args.opt_level, timing_cache=args.timing_cache,
                 fp32_layernorm=not args.no_fp32_layernorm, force=args.force)  # fmt: skip
    _record_engine_parity(out, model)
    _report(out, args)
    return 0


def _export_onnx(args, model, source, onnx_out: Path, batch, scratch: Path) -> None:
    from .export.onnx_export import to_onnx
    from .export.quantize import quantize_int8

    onnx_precision = "fp16" if args.format == "onnx" and args.precision == "fp16" else "fp32"
    if args.precision != "int8":
        to_onnx(model, onnx_out, precision=onnx_precision, batch=batch, opset=args.opset, force=args.force, source=source)
        return
    fp32 = to_onnx(model, scratch / "fp32.onnx", batch=batch, opset=args.opset, source=source)  # staged beside --out
    quantize_int8(fp32, onnx_out, args.calib_dir, method=args.calib_method, samples=args.calib_samples,
                  target=args.int8_target, exclude=args.exclude or (), force=args.force)  # fmt: skip


def _record_engine_parity(engine_path: Path, reference: torch.nn.Module) -> None:
    from .export.artifacts import read_sidecar, write_sidecar
    from .parity import compare
    from .runtime import load_engine

    engine = load_engine(engine_path)
    x = _check_inputs(reference.config, engine, 8, None)
    with torch.no_grad():
        parity = compare(engine(x).cpu(), reference.float()(x), engine.precision)
    meta = read_sidecar(engine_path)
    meta["parity"] = parity
    write_sidecar(engine_path, meta)


def _report(path: Path, args) -> None:
    from .export.artifacts import read_sidecar

    meta = read_sidecar(path)
    parity = meta.get("parity") or {}
    line = f"wrote {path} ({meta['precision']}); parity vs fp32: max_abs_err {parity.get('max_abs_err', float('nan')):.3g}, " \
           f"cosine {parity.get('cosine', float('nan')):.6f}, top-1 agreement {parity.get('top1_agreement', float('nan')):.3f}"
    print(line, file=sys.stderr)


# ---------------------------------------------------------------------------- artifacts
def load_artifact(path: str, args: argparse.Namespace, labels: bool = True):
    """`load_engine(path)` with the command's --config / field overrides / --img-size (and --labels
    unless `labels` is False); says what it read off a foreign ONNX graph, and refuses one whose
    preprocessing is unknown (raw images need it)."""
    from .config_args import config_overrides
    from .runtime import load_engine

    overrides = config_overrides(args) | ({"img_size": args.img_size} if getattr(args, "img_size", None) else {})
    if not labels:
        overrides.pop("labels", None)
    engine = load_engine(path, overrides=overrides)
    if engine.metadata.get("foreign"):
        from .foreign import report_choice

        report_choice(engine.path, engine.io, engine.metadata["assumed"])
    if getattr(engine, "missing_preprocessing", None):
        raise InputError(engine.missing_preprocessing)
    return engine


def add_artifact_args(p: argparse.ArgumentParser, labels: bool = True) -> None:
    """--config, the field overrides (and --labels) and --img-size, for commands that take any artifact."""
    from .config_args import add_config_args

    add_config_args(p, labels=labels)
    p.add_argument("--img-size", type=int, metavar="N", help="input resolution of an ONNX graph with dynamic H/W and no vitfast sidecar")


# ---------------------------------------------------------------------------- check
def _check_inputs(config, engine, samples: int, data: str | None) -> torch.Tensor:
    n = samples if not engine.batch else max(min(samples, engine.batch[2]), engine.batch[0])
    if data:
        from .data import batches, find_images

        return next(batches(find_images(data)[:n], config, n))
    from .data import random_images

    return random_images(config, n, seed=1)


def cmd_check(args: argparse.Namespace) -> int:
    from .checkpoint import describe_guesses, load_checkpoint
    from .config_args import config_overrides, warn_guesses
    from .parity import compare
    from .runtime import TorchEngine

    engine = load_artifact(args.artifact, args)
    if args.against:
        return _check_against(args, engine)
    if args.mark_all:
        raise InputError("--mark-all compares two ONNX graphs layer by layer: give the other one with --against OTHER.onnx")
    overrides = config_overrides(args)
    if isinstance(engine, TorchEngine):
        reference = load_checkpoint(args.checkpoint or args.artifact, overrides=overrides)
        guessed = reference.config_guesses
    else:
        reference = rebuild_reference(engine.metadata.get("source"), args.checkpoint, engine.config, overrides)
        guessed = getattr(reference, "config_guesses", None) if args.checkpoint else (engine.metadata.get("source") or {}).get("guessed")
        if guessed and not args.checkpoint:  # the export warned once; the artifact still carries the guesses
            warn_guesses(describe_guesses(args.artifact, engine.config, guessed))
    if reference.config.img_hw != engine.config.img_hw or reference.config.num_classes != engine.config.num_classes:
        raise ArtifactError("the reference model does not match the artifact's config (image size / classes); pass the right --checkpoint")
    x = _check_inputs(engine.config, engine, args.samples, args.data)
    with torch.no_grad():
        result = compare(engine(x).cpu(), reference.eval()(x), engine.precision, atol=args.atol, rtol=args.rtol)
    result |= {"artifact": str(args.artifact), "backend": engine.kind, "inputs": args.data or "seeded random-pixel images",
               "guessed": guessed or {}}  # fmt: skip
    return _print_check(result, args, f"{args.artifact} ({engine.kind}, {engine.precision}) vs fp32 reference")


def _check_against(args: argparse.Namespace, engine) -> int:
    """`check A --against B`: both artifacts on the same raw images, each with its own preprocessing."""
    from .parity import compare, looser_precision

    other = load_artifact(args.against, args)
    limits = [e.batch[2] for e in (engine, other) if e.batch]
    floors = [e.batch[0] for e in (engine, other) if e.batch]
    n = max(min([args.samples, *limits]), max(floors, default=1))
    images = _raw_images(engine.config, n, args.data)
    with torch.no_grad():
        out, ref = engine(images).cpu(), other(images).cpu()
    if out.shape != ref.shape:
        raise ArtifactError(f"{args.artifact} gives logits {tuple(out.shape)} but {args.against} gives {tuple(ref.shape)}; "
                            "compare artifacts of the same model")  # fmt: skip
    precision = looser_precision(engine.precision, other.precision)
    result = compare(out, ref, precision, atol=args.atol, rtol=args.rtol)
    result |= {"artifact": str(args.artifact), "against": str(args.against), "backend": engine.kind,
               "against_backend": other.kind, "inputs": args.data or "seeded random-pixel images"}  # fmt: skip
    if args.mark_all:
        from .layerwise import compare_layers

        result["layers"] = compare_layers(engine, other, engine.prepare(images), precision, atol=args.atol, rtol=args.rtol)
    title = f"{args.artifact} ({engine.kind}, {engine.precision}) vs {args.against} ({other.kind}, {other.precision})"
    return _print_check(result, args, title)


def _raw_images(config, n: int, data: str | None):
    """n raw images both sides of a comparison preprocess their own way: files, or seeded random pixels."""
    if data:
        from .data import find_images, open_image

        return [open_image(p) for p in find_images(data)[:n]]
    h, w = config.img_hw
    return torch.randint(0, 256, (n, h, w, config.in_chans), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)


def _print_check(result: dict, args: argparse.Namespace, title: str) -> int:
    if args.json:
        print(json.dumps(result))
        return 0 if result["passed"] else 1
    from .cli import console

    tol = result["tolerance"]
    verdict = "[green]PASSED[/green]" if result["passed"] else "[red]FAILED[/red]"
    console().print(
        f"{title} on {result['n']} images: {verdict}\n"
        f"  max_abs_err {result['max_abs_err']:.3g} (limit {tol['limit_abs_err']:.3g} = atol {tol['atol']:g} + rtol {tol['rtol']:g} x max|ref|)  "
        f"max_rel_err {result['max_rel_err']:.3g}  cosine {result['cosine']:.6f} (limit {tol['cosine']})  "
        f"top-1 agreement {result['top1_agreement']:.3f}"
    )
    if "layers" in result:
        from .layerwise import describe_layers

        console().print(describe_layers(result["layers"]))
    return 0 if result["passed"] else 1


# ---------------------------------------------------------------------------- eval
TOP_K = 5


def cmd_eval(args: argparse.Namespace) -> int:
    from .config_args import read_labels
    from .data import labeled_images

    engine = load_artifact(args.artifact, args, labels=False)  # eval matches --labels to the folders itself
    files, folder_targets, classes = labeled_images(args.data)
    labels = read_labels(args.labels) if args.labels else engine.config.labels
    targets = torch.tensor(class_indices(engine.config.num_classes, labels, classes, folder_targets, args.data))
    ours = _predict(engine, files, args)
    result = {"artifact": str(args.artifact), "backend": engine.kind, "precision": engine.precision,
              **_accuracy(ours, targets), "classes": len(classes)}  # fmt: skip
    if args.against:
        reference = load_artifact(args.against, args, labels=False)
        if reference.config.num_classes != engine.config.num_classes:
            raise ArtifactError(f"--against {args.against} has {reference.config.num_classes} classes, {args.artifact} has "
                                f"{engine.config.num_classes}; compare artifacts of the same model")  # fmt: skip
        ref = _predict(reference, files, args)
        theirs = _accuracy(ref, targets)
        result["against"] = {"artifact": str(args.against), "backend": reference.kind, "precision": reference.precision, **theirs,
                             "top1_diff": result["top1"] - theirs["top1"], "top5_diff": result["top5"] - theirs["top5"],
                             "top1_agreement": float((ours[:, 0] == ref[:, 0]).float().mean())}  # fmt: skip
    if args.json:
        print(json.dumps(result))
        return 0
    k = result["k"]
    print(f"top-1 {100 * result['top1']:.2f}%  top-{k} {100 * result['top5']:.2f}% on {result['n']} images in "
          f"{len(classes)} classes ({engine.kind}, {engine.precision})")  # fmt: skip
    if args.against:
        a = result["against"]
        print(f"  vs {args.against} ({a['backend']}, {a['precision']}): top-1 {100 * a['top1']:.2f}% "
              f"({100 * a['top1_diff']:+.2f} points), top-{k} {100 * a['top5']:.2f}% ({100 * a['top5_diff']:+.2f} points), "
              f"same top-1 prediction on {100 * a['top1_agreement']:.2f}% of images")  # fmt: skip
    return 0


def class_indices(num_classes: int, labels, classes: list[str], folder_targets: list[int], data: str) -> list[int]:
    """The model's class index for each image: by name when every folder is one of the model's labels
    (an ImageNet subset named by class works), else by sorted folder order, which needs one folder per class."""
    if num_classes == 0:
        raise ArtifactError("this model has no classifier head (num_classes 0); eval needs one")
    if labels is not None and len(labels) != num_classes:
        raise InputError(f"{len(labels)} labels for a model with {num_classes} classes; give one name per class")
    if labels and set(classes) <= set(labels):
        index = {name: i for i, name in enumerate(labels)}
        return [index[classes[t]] for t in folder_targets]
    if len(classes) != num_classes:
        shown = ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")
        raise InputError(
            f"the model has {num_classes} classes but {data} has {len(classes)} class folders ({shown}); give a folder with "
            "one subfolder per model class (sorted order = class index), or subfolders named by the model's labels "
            "(its own, or --labels FILE)"
        )
    if labels and classes != list(labels):
        print(f"vitfast: warning: the folders of {data} are not the model's labels; folder i (sorted) is taken as class i",
              file=sys.stderr)  # fmt: skip
    return folder_targets


def _predict(engine, files, args) -> torch.Tensor:
    """The top-k class indices [N, k] of every image, best first."""
    from .data import batches

    size = min(args.batch_size, engine.batch[2]) if engine.batch else args.batch_size
    k = min(TOP_K, engine.config.num_classes)
    batch_iter = batches(files, engine.config, size)
    if sys.stderr.isatty() and not args.json:
        from rich.progress import track

        batch_iter = track(batch_iter, total=-(-len(files) // size), description="evaluating", transient=True)
    out = []
    for x in batch_iter:
        n = len(x)
        if engine.batch and n < engine.batch[0]:  # a short last batch: pad up to the profile's minimum
            x = torch.cat([x, x[:1].expand(engine.batch[0] - n, -1, -1, -1)])
        out.append(engine(x)[:n].topk(k, dim=-1).indices.cpu())
    return torch.cat(out)


def _accuracy(topk: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
    hits = topk == targets[:, None]
    return {"top1": float(hits[:, 0].float().mean()), "top5": float(hits.any(dim=1).float().mean()), "k": topk.shape[1],
            "n": len(targets)}  # fmt: skip


# ---------------------------------------------------------------------------- parsers
def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    from .config_args import add_config_args
    from .flags import int_in, positive_float, positive_int

    p = sub.add_parser("export", parents=[common], help="export to ONNX / TensorRT (fp32, fp16, int8)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="registered model name (random weights, seed 0)")
    src.add_argument("--checkpoint", help="vitfast / timm / Hugging Face checkpoint")
    p.add_argument("--format", required=True, choices=["onnx", "trt", "triton-repo"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "int8"])
    p.add_argument("--calib-dir", help="calibration images (searched recursively) for int8")
    p.add_argument("--calib-method", default="minmax", choices=["minmax", "entropy", "percentile"])
    p.add_argument("--calib-samples", type=positive_int, default=256, help="calibration images to use (default 256)")
    p.add_argument("--int8-target", default="tensorrt", choices=["tensorrt", "cpu"],
                   help="QDQ form: TensorRT's symmetric int8 (default) or ONNX Runtime CPU's uint8 activations")  # fmt: skip
    p.add_argument("--exclude", nargs="*", help="node-name patterns kept in float (per-layer fallback)")
    p.add_argument("--batch", default="1:8:32", help="MIN:OPT:MAX batch profile (default 1:8:32)")
    p.add_argument("--img-size", type=positive_int, help="export at this resolution (position embeddings resized)")
    p.add_argument("--opset", type=positive_int, default=18, help="ONNX opset (default 18; 17 is the oldest with LayerNormalization)")
    p.add_argument("--workspace", type=positive_float, default=4.0, help="TensorRT workspace limit in GiB")
    p.add_argument("--opt-level", type=int_in(0, 5), default=3, help="TensorRT builder optimization level 0-5")
    p.add_argument("--timing-cache", help="TensorRT timing cache file, reused across builds")
    p.add_argument("--no-fp32-layernorm", action="store_true", help="let TensorRT run LayerNorm in fp16")
    p.add_argument("--out", required=True, help="output file (.onnx; .engine/.plan for trt) or folder (triton-repo)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    add_config_args(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("check", parents=[common], help="parity of an artifact vs the fp32 reference, or vs another artifact")
    p.add_argument("artifact", help="checkpoint, .onnx file (vitfast's or another tool's), Optimum folder or TensorRT engine")
    ref = p.add_mutually_exclusive_group()
    ref.add_argument("--checkpoint", help="fp32 weights to compare with (default: the artifact's recorded source)")
    ref.add_argument("--against", metavar="OTHER", help="compare with any other artifact on the same images")
    p.add_argument("--atol", type=float, help="absolute tolerance on the logits (default 0)")
    p.add_argument("--rtol", type=float, help="tolerance relative to max |reference logit| (default: per precision)")
    p.add_argument("--mark-all", action="store_true",
                   help="ONNX vs ONNX: compare every intermediate tensor and name the first layer out of tolerance")  # fmt: skip
    p.add_argument("--data", help="image folder to draw inputs from (default: seeded random images)")
    p.add_argument("--samples", type=positive_int, default=16, help="images to compare on (default 16)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_artifact_args(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("eval", parents=[common], help="top-1 / top-5 accuracy on an image folder DIR/<class>/*")
    p.add_argument("artifact")
    p.add_argument("--data", required=True, help="DIR/<class>/*.png|jpg: folders named by the model's labels, else sorted = class index")
    p.add_argument("--labels", metavar="FILE", help="class names (one per line, or a JSON list / {index: name}) to match folders by")
    p.add_argument("--against", metavar="REF", help="also evaluate REF (e.g. the fp32 checkpoint) and report the accuracy difference")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_artifact_args(p, labels=False)  # eval has its own --labels
    p.set_defaults(func=cmd_eval)
