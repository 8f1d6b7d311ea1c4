"""`vitfast inspect`: attention maps and position-embedding similarity as PNGs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vitfast import inspect
from vitfast.checkpoint import load_checkpoint
from vitfast.flags import positive_int
from vitfast.preprocessing import preprocess
from vitfast.sources import RANDOM_SEED, random_model

from .config_args import add_config_args, config_overrides


HEADS_PER_LINE = 8  # 8 distances after the layer's prefix fit an 80-column line


def cmd_inspect(args: argparse.Namespace) -> int:
    image = inspect.load_image(args.image)  # first: a bad image fails before any model is built
    out_dir = inspect.check_figures_free(args.out or f"inspect-{Path(args.image).stem}", args.force)  # and existing PNGs
    overrides = config_overrides(args)
    model = (random_model(args.model, overrides, img_size=args.img_size) if args.model
             else load_checkpoint(args.checkpoint, img_size=args.img_size, overrides=overrides))  # fmt: skip
    result = inspect.inspect_model(model, preprocess(image, model.config))
    paths = inspect.save_figures(result, out_dir, overwrite=args.force)
    if args.json:
        report = {"model": model.config.name or args.checkpoint, "image": args.image, **result.to_dict()}
        print(json.dumps({**report, "files": {name: str(p) for name, p in paths.items()}}))
    else:
        print(f"attention maps start from the {result.source}\nmean attention distance (pixels) per layer:")
        for layer, row in enumerate(result.attention_distance.tolist(), start=1):
            head = f"  layer {layer:>2}: mean {sum(row) / len(row):6.1f}  heads "
            runs = [" ".join(f"{d:5.1f}" for d in row[i : i + HEADS_PER_LINE]) for i in range(0, len(row), HEADS_PER_LINE)]
            print(head + ("\n" + " " * len(head)).join(runs))
        for p in paths.values():
            print(f"wrote {p}")
    if args.model:  # stderr, so --json output stays one object
        print(f"vitfast: note: --model {args.model} has random weights (seed {RANDOM_SEED}, as export's); pass --checkpoint for a "
              "trained model", file=sys.stderr)  # fmt: skip
    return 0


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "inspect", parents=[common], help="attention rollout, per-head attention, position-embedding similarity, attention distance (PNGs)"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="NAME", help="registered variant (random weights, seed 0, as export --model)")
    src.add_argument("--checkpoint", metavar="PATH", help="vitfast, timm or Hugging Face checkpoint")
    p.add_argument("--image", metavar="IMG", required=True, help="an image file Pillow can read")
    p.add_argument("--img-size", type=positive_int, metavar="N", help="the model's input resolution (position embeddings resized, as export's)")
    p.add_argument("--out", metavar="DIR", help="folder for the PNGs (default: ./inspect-<image stem>/)")
    p.add_argument("--force", action="store_true", help="overwrite PNGs already in the folder")
    p.add_argument("--json", action="store_true", help="print one JSON object with the numbers and file paths")
    add_config_args(p)
    p.set_defaults(func=cmd_inspect)
