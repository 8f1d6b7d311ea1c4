"""`vitfast export`, `vitfast check` and `vitfast eval`: flags in, `vitfast.pipeline` does the work, results printed."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

import torch
from rich.table import Table

from vitfast import pipeline
from vitfast.config import ViTConfig
from vitfast.data import find_images
from vitfast.errors import ArtifactError, BackendUnavailable, InputError, OutputError, ParityWarning
from vitfast.foreign import FOREIGN_FIELDS, is_onnx_artifact, report_choice, report_settings
from vitfast.flags import int_in, non_negative_float, ov_streams, positive_float, positive_int
from vitfast.atomic import SIDECAR_SUFFIX, check_output_free, reserve_output
from vitfast.export.artifacts import parse_batch, parse_image_sizes, read_sidecar
from vitfast.export.tensorrt import build_engine, require_tensorrt, trtexec_command
from vitfast.export.triton_repo import check_repository_free
from vitfast.layerwise import describe_layers
from vitfast.parity import failed_export
from vitfast.precision import EXPORT as EXPORT_PRECISIONS
from vitfast.precision import TORCH as TORCH_PRECISIONS
from vitfast.precision import TORCH_DTYPES
from vitfast.progress import Reporter
from vitfast.runtime import BACKENDS, ENGINE_SUFFIXES, Engine, load_engine, sidecar_path
from vitfast.runtime.openvino_engine import HINTS as OV_HINTS
from vitfast.sources import source_model

from .config_args import add_config_args, config_overrides, config_overrides_and_guesses, read_label_file
from .output import console, to_json
from .progress import add_quiet, paused, reporter


# ---------------------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ParityWarning)  # a failed parity is this command's error line and exit code 1 (`_report`)
        return _cmd_export(args)


# Flags whose default is None in the parser, so that one given where it does nothing is refused, not ignored; filled in after
DEFAULTS = {"calib_method": "minmax", "calib_samples": 256, "int8_target": "tensorrt", "workspace": 4.0, "opt_level": 3}
INT8_FLAGS = ("calib_dir", "calib_method", "calib_samples", "int8_target", "exclude")
TENSORRT_FLAGS = ("workspace", "opt_level", "timing_cache", "no_fp32_layernorm")


def _fill_defaults(args: argparse.Namespace) -> None:
    """The `DEFAULTS` of the flags not given, once `_given` has been asked about them."""
    for dest, default in DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)


def _given(args: argparse.Namespace, dests: tuple[str, ...]) -> list[str]:
    """The flags of `dests` given on the command line (`--exclude` with no pattern too)."""
    return ["--" + dest.replace("_", "-") for dest in dests if getattr(args, dest) not in (None, False)]


def _cmd_export(args: argparse.Namespace) -> int:
    batch = parse_batch(args.batch)
    if args.no_ema and not args.checkpoint:
        raise InputError("--no-ema picks a training checkpoint's weights: it goes with --checkpoint")
    if args.onnx:
        return _engine_from_onnx(args, batch)
    unused = _given(args, TENSORRT_FLAGS) if args.format != "trt" else []
    if unused:
        raise InputError(f"{', '.join(unused)} {'sets' if len(unused) == 1 else 'set'} how TensorRT builds an engine: "
                         f"{'it goes' if len(unused) == 1 else 'they go'} with --format trt; drop {'it' if len(unused) == 1 else 'them'}")  # fmt: skip
    unused = _given(args, INT8_FLAGS) if args.precision != "int8" else []
    if unused:
        raise InputError(f"{', '.join(unused)} {'configures' if len(unused) == 1 else 'configure'} int8 calibration; this export "
                         f"is {args.precision}: add --precision int8 or drop {'it' if len(unused) == 1 else 'them'}")  # fmt: skip
    _fill_defaults(args)
    if args.precision == "fp8":
        raise InputError("--precision fp8 builds a TensorRT engine from an fp8 Q/DQ graph another tool made (NVIDIA ModelOpt): "
                         "pass it with --onnx PATH --format trt")  # fmt: skip
    if args.format == "triton-repo":
        out = check_repository_free(args.out, args.force)  # replaces only a repository vitfast wrote
    else:
        _check_out_name(args)
        out = check_output_free(args.out, args.force, beside=(SIDECAR_SUFFIX,))
    if args.precision == "int8" and not args.calib_dir:
        raise InputError("--precision int8 needs --calib-dir DIR with calibration images (searched recursively)")
    if args.int8_keep_float and args.precision != "int8":
        raise InputError(f"--int8-keep-float chooses layers of an int8 export; this one is {args.precision}: add --precision int8 or drop it")
    if args.format == "trt" and args.precision == "int8" and args.int8_target == "cpu":
        raise InputError("--int8-target cpu quantizes for ONNX Runtime's CPU kernels (asymmetric uint8), which TensorRT cannot "
                         "build; drop --int8-target for a TensorRT engine (tensorrt is the default)")  # fmt: skip
    if args.image_sizes and args.format != "trt":
        raise InputError("--image-sizes sets the image sizes a TensorRT engine takes: it goes with --format trt (an ONNX export with "
                         "--dynamic-img-size takes any size)")  # fmt: skip
    if args.calib_dir:
        find_images(args.calib_dir)  # fail early on an empty or missing folder
    no_tensorrt = _tensorrt_missing(out, args.force, args.quiet) if args.format == "trt" else None
    # held from here to the end: a second export to the same path fails now, not after minutes of work
    with reserve_output(out, args.force, directory=args.format == "triton-repo") as scratch, reporter("export", args.quiet) as progress:
        return _export(args, out, batch, scratch, no_tensorrt, progress)


def _engine_from_onnx(args: argparse.Namespace, batch: tuple[int, int, int]) -> int:
    """`export --onnx GRAPH --format trt`: a TensorRT engine from an existing ONNX graph, vitfast's or another tool's
    (ModelOpt's int8 / fp8 Q/DQ, Optimum's export), then its parity with the graph run by ONNX Runtime."""
    if args.format != "trt":
        raise InputError(f"--onnx builds a TensorRT engine from an existing graph: add --format trt (to run {args.onnx} itself, "
                         "pass it to check / eval / predict / serve)")  # fmt: skip
    given = _given(args, INT8_FLAGS) + [flag for flag, on in (("--int8-keep-float", args.int8_keep_float), ("--opset", args.opset != 18)) if on]
    if given:
        raise InputError(f"{', '.join(given)} set vitfast's own ONNX export and int8 calibration; --onnx takes the graph as it is "
                         "(quantize it with its own tool, e.g. ModelOpt): drop them")  # fmt: skip
    _fill_defaults(args)
    overrides = config_overrides(args) | ({"img_size": args.img_size} if args.img_size else {})
    fixed = [k for k in overrides if k not in FOREIGN_FIELDS]
    if fixed:
        raise InputError(f"{', '.join('--' + k.replace('_', '-') for k in fixed)} describe a checkpoint's architecture, which the "
                         f"graph {args.onnx} fixes: drop them (a graph takes its preprocessing, --img-size and class names)")  # fmt: skip
    _check_out_name(args)
    out = check_output_free(args.out, args.force, beside=(SIDECAR_SUFFIX,))
    sizes = args.image_sizes
    try:
        require_tensorrt()
    except BackendUnavailable as exc:
        trtexec = trtexec_command(args.onnx, out, precision=args.precision, batch=batch, workspace_gib=args.workspace,
                                  optimization_level=args.opt_level, timing_cache=args.timing_cache, image_sizes=sizes,
                                  fp32_layernorm=not args.no_fp32_layernorm, overrides=overrides)  # fmt: skip
        raise BackendUnavailable(f"{str(exc).rstrip('.')}; on a machine with TensorRT 10, build it with: {trtexec} (the engine has "
                                 "no vitfast sidecar: run it with --config and the flags given here)") from None  # fmt: skip
    with reserve_output(out, args.force), reporter("export", args.quiet) as progress:  # held through the parity run
        progress.phase(f"building the {args.precision} TensorRT engine")
        with paused(progress):
            build_engine(args.onnx, out, precision=args.precision, batch=batch, workspace_gib=args.workspace,
                         optimization_level=args.opt_level, timing_cache=args.timing_cache, fp32_layernorm=not args.no_fp32_layernorm,
                         image_sizes=sizes, overrides=overrides, force=args.force, progress=not args.quiet)  # fmt: skip
        pipeline.record_engine_parity_vs_onnx(out, Path(args.onnx), overrides, progress)
    _report_graph(out, args.quiet)
    return _report(out, args.quiet)


OUT_SUFFIXES = {"onnx": (".onnx",), "trt": ENGINE_SUFFIXES}  # vitfast tells artifacts by their suffix


def _check_out_name(args: argparse.Namespace) -> None:
    """--out named for its --format's artifact, and none of the export's inputs: --force replaces a previous output, never
    the checkpoint or graph being exported (an export that fails half-way would have nothing left to start from)."""
    out, wanted = Path(args.out), OUT_SUFFIXES[args.format]
    if out.suffix.lower() not in wanted:
        raise InputError(f"--out {out} does not fit --format {args.format}: name an ONNX export .onnx and a TensorRT engine "
                         f"{' / '.join(ENGINE_SUFFIXES)} (vitfast tells artifacts by their suffix)")  # fmt: skip
    for flag in ("checkpoint", "onnx"):
        given = getattr(args, flag, None)
        if given and out.exists() and Path(given).exists() and os.path.samefile(out, given):
            raise InputError(f"--out {out} is the --{flag} being exported (--force replaces only an earlier output); "
                             "write the export to another path")  # fmt: skip


def _vitfast_export(path: Path) -> bool:
    """Whether `path` is an ONNX file vitfast exported, its sidecar still bound to it."""
    try:
        read_sidecar(path)
    except ArtifactError:
        return False
    return True


def _report_graph(path: Path, quiet: bool) -> None:
    """What an engine built from another tool's graph read from it, and what it assumed (as `load_engine` reports it)."""
    meta = read_sidecar(path)
    if quiet or not meta.get("foreign"):
        return
    print(f"vitfast: note: {path} was built from another tool's graph: {meta['graph']}", file=sys.stderr)
    report_settings(path, meta)


