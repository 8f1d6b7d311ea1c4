"""CPU runtimes side by side (issue 15): ONNX Runtime and OpenVINO on vitfast's fp32 and int8 ONNX
files (every --int8-target), ONNX Runtime's `quantize_dynamic`, and NNCF's post-training
quantization run in OpenVINO (what an OpenVINO user does by default), for several models and batch
sizes, in one run. `vs_nncf`: an OpenVINO int8 row against NNCF's file under the same hint. `auto`:
the row `load_engine(path)` (backend "auto", threads only) runs for the fp32 and the
--int8-target openvino file, with its properties and reason in the JSON's environment.

    python benchmarks/cpu_runtimes.py --out benchmarks/results/cpu-runtimes-<sha>.json
    python benchmarks/cpu_runtimes.py --dry-run      # tiny model, 2 calls per row: every path runs, figures meaningless

Random weights (seed 0) and random-pixel calibration images: speed does not depend on the
values; int8 accuracy is measured on real images in tests/test_export_real_data.py. Every row of
one (model, batch) is timed in turn inside each repeat (interleaved, so drift in the machine's
load hits all rows alike), perf_counter_ns around each call after warm-up, inputs rotated among
3 buffers; the figure is the median. The load average is recorded at start and end: on a shared
machine the figures are only as good as the quiet they were taken in.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

import vitfast
from vitfast.bench.measure import cpu_model, git_state
from vitfast.export import quantize_int8, to_onnx
from vitfast.atomic import atomic_write_text
from vitfast.export.artifacts import read_sidecar, write_sidecar
from vitfast.data import random_images
from vitfast.info import collect
from vitfast.runtime.openvino_engine import OpenVinoEngine
from vitfast.runtime import OnnxEngine

MODELS = "vit_tiny_patch16_224,vit_small_patch16_224,vit_base_patch16_224"
BASELINE = "onnxruntime fp32"
DYNAMIC = "onnxruntime int8 quantize_dynamic"


def build_artifacts(name: str, work: Path, calib_samples: int, img_size: int | None) -> tuple[dict[str, Path], dict[str, str]]:
    """fp32 ONNX, vitfast int8 in every target's form, ORT quantize_dynamic, NNCF int8 (OpenVINO IR);
    and {row: why} for a baseline another tool failed to make (ONNX Runtime 1.30's quantize_dynamic
    fails its own shape inference on this graph), which is then reported, not measured."""
    import nncf
    import openvino as ov
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(0)
    model = vitfast.create_model(name, **({"img_size": img_size} if img_size else {}))
    fp32 = to_onnx(model, work / "fp32.onnx", batch=(1, 8, 64))
    calib = random_images(model.config, calib_samples, seed=0)
    paths = {"fp32": fp32}
    for target in ("cpu", "tensorrt", "openvino"):
        paths[f"int8-{target}"] = quantize_int8(fp32, work / f"int8-{target}.onnx", calib, samples=calib_samples, target=target, progress=False)
    not_measured = {}
    try:
        quantize_dynamic(str(fp32), str(work / "dynamic.onnx"), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
        paths["dynamic"] = work / "dynamic.onnx"
    except Exception as exc:  # noqa: BLE001 - another tool's baseline: its failure is reported, vitfast's rows still run
        not_measured[DYNAMIC] = f"quantize_dynamic failed: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1][:200]}"
    dataset = nncf.Dataset([calib[i : i + 1].numpy() for i in range(calib_samples)])
    quantized = nncf.quantize(ov.Core().read_model(str(fp32)), dataset, model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=calib_samples)  # fmt: skip
    paths["nncf"] = work / "nncf.xml"
    ov.save_model(quantized, str(paths["nncf"]))
    meta = read_sidecar(fp32) | {"precision": "int8"}
    if "dynamic" in paths:
        write_sidecar(paths["dynamic"], meta | {"int8": {"tool": "onnxruntime quantize_dynamic"}})  # engines read the config there
    write_sidecar(paths["nncf"], meta | {"int8": {"tool": "nncf"}}, companions=[paths["nncf"].with_suffix(".bin")])
    return paths, not_measured


def runtimes(paths: dict[str, Path], threads: int) -> dict[str, Callable]:
    """Row name -> engine. OpenVINO rows under both hints; NNCF gets the same runtime settings as vitfast's files."""
    rows = {
        BASELINE: OnnxEngine(paths["fp32"], threads=threads),
        "onnxruntime int8 vitfast QDQ (cpu target)": OnnxEngine(paths["int8-cpu"], threads=threads),
        "onnxruntime int8 vitfast QDQ (tensorrt target)": OnnxEngine(paths["int8-tensorrt"], threads=threads),
        "onnxruntime int8 vitfast QDQ (openvino target)": OnnxEngine(paths["int8-openvino"], threads=threads),
        "openvino fp32": OpenVinoEngine(paths["fp32"], threads=threads),
    }
    if "dynamic" in paths:
        rows[DYNAMIC] = OnnxEngine(paths["dynamic"], threads=threads)
    for hint in ("latency", "throughput"):
        for target in ("tensorrt", "openvino"):
            rows[f"openvino int8 vitfast QDQ ({target} target, {hint})"] = OpenVinoEngine(paths[f"int8-{target}"], threads=threads, hint=hint)
        rows[f"openvino int8 NNCF ({hint})"] = OpenVinoEngine(paths["nncf"], threads=threads, hint=hint)
    return rows


