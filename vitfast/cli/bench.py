"""`vitfast bench`: run a sweep, compare two result files, or render benchmarks/README.md."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from vitfast.atomic import atomic_write, check_output_free
from vitfast.bench import report
from vitfast.bench.backends import BACKENDS, COMPILE_MODES, PRECISIONS, BackendOptions
from vitfast.bench.stats import MIN_NOISE, compare_rows
from vitfast.bench.sweep import Settings, load_result, run_sweep
from vitfast.data import find_images
from vitfast.errors import ArtifactError, InputError
from vitfast.flags import int_in, non_negative_float, positive_float, positive_int

from .output import console, fitting, to_json
from .progress import add_quiet


def parse_list(text: str, what: str, choices: tuple[str, ...] | None = None) -> list[str]:
    """'a,b' -> ['a', 'b'], each checked against `choices` when given."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise InputError(f"--{what} is empty; give a comma-separated list")
    bad = [t for t in items if choices and t not in choices]
    if bad:
        raise InputError(f"unknown {what} {', '.join(bad)}; choose from {', '.join(choices)}")
    twice = sorted({t for t in items if items.count(t) > 1})
    if twice:  # the same row measured twice under one label: --compare could not pair it
        raise InputError(f"--{what} lists {', '.join(twice)} more than once; give each once")
    return items


def parse_ints(text: str, what: str) -> list[int]:
    items = parse_list(text, what)
    if not all(t.isascii() and t.isdigit() and int(t) > 0 for t in items):
        raise InputError(f"--{what} takes positive integers separated by commas, e.g. 1,8,64; got {text!r}")
    values = [int(t) for t in items]
    if len(set(values)) < len(values):  # 1,01: one row measured twice under one label
        raise InputError(f"--{what} lists a value more than once ({text}); give each once")
    return values


def settings_from_args(args: argparse.Namespace):
    """Validated `Settings` from the command line (precision 'auto': fp16 on a GPU, else fp32)."""
    precision = args.precision
    if precision == "auto":
        precision = "fp16" if torch.cuda.is_available() else "fp32"
    if min(args.repeats, args.buffers, args.calib_samples) < 1 or args.warmup < 0 or args.max_seconds <= 0:
        raise InputError("--repeats, --buffers and --calib-samples must be >= 1, --warmup >= 0, --max-seconds > 0")
    if args.calib_dir:
        find_images(args.calib_dir)  # an empty or missing folder fails before the sweep
    for artifact in args.artifact or []:
        if not Path(artifact).exists():
            raise InputError(f"--artifact {artifact}: no such file or folder")
    for engine in args.engine or []:
        if not Path(engine).is_file():
            raise InputError(f"--engine {engine}: no such file; give a TensorRT engine built with `vitfast export --format trt`")
    options = BackendOptions(compile_mode=args.compile_mode, engines=args.engine or [], ort_provider=args.ort_provider,
                             threads=args.threads, calib_samples=args.calib_samples, calib_dir=args.calib_dir,
                             ov_hint=args.ov_hint)  # fmt: skip
    if args.work_dir:
        options.work_dir = Path(args.work_dir)
    return Settings(
        models=parse_list(args.model, "model") if args.model else [],
        artifacts=args.artifact or [],
        backends=parse_list(args.backends, "backends", BACKENDS),
        batches=parse_ints(args.batch, "batch"),
        precisions=parse_list(precision, "precision", PRECISIONS),
        img_sizes=parse_ints(args.img_size, "img-size") if args.img_size else [None],
        repeats=args.repeats, warmup=args.warmup, max_seconds=args.max_seconds, buffers=args.buffers,
        options=options, debug=args.debug,
    )  # fmt: skip


def _outputs(args: argparse.Namespace) -> dict[str, Path]:
    """Requested output files, checked before the sweep so a long run cannot end in a refusal."""
    wanted = {"out": args.out, "csv": args.csv, "plot": args.plot, "markdown": args.markdown if args.markdown != "-" else None}
    if args.plot:
        report.require_matplotlib()
    outputs = {kind: check_output_free(path, args.force) for kind, path in wanted.items() if path}
    # two flags naming one file: the second write would fail after the sweep, or with --force overwrite the first
    claimed: dict[Path, str] = {}
    for kind, path in outputs.items():
        other = claimed.setdefault(path.resolve(), kind)
        if other != kind:
            raise InputError(f"--{other} and --{kind} both name {path}; give each output its own file")
    # an output naming an input (the model measured, an engine) would replace it with --force
    inputs = {Path(p).resolve(): f"--{flag} {p}" for flag, paths in (("artifact", args.artifact), ("engine", args.engine)) for p in paths or []}
    for kind, path in outputs.items():
        if path.resolve() in inputs:
            raise InputError(f"--{kind} {path} is the input {inputs[path.resolve()]}; write the results to another file")
    return outputs


def _write(path: Path, force: bool, write) -> None:
    atomic_write(path, write, force=force)


