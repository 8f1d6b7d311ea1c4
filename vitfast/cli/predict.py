"""`vitfast predict`: run any artifact over image files and folders; print or write what it returns per image.

A classifier gives its top-k classes with scores (stdout, `--json`, or `--out` .jsonl / .csv / .npz); a model that
returns features, an image embedding (CLIP's image_embeds), tokens or feature maps writes them to `--out` (.npz: `outputs` and `files`; .jsonl: one row per
image). Output files are written under a temporary name and renamed when complete, like every vitfast output.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from vitfast import pipeline
from vitfast.atomic import check_output_free, claim_output
from vitfast.data import find_images
from vitfast.errors import InputError
from vitfast.flags import positive_int
from vitfast.runtime import Engine
from vitfast.scores import SCORES, default_scores, top_classes

from .export import add_artifact_args, add_loading_args, add_torch_args, load_artifact
from .progress import add_quiet, reporter

FORMATS = (".jsonl", ".csv", ".npz")


def input_files(paths: list[str]) -> list[Path]:
    """Image files in the order given; a folder stands for every image under it (recursively, sorted)."""
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files += find_images(path)
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"no such image file or folder: {path}")
    return files


def classifier_rows(engine: Engine, results: Iterator[tuple[list[Path], torch.Tensor]], k: int, scores: str) -> Iterator[dict[str, Any]]:
    """One {"file", "top_k": [{"index", "label", "score"}, ...]} per image, best class first."""
    labels = engine.config.labels
    for files, logits in results:
        indices, values = top_classes(logits.numpy(), k, scores)
        for file, idx, val in zip(files, indices.tolist(), values.tolist()):
            yield {"file": str(file), "top_k": [{"index": i, "label": labels[i] if labels else None, "score": v} for i, v in zip(idx, val)]}


def output_rows(results: Iterator[tuple[list[Path], torch.Tensor]]) -> Iterator[dict[str, Any]]:
    """One {"file", "output"} per image: its whole output as nested lists."""
    for files, out in results:
        for file, row in zip(files, out.tolist()):
            yield {"file": str(file), "output": row}


def write_rows(rows: Iterator[dict[str, Any]], fmt: str, stream) -> int:
    """Write rows as JSON lines, or top-k rows as CSV (file, then index/label/score per rank); returns the count."""
    n = 0
    writer = None
    for row in rows:
        if fmt == ".jsonl":
            stream.write(json.dumps(row) + "\n")
        else:
            if writer is None:
                writer = csv.writer(stream)
                writer.writerow(["file", *(f"{col}_{r + 1}" for r in range(len(row["top_k"])) for col in ("index", "label", "score"))])
            writer.writerow([row["file"], *(v for c in row["top_k"] for v in (c["index"], c["label"] or "", f"{c['score']:.6g}"))])
        n += 1
    return n


def write_npz(results: Iterator[tuple[list[Path], torch.Tensor]], tmp: Path, n: int) -> int:
    """Write `n` images' outputs to .npz as they come, so a folder's tokens need not fit in memory: `outputs` [n, ...]
    float32, streamed into the archive batch by batch under a header sized up front, then `files` [n]; returns n."""
    names: list[str] = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as archive, contextlib.ExitStack() as stack:
        stream = None
        for files, out in results:
            block = np.ascontiguousarray(out.numpy(), dtype=np.float32)
            if stream is None:  # the header needs the whole shape: every image's output is the first one's shape
                stream = stack.enter_context(archive.open("outputs.npy", "w", force_zip64=True))
                header = {"descr": np.lib.format.dtype_to_descr(block.dtype), "fortran_order": False, "shape": (n, *block.shape[1:])}
                np.lib.format.write_array_header_1_0(stream, header)
            stream.write(block.tobytes())
            names += map(str, files)
        if len(names) != n:  # the header said n rows
            raise RuntimeError(f"expected {n} outputs, got {len(names)}")
        stack.close()
        with archive.open("files.npy", "w") as stream:
            np.lib.format.write_array(stream, np.array(names))
    return n


def cmd_predict(args: argparse.Namespace) -> int:
    fmt = Path(args.out).suffix.lower() if args.out else None
    if args.out and fmt not in FORMATS:
        raise InputError(f"--out {args.out}: give a file ending in {', '.join(FORMATS)}")
    if args.out:
        check_output_free(args.out, args.force)
    files = input_files(args.images)
    engine = load_artifact(args.artifact, args, backend=args.backend)
    classifier = engine.config.classifies  # one set of class logits per image: not features, tokens or an image embedding
    kind = "image embeddings" if engine.config.embedding_head and len(engine.config.output_shape) == 1 else "outputs"
    what = "logits" if classifier else f"{kind} [{', '.join('?' if d is None else str(d) for d in engine.config.output_shape)}]"
    if not classifier and fmt not in (".npz", ".jsonl"):
        raise InputError(f"{args.artifact} returns {what} per image, not classes: give --out FILE.npz (or .jsonl) to write them")
    if not classifier and (args.top_k or args.scores):
        raise InputError(f"{args.artifact} returns {what} per image, not classes: --top-k / --scores do not apply; drop them")
    if classifier and fmt == ".npz" and (args.top_k or args.scores):
        raise InputError("--out FILE.npz holds the logits themselves: drop --top-k / --scores, or write .jsonl / .csv")
    top_k = classifier and fmt != ".npz"  # top-k rows rather than whole outputs
    scores, why = (args.scores, None) if args.scores else default_scores(engine.config.num_classes, engine.config.problem_type)
    if scores != "softmax" and why and top_k and not args.quiet:
        print(f"vitfast: note: scores: {why}; --scores to change", file=sys.stderr)
    k = min(args.top_k or pipeline.TOP_K, engine.config.num_classes) if classifier else 0
    with reporter("predict", args.quiet) as progress:
        results = pipeline.predict(engine, files, batch_size=args.batch_size, workers=args.workers, progress=progress)
        rows = classifier_rows(engine, results, k, scores) if top_k else output_rows(results)
        if not args.out:
            rows = list(rows)
        elif fmt == ".npz":
            with claim_output(args.out, args.force) as claim:
                n = write_npz(results, claim.tmp, len(files))
        else:
            with claim_output(args.out, args.force) as claim, claim.tmp.open("w", newline="", encoding="utf-8", errors="surrogateescape") as stream:  # undecodable file names as their bytes
                n = write_rows(rows, fmt, stream)
    summary = {"artifact": str(args.artifact), "backend": engine.kind, "precision": engine.precision, "n": len(files)}
    summary |= {"k": k, "scores": scores} if top_k else {"output": what}
    if args.out:
        if args.json:
            print(json.dumps(summary | {"out": str(args.out)}))
        elif not args.quiet:
            print(f"wrote {n} images' {f'top-{k} classes' if top_k else what} to {args.out}", file=sys.stderr)
        return 0
    if args.json:
        print(json.dumps(summary | {"predictions": rows}))
        return 0
    for row in rows:
        print(f"{row['file']}: " + ", ".join(f"{c['label'] if c['label'] is not None else c['index']} {c['score']:.4g}" for c in row["top_k"]))
    return 0


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("predict", parents=[common], help="top-k classes (or features) of image files and folders")
    p.add_argument("artifact", help="checkpoint, .onnx file (vitfast's or another tool's), Optimum folder or TensorRT engine")
    p.add_argument("images", nargs="+", help="image files, or folders (every image under them, sorted)")
    p.add_argument("--top-k", type=positive_int, metavar="K", help=f"classes per image (default {pipeline.TOP_K})")
    p.add_argument("--scores", choices=SCORES,
                   help="default: as transformers' pipeline scores the model: sigmoid per class for problem_type "
                        "multi_label_classification or one class, the logits for regression, else softmax")  # fmt: skip
    p.add_argument("--out", metavar="FILE", help="write to FILE.jsonl (a row per image), FILE.csv (classifiers: index, label, "
                   "score per rank) or FILE.npz (outputs [N, ...] float32 and files [N]: logits, features or tokens)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    add_loading_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (with the predictions unless --out)")
    add_quiet(p)
    add_artifact_args(p)
    add_torch_args(p)
    p.set_defaults(func=cmd_predict)