def auto_choices(paths: dict[str, Path], threads: int, rows: dict[str, Callable]) -> dict[str, dict]:
    """What `load_engine(path, threads=...)` picks for the fp32 and the --int8-target openvino file,
    and which measured row runs the same backend, file and settings (None if none does)."""
    out = {}
    for artifact in ("fp32", "int8-openvino"):
        engine = vitfast.load_engine(paths[artifact], threads=threads)
        props = engine.compiled_properties() if isinstance(engine, OpenVinoEngine) else None
        same = [name for name, other in rows.items() if type(other) is type(engine) and other.path == engine.path
                and (props is None or other.compiled_properties() == props)]  # fmt: skip
        out[artifact] = {"backend": engine.kind, "why": engine.backend_choice, "properties": props, "row": same[0] if same else None}
    return out


def measure(engines: dict[str, Callable], inputs: list[torch.Tensor], repeats: int, warmup: int) -> dict[str, list[float]]:
    """Interleaved: each repeat calls every engine once, in turn. Milliseconds per call."""
    for engine in engines.values():
        for i in range(warmup):
            engine(inputs[i % len(inputs)])
    times: dict[str, list[float]] = {name: [] for name in engines}
    for i in range(repeats):
        for name, engine in engines.items():
            start = time.perf_counter_ns()
            engine(inputs[i % len(inputs)])
            times[name].append((time.perf_counter_ns() - start) / 1e6)
    return times