def _tensorrt_missing(out: Path, force: bool, quiet: bool) -> BackendUnavailable | None:
    """Checked before the ONNX export (a minute on ViT-B): without TensorRT only the ONNX is written, beside `out` for
    trtexec, and a terminal is told so up front (a pipe or log gets the one error line at the end, with the trtexec
    command). That ONNX is not what --out names, so --force covers it only where it is a vitfast export (its sidecar
    vouches for it: made again from the model); any other file there is refused."""
    try:
        require_tensorrt()
    except BackendUnavailable as exc:
        onnx = out.with_suffix(".onnx")
        taken = [p for p in (onnx, sidecar_path(onnx), Path(f"{onnx}.data")) if p.exists()]
        if taken and not (force and _vitfast_export(onnx)):
            raise OutputError(f"{str(exc).rstrip('.')}; without it --format trt writes the ONNX for trtexec to {onnx}, and "
                              f"{taken[0]} exists (--force replaces it only when it is a vitfast export with its sidecar): "
                              "move it away or choose another --out") from None  # fmt: skip
        if sys.stderr.isatty() and not quiet:
            print(f"{str(exc).rstrip('.')}; writing only the ONNX, then the trtexec command that builds it", file=sys.stderr)
        return exc
    return None


def _export(args: argparse.Namespace, out: Path, batch: tuple[int, int, int], scratch: Path,
            no_tensorrt: BackendUnavailable | None, progress: Reporter) -> int:  # fmt: skip
    calibration = pipeline.Calibration(args.calib_dir, method=args.calib_method, samples=args.calib_samples,
                                       target=args.int8_target, exclude=args.exclude or (), keep_float=args.int8_keep_float) if args.calib_dir else None  # fmt: skip
    overrides, guessed = config_overrides_and_guesses(args)
    model, source = source_model(model=args.model, checkpoint=args.checkpoint, img_size=args.img_size, overrides=overrides,
                                 guessed=guessed, use_ema=not args.no_ema)  # fmt: skip
    if args.format == "triton-repo":
        pipeline.export_triton_repo(model, out, precision=args.precision, batch=batch, source=source, opset=args.opset,
                                    calibration=calibration, force=args.force, scratch=scratch, progress=progress)  # fmt: skip
        if not args.quiet:
            print(f"wrote Triton model repository {out} ({args.precision} ONNX, max batch {batch[2]}); "
                  f"run it with: tritonserver --model-repository {out.resolve()}", file=sys.stderr)  # fmt: skip
        model = pipeline.repository_model(out)
        return _parity_verdict(model, read_sidecar(model)["parity"])
    sizes = _engine_image_sizes(args, model.config) if args.format == "trt" else None  # refused before the ONNX export, not after
    if args.format == "onnx":
        onnx_out = out
    elif no_tensorrt:  # the ONNX is what this run leaves, for trtexec: beside --out (refused up front if a file is there)
        onnx_out = out.with_suffix(".onnx")
    else:  # the engine's intermediate: built in the staging folder, removed with it (a name int8's fp32.onnx there cannot take)
        onnx_out = scratch / f"{out.stem}.engine-input.onnx"
    # TensorRT takes an fp32 ONNX and lowers it to fp16 itself; int8 needs the Q/DQ ONNX in every case
    onnx_precision = args.precision if args.format == "onnx" or args.precision == "int8" else "fp32"
    pipeline.export_onnx(model, onnx_out, precision=onnx_precision, batch=batch, source=source, opset=args.opset,
                         calibration=calibration, force=args.force, scratch=scratch, progress=progress)  # fmt: skip
    if args.format == "onnx":
        return _report(onnx_out, args.quiet)
    if no_tensorrt is not None:
        trtexec = trtexec_command(onnx_out, out, precision=args.precision, batch=batch, workspace_gib=args.workspace,
                                  optimization_level=args.opt_level, timing_cache=args.timing_cache, image_sizes=sizes,
                                  fp32_layernorm=not args.no_fp32_layernorm)  # fmt: skip
        raise BackendUnavailable(f"{str(no_tensorrt).rstrip('.')}; the ONNX it would have used is at {onnx_out}; on a machine with "
                                 f"TensorRT 10, build it with: {trtexec} (the engine has no vitfast sidecar: run it with "
                                 f"--config {sidecar_path(onnx_out)} for the preprocessing and class names)")  # fmt: skip
    progress.phase(f"building the {args.precision} TensorRT engine")
    with paused(progress):  # TensorRT's own bar shows the builder's phases on a terminal
        build_engine(onnx_out, out, precision=args.precision, batch=batch, workspace_gib=args.workspace,
                     optimization_level=args.opt_level, timing_cache=args.timing_cache,
                     fp32_layernorm=not args.no_fp32_layernorm, image_sizes=sizes, force=args.force, progress=not args.quiet,
                     intermediate=True)  # fmt: skip
    pipeline.record_engine_parity(out, model, progress)
    return _report(out, args.quiet)