def _output_flags(args: argparse.Namespace) -> str:
    flags = [f"--{k} {shlex.quote(v)}" for k, v in (("out", args.out), ("csv", args.csv), ("plot", args.plot)) if v]
    if args.markdown:
        flags.append("--markdown" if args.markdown == "-" else f"--markdown {shlex.quote(args.markdown)}")
    return " ".join(flags)


# The sweep's flags, with their defaults: --compare and --report measure nothing, and refuse a flag that differs from its default
DEFAULTS = {"model": None, "artifact": None, "backends": ",".join(BACKENDS), "batch": "1,8", "precision": "auto", "img_size": None,
            "repeats": 30, "warmup": 5, "max_seconds": 20.0, "buffers": 4, "compile_mode": "default", "engine": None,
            "ort_provider": "auto", "threads": None, "ov_hint": None, "work_dir": None, "calib_samples": 16, "calib_dir": None,
            "out": None, "csv": None, "plot": None, "markdown": None}  # fmt: skip


def _refuse_flags(args: argparse.Namespace, mode: str, defaults: dict) -> None:
    """One line naming the flags given that `mode` (--compare, --report) does not use, which it would silently ignore."""
    given = [f"--{flag.replace('_', '-')}" for flag, default in defaults.items() if getattr(args, flag) != default]
    if given:
        raise InputError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to {mode}, which measures and writes "
                         f"nothing (it prints to stdout): drop {'it' if len(given) == 1 else 'them'}")  # fmt: skip


def cmd_bench(args: argparse.Namespace) -> int:
    if args.compare:
        _refuse_flags(args, "--compare", DEFAULTS)
        return cmd_compare(args)
    if args.report:
        _refuse_flags(args, "--report", DEFAULTS | {"json": False, "noise_floor": MIN_NOISE})
        return cmd_report(args)
    if args.noise_floor != MIN_NOISE:
        raise InputError("--noise-floor sets what --compare calls a change: it goes with --compare BASE.json NEW.json")
    if not args.model and not args.artifact:
        raise InputError("give --model NAME[,NAME...] and/or --artifact PATH to measure (or --compare A.json B.json, or --report FILE...)")
    settings = settings_from_args(args)
    outputs = _outputs(args)
    command = " ".join(filter(None, [settings.command(), _output_flags(args)]))
    result = _run_with_progress(settings, command, quiet=args.json or args.quiet)
    if "out" in outputs:
        _write(outputs["out"], args.force, lambda p: p.write_text(json.dumps(result, indent=1)))
    if "csv" in outputs:
        _write(outputs["csv"], args.force, lambda p: p.write_text(report.to_csv(result)))
    if "markdown" in outputs:
        _write(outputs["markdown"], args.force, lambda p: p.write_text(report.to_markdown(result)))
    plotted = "plot" in outputs and any(r["status"] == "ok" for r in result["rows"])
    if plotted:
        report.save_plot(result, outputs["plot"], force=args.force)
    if args.json:
        print(to_json(result))
        return _all_failed(result)
    out = console()
    out.print(fitting(out, Group(*report.rich_tables(result)), Group(*report.rich_tables(result, compact=True))))
    if args.markdown == "-":
        print(report.to_markdown(result))
    for kind, path in outputs.items():
        print(f"no plot written to {path}: nothing was measured" if kind == "plot" and not plotted else f"wrote {path}", file=sys.stderr)
    return _all_failed(result)


def _all_failed(result: dict) -> int:
    """2, with one error line, when every row failed (an unwritable --work-dir, ...): a sweep that measured nothing is no
    success; skipped rows (a backend this machine lacks) and a partly failed sweep keep 0, their reasons in the table."""
    rows = result["rows"]
    if not rows or any(r["status"] != "error" for r in rows):
        return 0
    print(f"vitfast: error: every row failed (the first: {rows[0]['backend']}: {rows[0]['reason']})", file=sys.stderr)
    return 2


def _run_with_progress(settings, command: str, quiet: bool) -> dict:
    """The sweep, with a progress bar on stderr when it is a terminal."""
    total = (len(list(settings.configs())) * len(settings.backends) * len(settings.precisions) + len(settings.artifacts)) * len(settings.batches)
    if quiet or not sys.stderr.isatty():
        return run_sweep(settings, command=command)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("measuring the matmul peak", total=total)
        return run_sweep(settings, command=command, on_start=lambda label: bar.update(task, description=label),
                         on_row=lambda row: bar.advance(task))  # fmt: skip


def cmd_compare(args: argparse.Namespace) -> int:
    base_path, new_path = args.compare
    base, new = load_result(base_path), load_result(new_path)
    rows = compare_rows(base["rows"], new["rows"], args.noise_floor)
    if args.json:
        print(to_json({"base": base_path, "new": new_path, "noise_floor": args.noise_floor, "rows": rows}))
        return 0
    out = console()
    for name, result in ((base_path, base), (new_path, new)):
        env = result["environment"]
        out.print(f"{name}: {report.device_label(result)}, git {(env['git']['sha'] or '?')[:10]}, {env['time_utc']}, {report.peak_label(result)}")
    out.print(fitting(out, Group(*report.compare_tables(rows, base_path, new_path)),
                      Group(*report.compare_tables(rows, base_path, new_path, compact=True))))  # fmt: skip
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """benchmarks/README.md on stdout; other scripts' JSON in results/ is shown as its own rows."""
    results, others = [], []
    for path in args.report:
        try:
            results.append((Path(path).name, load_result(path)))
        except ArtifactError as exc:
            if "not a `vitfast bench --out` file" not in str(exc):
                raise
            others.append((Path(path).name, report.read_other(path)))
    if not results:
        raise InputError(f"none of {', '.join(args.report)} is a `vitfast bench --out` file")
    print(report.render_readme(results, others), end="")
    return 0


