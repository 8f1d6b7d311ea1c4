"""`vitfast` command line. User errors: one line on stderr, exit code 2 (`--debug` for the traceback)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import traceback
from typing import Any

from . import __version__
from .errors import ConfigError, VitfastError


def console():
    """A rich console; when piped, wide enough that tables are not squeezed into ellipses."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


def cmd_info(args: argparse.Namespace) -> int:
    from .info import collect

    info = collect()
    if args.json:
        print(json.dumps(info))
        return 0
    from rich.table import Table

    table = Table(title=f"vitfast {info['vitfast']} on Python {info['python']}", show_header=False)
    for name, version in info["versions"].items():
        table.add_row(name, version or "[dim]not installed[/dim]")
    gpu = info["gpu"]
    table.add_row("GPU", f"{gpu['name']} (compute capability {gpu['compute_capability']}, CUDA {gpu['cuda']})" if gpu["available"] else "no GPU")
    table.add_row("TensorRT", "available" if info["tensorrt_available"] else "not installed (pip install tensorrt, on a machine with an NVIDIA GPU)")
    table.add_row("Triton interpreter", "on (TRITON_INTERPRET=1)" if info["triton_interpret"] else "off")
    console().print(table)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .flops import count_macs, count_params
    from .registry import get_config, list_models

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
            )
        )  # fmt: skip
    if args.json:
        print(json.dumps({"models": rows}))
        return 0
    from rich.table import Table

    table = Table(title="vitfast models (GFLOPs = 2 x GMACs, one image)")
    table.add_column("name", no_wrap=True)
    for col in ("params M", "GMACs", "GFLOPs", "img", "patch", "dim", "depth", "heads", "classes"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["name"], f"{r['params_m']:.2f}", f"{r['gmacs']:.2f}", f"{r['gflops']:.2f}", str(r["img_size"]),
            str(r["patch_size"]), str(r["embed_dim"]), str(r["depth"]), str(r["num_heads"]), str(r["num_classes"]),
        )  # fmt: skip
    console().print(table)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import inspect
    from .preprocessing import preprocess

    image = inspect.load_image(args.image)  # first: a bad image fails before any model is built
    if args.model:
        from .registry import create_model

        model = create_model(args.model)
    else:
        from .checkpoint import load_checkpoint
        from .config_args import config_overrides

        model = load_checkpoint(args.checkpoint, overrides=config_overrides(args))
    out_dir = Path(args.out) if args.out else Path(f"inspect-{Path(args.image).stem}")
    result = inspect.inspect_model(model, preprocess(image, model.config))
    paths = inspect.save_figures(result, out_dir, overwrite=args.force)
    if args.json:
        report = {"model": model.config.name or args.checkpoint, "image": args.image, **result.to_dict()}
        print(json.dumps({**report, "files": {name: str(p) for name, p in paths.items()}}))
    else:
        print(f"attention maps start from the {result.source}; mean attention distance (pixels) per layer:")
        for layer, row in enumerate(result.attention_distance.tolist(), start=1):
            print(f"  layer {layer:>2}: mean {sum(row) / len(row):6.1f}  heads " + " ".join(f"{d:5.1f}" for d in row))
        for p in paths.values():
            print(f"wrote {p}")
    if args.model:  # stderr, so --json output stays one object
        print(f"vitfast: note: --model {args.model} has random weights; pass --checkpoint for a trained model", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitfast", description="Fast, faithful Vision Transformer inference.")
    parser.add_argument("--version", action="version", version=f"vitfast {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", parents=[common], help="versions, GPU and compute capability, TensorRT, interpreter mode")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("models", parents=[common], help="registered variants with parameters and GFLOPs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--filter", metavar="PATTERN", help="shell-style name filter, e.g. 'deit*'")
    p.set_defaults(func=cmd_models)

    from .commands import add_parsers

    add_parsers(sub, common)  # export, check, eval
    from .serve import add_parsers as add_serve_parsers
    add_serve_parsers(sub, common)  # serve
    from .bench import add_parsers as add_bench_parsers
    add_bench_parsers(sub, common)

    p = sub.add_parser(
        "inspect", parents=[common], help="attention rollout, per-head attention, position-embedding similarity, attention distance (PNGs)"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="NAME", help="registered variant (random weights)")
    src.add_argument("--checkpoint", metavar="PATH", help="vitfast, timm or Hugging Face checkpoint")
    p.add_argument("--image", metavar="IMG", required=True, help="an image file Pillow can read")
    p.add_argument("--out", metavar="DIR", help="folder for the PNGs (default: ./inspect-<image stem>/)")
    p.add_argument("--force", action="store_true", help="overwrite PNGs already in the folder")
    p.add_argument("--json", action="store_true", help="print one JSON object with the numbers and file paths")
    from .config_args import add_config_args

    add_config_args(p)
    p.set_defaults(func=cmd_inspect)
    return parser


_GUESSES_SHOWN: set[str] = set()


def _show_guesses() -> None:
    """Print each `GuessedConfigWarning` once per command, as one `vitfast: warning:` line on stderr."""
    import warnings

    from .config_args import warn_guesses
    from .errors import GuessedConfigWarning

    _GUESSES_SHOWN.clear()
    warnings.simplefilter("always", GuessedConfigWarning)
    if getattr(warnings.showwarning, "vitfast_guesses", False):
        return
    default = warnings.showwarning

    def show(message, category, *rest, **kwargs):
        if not issubclass(category, GuessedConfigWarning):
            return default(message, category, *rest, **kwargs)
        if str(message) not in _GUESSES_SHOWN:
            _GUESSES_SHOWN.add(str(message))
            warn_guesses(str(message))

    show.vitfast_guesses = True
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _show_guesses()
    _refuse_empty_values(parser, args)
    previous = signal.signal(signal.SIGTERM, _terminate)  # so cleanup (staging folders) runs on SIGTERM too
    try:
        return args.func(args)
    except VitfastError as exc:
        return _fail(args, str(exc))
    except OSError as exc:  # the environment (a file that vanished, a full disk): still one line, never a traceback
        where = f" ({exc.filename})" if exc.filename else ""
        return _fail(args, f"{exc.strerror or exc}{where}; check the path and its permissions and free space")
    except KeyboardInterrupt:
        print("vitfast: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _refuse_empty_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse turns `--flag=--` into [] without calling the flag's type: refuse it like any bad value."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)  # noqa: SLF001
    command = sub.choices.get(args.command) if sub else None
    for action in command._actions if command else ():  # noqa: SLF001
        if action.nargs is None and action.option_strings and getattr(args, action.dest, None) == []:
            command.error(f"argument {'/'.join(action.option_strings)}: expected a value")


def _fail(args: argparse.Namespace, message: str) -> int:
    if args.debug:
        traceback.print_exc()
    print(f"vitfast: error: {message}", file=sys.stderr)
    return 2


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