def _engine_image_sizes(args: argparse.Namespace, config) -> tuple | None:
    """--image-sizes checked against the model, or for a dynamic-size model without it the default, said on stderr."""
    if not (args.image_sizes or config.dynamic_img_size):
        return None
    sizes = parse_image_sizes(args.image_sizes, config)
    if not args.image_sizes and not args.quiet:
        (h0, w0), (h, w), (h1, w1) = sizes
        print(f"TensorRT image sizes: {h0}x{w0} to {h1}x{w1}, optimised for {h}x{w} (the default: half to twice the model's size); "
              "pass --image-sizes MIN:OPT:MAX for others", file=sys.stderr)  # fmt: skip
    return sizes


def _report(path: Path, quiet: bool) -> int:
    """The summary line (unless `quiet`), then `_parity_verdict`'s: the export's exit code."""
    meta = read_sidecar(path)
    parity = meta.get("parity") or {}
    if not quiet:
        verdict = "not measured" if not parity else "passed" if parity["passed"] else "FAILED"
        classifies = ViTConfig.from_dict(meta["config"]).classifies  # the argmax of features or an embedding predicts nothing
        top1 = f", top-1 agreement {parity.get('top1_agreement', float('nan')):.3f}" if classifies else ""
        print(f"wrote {path} ({meta['precision']}); parity vs fp32 {verdict}: max_abs_err {parity.get('max_abs_err', float('nan')):.3g}, "
              f"cosine {parity.get('cosine', float('nan')):.6f}{top1}", file=sys.stderr)  # fmt: skip
    return _parity_verdict(path, parity)