def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("bench", parents=[common], help="benchmark backends x precisions x batch sizes (or --compare / --report)",
                       description="Measure latency percentiles, throughput, %% of the matmul peak and peak memory.")  # fmt: skip
    p.add_argument("--model", metavar="LIST", help="registered model name(s), comma-separated (random weights, seed 0)")
    p.add_argument("--artifact", metavar="PATH", action="append",
                   help="your own artifact (ONNX file, Optimum folder, TensorRT engine, checkpoint), measured as it is "
                        "beside the --model rows; repeatable")  # fmt: skip
    p.add_argument("--backends", metavar="LIST", default=DEFAULTS["backends"],
                   help=f"comma-separated, from {','.join(BACKENDS)} (default: all; unavailable ones are skipped with the reason)")  # fmt: skip
    p.add_argument("--batch", metavar="LIST", default=DEFAULTS["batch"], help="batch sizes, comma-separated (default 1,8)")
    p.add_argument("--precision", metavar="LIST", default=DEFAULTS["precision"],
                   help=f"from {','.join(PRECISIONS)}, comma-separated (default: fp16 on a GPU, fp32 on CPU)")  # fmt: skip
    p.add_argument("--img-size", metavar="LIST", help="image sizes, comma-separated (default: each model's own)")
    p.add_argument("--repeats", type=positive_int, default=DEFAULTS["repeats"], help="timed calls in each of the two repeats per row (default 30)")
    p.add_argument("--warmup", type=int_in(0), default=DEFAULTS["warmup"], help="untimed calls after the first (compiling) call (default 5)")
    p.add_argument("--max-seconds", type=positive_float, default=DEFAULTS["max_seconds"],
                   help="cut a repeat short after this many seconds (at least 5 calls still run; default 20)")  # fmt: skip
    p.add_argument("--buffers", type=positive_int, default=DEFAULTS["buffers"], help="input batches rotated through (default 4)")
    p.add_argument("--compile-mode", default=DEFAULTS["compile_mode"], choices=COMPILE_MODES,
                   help="torch.compile mode; rows of another mode than default are labelled compile-MODE (vitfast-compile-MODE)")
    p.add_argument("--engine", metavar="PATH", action="append",
                   help="TensorRT engine for the tensorrt backend; repeat for several models/precisions")  # fmt: skip
    p.add_argument("--ort-provider", default=DEFAULTS["ort_provider"], choices=["auto", "cpu", "cuda"], help="ONNX Runtime execution provider")
    p.add_argument("--threads", type=positive_int, help="CPU threads for PyTorch, ONNX Runtime and OpenVINO (default: their own)")
    p.add_argument("--ov-hint", choices=["latency", "throughput"],
                   help="OpenVINO PERFORMANCE_HINT (default OpenVINO's: latency; throughput splits a batch across streams)")
    p.add_argument("--work-dir", metavar="DIR", help="cache for exported ONNX files (default: ~/.cache/vitfast/bench, or $XDG_CACHE_HOME/vitfast/bench)")
    p.add_argument("--calib-samples", type=positive_int, default=DEFAULTS["calib_samples"], help="calibration images for onnxruntime int8 (default 16)")
    p.add_argument("--calib-dir", metavar="DIR", help="real calibration images for int8 rows (default: seeded random pixels)")
    p.add_argument("--out", metavar="FILE.json", help="every raw number and the environment")
    p.add_argument("--csv", metavar="FILE", help="one line per row")
    p.add_argument("--plot", metavar="FILE.png", help="throughput and latency percentiles vs batch")
    p.add_argument("--markdown", metavar="FILE", nargs="?", const="-", help="markdown table to FILE (printed without FILE)")
    p.add_argument("--force", action="store_true", help="overwrite existing output files")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object (no table)")
    add_quiet(p)
    modes = p.add_mutually_exclusive_group()
    modes.add_argument("--compare", nargs=2, metavar=("BASE.json", "NEW.json"), help="ratios new / base per row instead of measuring")
    p.add_argument("--noise-floor", type=non_negative_float, default=MIN_NOISE, metavar="FRACTION",
                   help=f"--compare calls nothing closer than this a win or regression (default {MIN_NOISE}; "
                        "raise it across runs on a shared machine)")  # fmt: skip
    modes.add_argument("--report", nargs="+", metavar="FILE.json", help="print benchmarks/README.md from result files")
    p.set_defaults(func=cmd_bench)
