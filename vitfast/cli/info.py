"""`vitfast info` and `vitfast models`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from vitfast.describe import describe, describe_sidecar
from vitfast.errors import BackendUnavailable, ConfigError, first_line
from vitfast.flops import count_macs, count_params
from vitfast.info import collect
from vitfast.registry import get_config, list_models
from vitfast.runtime import ENGINE_SUFFIXES, read_sidecar, sidecar_path

from .export import add_artifact_args, load_artifact
from .output import console, fitting


def cmd_info(args: argparse.Namespace) -> int:
    if args.artifact:
        return cmd_describe(args)
    info = collect()
    if args.json:
        print(json.dumps(info))
        return 0
    table = Table(title=f"vitfast {info['vitfast']} on Python {info['python']}", show_header=False)
    for name, version in info["versions"].items():
        table.add_row(name, version or "[dim]not installed[/dim]")
    gpu = info["gpu"]
    table.add_row("GPU", f"{gpu['name']} (compute capability {gpu['compute_capability']}, CUDA {gpu['cuda']})" if gpu["available"] else "no GPU")
    table.add_row("TensorRT", "available" if info["tensorrt_available"] else "not installed (pip install 'tensorrt>=10,<11', on a machine with an NVIDIA GPU)")
    table.add_row("Triton interpreter", "on (TRITON_INTERPRET=1)" if info["triton_interpret"] else "off")
    console().print(table)
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    """`vitfast info ARTIFACT`: what it is and what vitfast will do with it; a TensorRT engine this machine cannot
    load is described from its sidecar."""
    path = Path(args.artifact)
    try:
        facts = describe(load_artifact(args.artifact, args, backend=args.backend, preprocessing=False))
    except BackendUnavailable as exc:
        if path.suffix.lower() not in ENGINE_SUFFIXES or not sidecar_path(path).is_file():
            raise
        facts = describe_sidecar(str(path), read_sidecar(path, verify=False), first_line(exc))
    if args.json:
        print(json.dumps(facts))
        return 0
    table = Table(title=str(path), show_header=False)
    for key, value in facts.items():
        if isinstance(value, dict):
            for sub, item in value.items():
                if item is not None:
                    table.add_row(f"{key}: {sub}", _text(item))
        elif value not in (None, [], {}):
            table.add_row(key, _text(value))
    console().print(table)
    return 0


def _text(value: Any) -> str:
    """A value as a table cell, its brackets not read as rich markup (a fix's "pip install 'vitfast[openvino]'")."""
    if isinstance(value, (dict, list)):
        return escape(json.dumps(value))
    return "" if value is None else escape(str(value))


def cmd_models(args: argparse.Namespace) -> int:
    names = list_models(args.filter)
    if not names:
        raise ConfigError(f"no registered model matches {args.filter!r}; run `vitfast models` to see them all")
    rows: list[dict[str, Any]] = []
    for name in names:
        cfg = get_config(name)
        macs = count_macs(cfg)
        rows.append(
            dict(
                name=name, params_m=round(count_params(cfg) / 1e6, 3), gmacs=round(macs / 1e9, 3),
                gflops=round(2 * macs / 1e9, 3), img_size=cfg.img_size, patch_size=cfg.patch_size,
                embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads, num_classes=cfg.num_classes,
                embedding_head=cfg.embedding_head,
            )
        )  # fmt: skip
    if args.json:
        print(json.dumps({"models": rows}))
        return 0
    out = console()
    out.print(fitting(out, models_table(rows), models_table(rows, compact=True)))
    return 0


MODEL_COLUMNS = {"params M": "params_m", "GMACs": "gmacs", "GFLOPs": "gflops", "img": "img_size", "patch": "patch_size",
                 "dim": "embed_dim", "depth": "depth", "heads": "num_heads", "classes": "num_classes"}  # fmt: skip
FOLDED = ("GFLOPs", "img", "patch")  # left out on a narrow terminal: 2 x GMACs, and both are in every registered name
COMPACT_HEADERS = {"classes": "class"}  # as wide as the widest count (11821), so the 39-character names still fit 80 columns


def models_table(rows: list[dict[str, Any]], compact: bool = False) -> Table:
    """`vitfast models` as a table; `compact` fits 80 columns (box without rules, one space between
    columns: the longest names are 39 characters; `FOLDED` columns left out, `COMPACT_HEADERS` shortened)."""
    columns = [c for c in MODEL_COLUMNS if not (compact and c in FOLDED)]
    title = "vitfast models (one image; GFLOPs = 2 x GMACs" + ("; size and patch in the name)" if compact else ")")
    embeds = any(r["embedding_head"] for r in rows)
    table = Table(title=title, box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, pad_edge=not compact,
                  collapse_padding=compact, show_edge=not compact, padding=(0, 0) if compact else (0, 1),
                  caption="e: an image embedding's width (CLIP's image_embeds), not classes" if embeds else None)  # fmt: skip
    table.add_column("name", no_wrap=True)
    for col in columns:
        table.add_column(COMPACT_HEADERS.get(col, col) if compact else col, justify="right", no_wrap=True)
    for r in rows:
        cells = {c: f"{r[MODEL_COLUMNS[c]]:.2f}" if isinstance(r[MODEL_COLUMNS[c]], float) else str(r[MODEL_COLUMNS[c]]) for c in columns}
        cells["classes"] += "e" if r["embedding_head"] else ""
        table.add_row(r["name"], *cells.values())
    return table


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("info", parents=[common], help="versions, GPU and compute capability, TensorRT, interpreter mode; "
                       "or what an artifact is and how vitfast runs it")  # fmt: skip
    p.add_argument("artifact", nargs="?", help="describe this artifact instead (checkpoint, ONNX file or folder, TensorRT engine): "
                   "runtime, precision, input and output, preprocessing, scoring, and what its sidecar recorded")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_artifact_args(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("models", parents=[common], help="registered variants with parameters and GFLOPs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--filter", metavar="PATTERN", help="shell-style name filter, e.g. 'deit*'")
    p.set_defaults(func=cmd_models)