def _parity_verdict(path: Path, parity: dict | None) -> int:
    """1, with one error line on stderr (even with --quiet), when the export at `path` failed its parity check: it is kept
    for inspection, its sidecar recording the failure, as `vitfast check` keeps its verdict; else 0."""
    message = failed_export(path, parity)
    if message:
        print(f"vitfast: error: {message}", file=sys.stderr)
    return 1 if message else 0


# ---------------------------------------------------------------------------- artifacts
def load_artifact(path: str, args: argparse.Namespace, labels: bool = True, backend: str = "auto", primary: bool = True,
                  architecture: bool = True, preprocessing: bool = True) -> Engine:  # fmt: skip
    """`load_engine(path)` with the command's --config / field overrides / --img-size (and --labels
    unless `labels` is False; only the fields an exported graph can take unless `architecture`: the others then
    describe the reference `check` builds), and for the `primary` artifact (not an --against one) --threads and
    the OpenVINO flags; says what it read off a foreign ONNX graph, and refuses one whose
    preprocessing is unknown (raw images need it) unless `preprocessing` is False."""
    overrides = config_overrides(args) | ({"img_size": args.img_size} if getattr(args, "img_size", None) else {})
    if not labels:
        overrides.pop("labels", None)
    if not architecture and (is_onnx_artifact(path) or Path(path).suffix.lower() in ENGINE_SUFFIXES):
        overrides = {k: v for k, v in overrides.items() if k in FOREIGN_FIELDS}
    output = getattr(args, "output", None) if primary else None
    engine = load_engine(path, backend=backend, overrides=overrides, output=output, **(runtime_options(path, args, backend) if primary else {}))
    if backend == "auto" and engine.kind == "openvino" and not getattr(args, "quiet", False):  # not the runtime it was calibrated with
        print(f"{path}: {engine.backend_choice}", file=sys.stderr)
    if getattr(engine, "picked", None):
        print(f"vitfast: note: {engine.picked}", file=sys.stderr)
    if engine.metadata.get("foreign"):
        report_choice(engine.path, engine.io, engine.metadata)
    if preprocessing and getattr(engine, "missing_preprocessing", None):
        raise InputError(engine.missing_preprocessing)
    return engine