def rows_for(model: str, batch: int, times: dict[str, list[float]], auto: dict[str, dict]) -> list[dict]:
    base = statistics.median(times[BASELINE])
    auto_rows = {choice["row"]: artifact for artifact, choice in auto.items()}
    rows = []
    for name, samples in times.items():
        ms = statistics.median(samples)
        half = len(samples) // 2  # first vs second half: how much the figure moved during the run
        spread = abs(statistics.median(samples[:half]) - statistics.median(samples[half:])) / ms if half else 0.0
        hint = name.rsplit(", ", 1)[-1].rstrip(")") if name.startswith("openvino int8 vitfast") else None
        nncf = statistics.median(times[f"openvino int8 NNCF ({hint})"]) if hint else None
        rows.append({"model": model, "batch": batch, "runtime": name, "median_ms": round(ms, 3),
                     "images_per_s": round(batch * 1e3 / ms, 2), "vs_ort_fp32": round(base / ms, 3),
                     "vs_nncf": round(nncf / ms, 3) if nncf else "", "auto": auto_rows.get(name, ""),
                     "half_spread": round(spread, 3), "samples_ms": [round(t, 3) for t in samples]})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS, help=f"comma-separated registered names (default {MODELS})")
    parser.add_argument("--batch", default="1,8", help="batch sizes, comma-separated (default 1,8)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every runtime (default 2)")
    parser.add_argument("--repeats", type=int, default=10, help="interleaved timed calls per row (default 10)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calib-samples", type=int, default=32)
    parser.add_argument("--out", help="result JSON (written whole or not at all)")
    parser.add_argument("--dry-run", action="store_true", help="a tiny model at 32 px, 2 calls per row: checks every path, not speed")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.models, args.batch, args.repeats, args.warmup, args.calib_samples = "vit_tiny_patch16_224", "1,2", 2, 1, 4
    batches = [int(b) for b in args.batch.split(",")]
    torch.set_num_threads(args.threads)
    started, load_start = time.time(), list(os.getloadavg())
    rows, auto, not_measured = [], {}, {}
    for name in args.models.split(","):
        work = Path(tempfile.mkdtemp(prefix="vitfast-cpu-runtimes-"))
        try:
            paths, not_measured[name] = build_artifacts(name, work, args.calib_samples, 32 if args.dry_run else None)
            for row, why in not_measured[name].items():
                print(f"{name}: {row} not measured: {why}", file=sys.stderr)
            engines = runtimes(paths, args.threads)
            auto[name] = auto_choices(paths, args.threads, engines)
            config = engines[BASELINE].config
            for batch in batches:
                inputs = [torch.randn(batch, 3, *config.img_hw) for _ in range(3)]
                rows += rows_for(name, batch, measure(engines, inputs, args.repeats, args.warmup), auto[name])
                print_rows([r for r in rows if r["model"] == name and r["batch"] == batch])
        finally:
            shutil.rmtree(work, ignore_errors=True)
    env = collect()
    env |= {
        "command": " ".join(["python", "benchmarks/cpu_runtimes.py", *(argv if argv is not None else sys.argv[1:])]),
        "git_sha": git_state()["sha"], "git": git_state(), "cpu": cpu_model(), "logical_cpus": os.cpu_count(),
        "threads": args.threads, "repeats": args.repeats, "loadavg_start": load_start, "loadavg_end": list(os.getloadavg()),
        "elapsed_s": round(time.time() - started, 1), "dry_run": args.dry_run, "auto": auto,
        "not_measured": {model: rows for model, rows in not_measured.items() if rows},
    }  # fmt: skip
    print(f"load average {load_start[0]:.1f} at start, {env['loadavg_end'][0]:.1f} at end on {os.cpu_count()} CPUs; "
          f"{env['elapsed_s'] / 60:.1f} min", file=sys.stderr)  # fmt: skip
    if args.out:
        atomic_write_text(args.out, json.dumps({"rows": rows, "environment": env}, indent=1))
    return 0


def print_rows(rows: list[dict]) -> None:
    print(f"\n{rows[0]['model']}, batch {rows[0]['batch']}")
    print(f"| {'runtime':<56} | {'img/s':>7} | {'ms':>7} | vs ORT fp32 | vs NNCF | auto |")
    print(f"|{'-' * 58}|{'-' * 9}|{'-' * 9}|-------------|---------|------|")
    for r in rows:
        nncf = f"{r['vs_nncf']:6.2f}x" if r["vs_nncf"] else ""
        print(f"| {r['runtime']:<56} | {r['images_per_s']:7.1f} | {r['median_ms']:7.1f} | {r['vs_ort_fp32']:10.2f}x | {nncf:>7} | "
              f"{'yes' if r['auto'] else '':>4} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