def runtime_options(path: str, args: argparse.Namespace, backend: str) -> dict:
    """load_engine keywords from --threads, --ov-hint and --ov-streams for this artifact and backend,
    and for a checkpoint from --precision, --optimize and --cuda-graphs. A checkpoint takes --threads as
    torch's thread count; a flag the chosen runtime has no use for is refused rather than ignored."""
    threads, hint, streams = (getattr(args, k, None) for k in ("threads", "ov_hint", "ov_streams"))
    openvino = {k: v for k, v in (("hint", hint), ("streams", streams)) if v is not None}
    onnx, engine_file = is_onnx_artifact(path), Path(path).suffix.lower() in ENGINE_SUFFIXES
    pytorch = torch_options(args, path, checkpoint=not (onnx or engine_file))
    if not onnx:
        if openvino:
            raise InputError(f"--ov-hint / --ov-streams set OpenVINO, which runs ONNX files; {path} is not one: drop them")
        if threads is not None and engine_file:
            raise InputError(f"--threads sets CPU runtimes; {path} is a TensorRT engine: drop it")
        if threads is not None:
            torch.set_num_threads(threads)
        return pytorch
    if openvino and backend == "onnxruntime":
        raise InputError("--ov-hint / --ov-streams set OpenVINO, but the backend is onnxruntime: "
                         "use --backend openvino (or auto), or drop them")  # fmt: skip
    return openvino | ({"threads": threads} if threads is not None else {})


def add_artifact_args(p: argparse.ArgumentParser, labels: bool = True) -> None:
    """--config, the field overrides (and --labels) and --img-size, for commands that take any artifact."""
    add_config_args(p, labels=labels)
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="runtime for the artifact (default auto: torch, TensorRT, or for ONNX files OpenVINO when installed for "
                        "symmetric int8 QDQ, else ONNX Runtime)")  # fmt: skip
    p.add_argument("--img-size", type=positive_int, metavar="N", help="input resolution of an ONNX graph or TensorRT engine with dynamic H/W and no vitfast sidecar")
    p.add_argument("--output", metavar="NAME", help="which output of an ONNX graph or another tool's TensorRT engine to run, by name (e.g. last_hidden_state beside "
                   "pooler_output; default: logits, else pooled features, else every token)")  # fmt: skip
    p.add_argument("--threads", type=positive_int, help="CPU threads for ONNX Runtime, OpenVINO or PyTorch (default: their own)")
    p.add_argument("--ov-hint", choices=OV_HINTS, help="OpenVINO PERFORMANCE_HINT (picks OpenVINO under --backend auto)")
    p.add_argument("--ov-streams", type=ov_streams, metavar="N|AUTO", help="OpenVINO NUM_STREAMS (picks OpenVINO under --backend auto)")


def add_torch_args(p: argparse.ArgumentParser) -> None:
    """--precision, --optimize and --cuda-graphs: how PyTorch runs a checkpoint (an exported artifact's precision is fixed)."""
    group = p.add_argument_group("checkpoints on PyTorch")
    group.add_argument("--precision", dest="torch_precision", choices=TORCH_PRECISIONS,
                       help="dtype of the weights and activations (default fp32)")
    group.add_argument("--optimize", action="store_true",
                       help="run vitfast's Triton kernels (vitfast.optimize; needs a CUDA GPU). Without --cuda-graphs small batches are "
                            "host-bound and slower than plain PyTorch (H100, ViT-B/16 fp16 batch 1: 5.6 ms, PyTorch 3.4, "
                            "with --cuda-graphs 0.50)")  # fmt: skip
    group.add_argument("--cuda-graphs", action="store_true",
                       help="with --optimize: replay the forward from CUDA graphs, one per batch size (serve: the dynamic "
                            "batcher's sizes, captured at start-up, a batch padded to the next of 1, 2, 3, 4, 6, 8, 12, 16, ...)")  # fmt: skip


def torch_options(args: argparse.Namespace, path: str, checkpoint: bool) -> dict:
    """TorchEngine keywords from --precision / --optimize / --cuda-graphs for the artifact at `path`: a `checkpoint`
    takes them, an exported artifact refuses them."""
    precision, optimized, graphs = (getattr(args, k, None) for k in ("torch_precision", "optimize", "cuda_graphs"))
    given = [flag for flag, v in (("--precision", precision), ("--optimize", optimized), ("--cuda-graphs", graphs)) if v]
    if not given:
        return {}
    if not checkpoint:
        raise InputError(f"{' / '.join(given)} set how PyTorch runs a checkpoint; {path} is an exported artifact whose "
                         "precision and runtime its export fixed: drop them (or export again at another --precision)")  # fmt: skip
    if graphs and not optimized:
        raise InputError("--cuda-graphs replays the optimized model's forward: add --optimize")
    return {"dtype": TORCH_DTYPES[precision or "fp32"], "optimized": bool(optimized), "cuda_graphs": bool(graphs)}


def add_loading_args(p: argparse.ArgumentParser) -> None:
    """--batch-size and --workers, for commands that run an artifact over image files."""
    p.add_argument("--batch-size", type=positive_int, default=32, help="images per call of the artifact (default 32)")
    p.add_argument("--workers", type=positive_int, help="threads that decode and resize the images ahead of the model "
                   "(default: this process's CPUs, at most 8)")  # fmt: skip


# ---------------------------------------------------------------------------- check
def cmd_check(args: argparse.Namespace) -> int:
    backend, other_backend = args.backend, "auto"
    if args.mark_all and args.against and all(is_onnx_artifact(p) for p in (args.artifact, args.against)):
        # marked intermediate outputs are an ONNX Runtime session feature: there, auto means ONNX Runtime
        backend, other_backend = "onnxruntime" if backend == "auto" else backend, "onnxruntime"
    engine = load_artifact(args.artifact, args, backend=backend, architecture=bool(args.against))  # else the flags describe the reference
    if args.against:
        other = load_artifact(args.against, args, backend=other_backend, primary=False)
        with reporter("check", args.quiet) as progress:
            result = {"artifact": str(args.artifact), "against": str(args.against)} | pipeline.check_against(
                engine, other, samples=args.samples, data=args.data, atol=args.atol, rtol=args.rtol, mark_all=args.mark_all,
                progress=progress)  # fmt: skip
        return _print_check(result, args, f"{args.artifact} ({engine.kind}, {engine.precision}) vs {args.against} ({other.kind}, {other.precision})")
    if args.mark_all:
        raise InputError("--mark-all compares two ONNX graphs layer by layer: give the other one with --against OTHER.onnx")
    with reporter("check", args.quiet) as progress:
        result = pipeline.check_artifact(engine, args.artifact, checkpoint=args.checkpoint, data=args.data, samples=args.samples,
                                         overrides=config_overrides(args), atol=args.atol, rtol=args.rtol, progress=progress)  # fmt: skip
    return _print_check(result, args, f"{args.artifact} ({engine.kind}, {engine.precision}) vs fp32 reference")


def _print_check(result: dict, args: argparse.Namespace, title: str) -> int:
    if args.json:
        print(to_json(result))
        return 0 if result["passed"] else 1
    tol = result["tolerance"]
    verdict = "[green]PASSED[/green]" if result["passed"] else "[red]FAILED[/red]"
    out = console()
    out.print(f"{title} on {result['n']} images: {verdict}")
    numbers = Table.grid(padding=(0, 2))  # one metric per row: fits 80 columns, the limits wrap in their own column
    numbers.add_column(no_wrap=True)
    numbers.add_column(no_wrap=True, justify="right")
    numbers.add_column()
    numbers.add_row("  max_abs_err", f"{result['max_abs_err']:.3g}",
                    f"limit {tol['limit_abs_err']:.3g} = atol {tol['atol']:g} + rtol {tol['rtol']:g} x max|ref|")  # fmt: skip
    numbers.add_row("  max_rel_err", f"{result['max_rel_err']:.3g}", "")
    over = " (one over the batch: rows this narrow have no direction)" if result.get("cosine_over") == "batch" else ""
    numbers.add_row("  cosine", f"{result['cosine']:.6f}", f"limit {tol['cosine']}{over}")
    if result.get("classifies", True):  # the argmax of features or an image embedding is no prediction: its agreement says nothing
        numbers.add_row("  top-1 agreement", f"{result['top1_agreement']:.3f}", "")
    out.print(numbers)
    for other in result.get("other_sizes", []):  # a dynamic_img_size artifact, at other grids
        h, w = other["img_size"]
        out.print(f"  at {h}x{w} on {other['n']} images: {'passed' if other['passed'] else '[red]FAILED[/red]'} (max_abs_err "
                  f"{other['max_abs_err']:.3g}, limit {other['tolerance']['limit_abs_err']:.3g}; cosine {other['cosine']:.6f})")  # fmt: skip
    if "layers" in result:
        out.print(describe_layers(result["layers"]))
    return 0 if result["passed"] else 1


# ---------------------------------------------------------------------------- eval
def cmd_eval(args: argparse.Namespace) -> int:
    engine = load_artifact(args.artifact, args, labels=False, backend=args.backend)  # eval matches --labels to the folders itself
    against = load_artifact(args.against, args, labels=False, primary=False) if args.against else None
    labels, class_ids = read_label_file(args.labels) if args.labels else (None, None)
    with reporter("eval", args.quiet) as progress:
        result = pipeline.evaluate(engine, args.data, labels=labels, class_ids=class_ids, against=against, batch_size=args.batch_size,
                                   workers=args.workers, progress=progress)  # fmt: skip
    result["artifact"] = str(args.artifact)
    if against:
        result["against"]["artifact"] = str(args.against)
    if args.json:
        print(to_json(result))
        return 0
    k = result["k"]
    print(f"top-1 {100 * result['top1']:.2f}%  top-{k} {100 * result['top5']:.2f}% on {result['n']} images in "
          f"{result['classes']} classes ({result['backend']}, {result['precision']})")  # fmt: skip
    if args.against:  # short lines: an 80-column terminal shows each whole
        a = result["against"]
        print(f"  vs {args.against} ({a['backend']}, {a['precision']}):\n"
              f"    top-1 {100 * a['top1']:.2f}% ({100 * a['top1_diff']:+.2f} points), top-{k} {100 * a['top5']:.2f}% "
              f"({100 * a['top5_diff']:+.2f} points)\n"
              f"    same top-1 prediction on {100 * a['top1_agreement']:.2f}% of images")  # fmt: skip
    return 0


# ---------------------------------------------------------------------------- parsers
def add_parsers(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("export", parents=[common], help="export to ONNX / TensorRT (fp32, fp16, int8)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="registered model name (random weights, seed 0)")
    src.add_argument("--checkpoint", help="vitfast / timm / Hugging Face checkpoint")
    p.add_argument("--no-ema", action="store_true",
                   help="a training checkpoint holding EMA weights beside the trained ones (timm's train.py): export the "
                        "trained ones (default: the EMA, as timm loads it; check rebuilds the same)")  # fmt: skip
    src.add_argument("--onnx", metavar="GRAPH",
                     help="with --format trt: build the engine from this ONNX file or Optimum folder as it is, vitfast's or another "
                          "tool's (e.g. ModelOpt's int8 / fp8 Q/DQ graph; its preprocessing from --config or --mean/--std)")  # fmt: skip
    p.add_argument("--format", required=True, choices=["onnx", "trt", "triton-repo"])
    p.add_argument("--precision", default="fp32", choices=EXPORT_PRECISIONS,
                   help="fp8 (and int8 without --calib-dir): from a Q/DQ graph given with --onnx")
    p.add_argument("--calib-dir", help="calibration images (searched recursively) for int8")
    p.add_argument("--calib-method", choices=["minmax", "entropy", "percentile"], help=f"int8 calibration method (default {DEFAULTS['calib_method']})")
    p.add_argument("--calib-samples", type=positive_int, help=f"calibration images to use (default {DEFAULTS['calib_samples']})")
    p.add_argument("--int8-target", choices=["tensorrt", "openvino", "cpu"],
                   help="QDQ form: TensorRT's symmetric int8 (default), the same with q/k/v split (fastest in OpenVINO, slower in ONNX Runtime), "
                        "or ONNX Runtime CPU's uint8 activations")  # fmt: skip
    p.add_argument("--exclude", nargs="*", help="nodes kept in float (per-layer fallback), by ONNX node name or by the module path "
                                                "they came from, shell-style patterns (e.g. 'patch_embed.backbone.*' 'blocks.11.mlp.fc2')")  # fmt: skip
    p.add_argument("--int8-keep-float", type=int_in(0), default=0, metavar="N",
                   help="also keep the N quantized layers in float whose int8 error is largest, measured one layer at a time on "
                        "calibration images (ranking in the sidecar)")  # fmt: skip
    p.add_argument("--batch", default="1:8:32", help="MIN:OPT:MAX batch profile (default 1:8:32)")
    p.add_argument("--img-size", type=positive_int, help="export at this resolution (position embeddings resized)")
    p.add_argument("--opset", type=positive_int, default=18, help="ONNX opset (default 18; 17 is the oldest with LayerNormalization)")
    p.add_argument("--workspace", type=positive_float, help=f"TensorRT workspace limit in GiB (default {DEFAULTS['workspace']:g})")
    p.add_argument("--opt-level", type=int_in(0, 5), help=f"TensorRT builder optimization level 0-5 (default {DEFAULTS['opt_level']})")
    p.add_argument("--timing-cache", help="TensorRT timing cache file, reused across builds")
    p.add_argument("--no-fp32-layernorm", action="store_true", help="let TensorRT pick the precision of the norm layers: LayerNorm's input and output may become fp16 (its statistics "
                        "stay fp32), RMSNorm's ops too (its x^2 overflows fp16 past |x| 256)")
    p.add_argument("--image-sizes", metavar="MIN:OPT:MAX",
                   help="with --dynamic-img-size: the image sizes the TensorRT engine takes, each N or HxW in whole patches "
                        "(default: half to twice --img-size, optimised for it)")  # fmt: skip
    p.add_argument("--out", required=True,
                   help="output file (.onnx; .engine / .plan / .trt for trt: only the engine is kept, its ONNX is built in the "
                        "staging folder; without TensorRT the ONNX is written beside it, NAME.onnx, for trtexec) or folder (triton-repo)")  # fmt: skip
    p.add_argument("--force", action="store_true",
                   help="overwrite an existing --out (only --out: never the checkpoint or graph exported, nor another file; "
                        "without TensorRT, --format trt also makes again a vitfast export at NAME.onnx)")  # fmt: skip
    add_quiet(p, "nothing but errors (no progress, no summary line)")
    add_config_args(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("check", parents=[common], help="parity of an artifact vs the fp32 reference, or vs another artifact")
    p.add_argument("artifact", help="checkpoint, .onnx file (vitfast's or another tool's), Optimum folder or TensorRT engine")
    ref = p.add_mutually_exclusive_group()
    ref.add_argument("--checkpoint", help="fp32 weights to compare with (default: the artifact's recorded source)")
    ref.add_argument("--against", metavar="OTHER", help="compare with any other artifact on the same images")
    p.add_argument("--atol", type=non_negative_float, help="absolute tolerance on the logits (default 0)")
    p.add_argument("--rtol", type=non_negative_float, help="tolerance relative to max |reference logit| (default: per precision)")
    p.add_argument("--mark-all", action="store_true",
                   help="ONNX vs ONNX: compare every intermediate tensor and name the first layer out of tolerance")  # fmt: skip
    p.add_argument("--data", help="image folder to draw inputs from (default: seeded random images)")
    p.add_argument("--samples", type=positive_int, default=16, help="images to compare on (default 16)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_quiet(p)
    add_artifact_args(p)
    add_torch_args(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("eval", parents=[common], help="top-1 / top-5 accuracy on an image folder DIR/<class>/*")
    p.add_argument("artifact")
    p.add_argument("--data", required=True,
                   help="DIR/<class>/*.png|jpg: folders named by the model's labels, else in natural order (2 before 10) = class index")
    p.add_argument("--labels", metavar="FILE", help="class names (one per line, or a JSON list / {index: name}) to match folders by")
    p.add_argument("--against", metavar="REF", help="also evaluate REF (e.g. the fp32 checkpoint) and report the accuracy difference")
    add_loading_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_quiet(p)
    add_artifact_args(p, labels=False)  # eval has its own --labels
    add_torch_args(p)
    p.set_defaults(func=cmd_eval)
