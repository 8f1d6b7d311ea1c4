"""The sweep: models x image sizes x backends x precisions x batch sizes -> one result dict.

Per backend: build it once (export, engine load, weights), then per batch size: first call
(compilation, autotuning, graph capture), warm-up calls, then two back-to-back repeats of timed
calls. Both repeats' samples make the percentiles; the gap between their medians is the row's
noise (`spread`). The device's matmul rate is measured before and after the sweep, so every row
can say what fraction of the measured peak it reached.
"""

from __future__ import annotations

import json
import os
import shlex
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from vitfast.config import ViTConfig
from vitfast.errors import ArtifactError, BackendUnavailable, InputError, describe_exception
from vitfast.flops import count_macs
from vitfast.precision import TORCH_DTYPES
from vitfast.registry import get_config
from vitfast.runtime import ENGINE_SUFFIXES

from .backends import (
    BackendOptions, Platform, Runner, artifact_runner, build_runner, detect_platform, is_onnx_artifact, prepare, seeded_model,
    skip_reason, user_cache_dir,
)
from .measure import MemoryProbe, environment, matmul_peak, peak_tflops, random_inputs, release_memory, time_calls
from .stats import backend_label, summarize

SCHEMA = "vitfast.bench/1"
REPEATS = 2  # two back-to-back repeats per row: their spread is the noise shown beside the figure
STAT_FIELDS = ("n", "median_ms", "mean_ms", "std_ms", "min_ms", "max_ms", "p50_ms", "p95_ms", "p99_ms",
               "repeat_medians_ms", "spread", "images_per_s", "tflops")  # fmt: skip
ROW_FIELDS = ("model", "img_size", "backend", "precision", "batch", "status", "reason", "runs_on", "timer",
              "gmacs_per_image", "gflops_per_image", "prepare_s", "load_s", "first_call_s", "warmup_s", "samples_ms",
              *STAT_FIELDS, "pct_of_peak", "peak_memory_mib", "memory_method", "details", "loadavg")  # fmt: skip


@dataclass
class Settings:
    """What one sweep measures and how long it may take per row."""

    models: list[str | ViTConfig]  # registry models, measured on every backend
    backends: list[str]
    batches: list[int]
    precisions: list[str]
    img_sizes: list[int | None] = field(default_factory=lambda: [None])  # None: the model's own
    repeats: int = 30  # timed calls in each of the REPEATS repeats
    warmup: int = 5  # untimed calls after the first one
    max_seconds: float = 20.0  # a repeat stops early (after MIN_ITERS calls) past this much time
    buffers: int = 4  # input batches rotated through
    options: BackendOptions = field(default_factory=BackendOptions)
    debug: bool = False
    artifacts: list[str] = field(default_factory=list)  # the user's own files, each measured as it is

    def __post_init__(self):
        resolved = [os.path.realpath(a) for a in self.artifacts]
        twice = sorted({a for a, r in zip(self.artifacts, resolved) if resolved.count(r) > 1})
        if twice:  # its rows would be measured twice under one label
            raise InputError(f"--artifact {', '.join(twice)}: the same file given more than once; give each artifact once")

    def configs(self) -> Iterator[ViTConfig]:
        for model in self.models:
            for size in self.img_sizes:
                base = get_config(model) if isinstance(model, str) else model
                yield base.replace(img_size=size) if size else base

    def command(self) -> str:
        """The `vitfast bench` command line that repeats this sweep, every default spelled out (paths quoted for
        a shell; the work dir only when not the user's cache, which differs per machine)."""
        names = [m if isinstance(m, str) else (m.name or "custom-config") for m in self.models]
        o = self.options
        parts = ["vitfast bench"] + ([f"--model {','.join(names)}"] if names else [])
        parts += [f"--artifact {shlex.quote(a)}" for a in self.artifacts]
        parts += [f"--backends {','.join(self.backends)}", f"--batch {','.join(map(str, self.batches))}",
                  f"--precision {','.join(self.precisions)}"]  # fmt: skip
        if self.img_sizes != [None]:
            parts.append(f"--img-size {','.join(map(str, self.img_sizes))}")
        parts += [f"--repeats {self.repeats}", f"--warmup {self.warmup}", f"--max-seconds {self.max_seconds:g}",
                  f"--buffers {self.buffers}", f"--compile-mode {o.compile_mode}", f"--ort-provider {o.ort_provider}",
                  f"--calib-samples {o.calib_samples}"]  # fmt: skip
        parts += [f"--calib-dir {shlex.quote(o.calib_dir)}"] if o.calib_dir else []
        parts += [f"--threads {o.threads}"] if o.threads else []
        parts += [f"--ov-hint {o.ov_hint}"] if o.ov_hint else []  # unset: OpenVINO's own default, which no value names
        parts += [f"--work-dir {shlex.quote(str(o.work_dir))}"] if Path(o.work_dir) != user_cache_dir() / "bench" else []
        parts += [f"--engine {shlex.quote(e)}" for e in o.engines]
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["models"] = [m if isinstance(m, str) else m.to_dict() for m in self.models]
        d["options"]["work_dir"] = str(self.options.work_dir)
        d["repeats_per_row"] = REPEATS
        return d


def run_sweep(settings: Settings, *, command: str | None = None, on_row: Callable[[dict], None] | None = None,
              on_start: Callable[[str], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Measure every combination; returns the result dict (`SCHEMA`). `on_start(label)` and
    `on_row(row)` report progress; rows come out in sweep order, skipped and failed ones included."""
    if settings.options.threads:
        torch.set_num_threads(settings.options.threads)
    engines_given = any(Path(a).suffix.lower() in ENGINE_SUFFIXES for a in settings.artifacts)
    platform = detect_platform(settings.backends + (["tensorrt"] if engines_given else []))
    env = environment(command or settings.command(), settings.options.threads)
    started = time.perf_counter()
    peaks = [matmul_peak(platform.device)]
    warm_up_process(settings, platform.device)
    rows = []
    # torch.compile's rows: each batch size is one more compiled entry of the model's forward, and past Dynamo's
    # recompile limit (8) the forward runs eagerly without an error. The limit covers the batch sizes here (each
    # compiled backend starts from a reset cache) and hitting it fails the row, so no eager time is labelled compiled.
    with torch._dynamo.config.patch(recompile_limit=max(8, 2 * len(settings.batches)), fail_on_recompile_limit_hit=True):
        for config in settings.configs():
            for backend in settings.backends:
                for precision in settings.precisions:
                    rows += _measure_backend(backend, precision, config, settings, platform, on_row or (lambda r: None), on_start)
    for artifact, label in zip(settings.artifacts, artifact_labels(settings.artifacts)):
        rows += _measure_artifact(Path(artifact), label, settings, platform, on_row or (lambda r: None), on_start)
    peaks.append(matmul_peak(platform.device))
    peak = peak_tflops(peaks)
    for row in rows:
        row["pct_of_peak"] = 100 * row["tflops"] / peak if row["status"] == "ok" and row["tflops"] is not None else None
    env["cpu"]["loadavg_end"] = list(os.getloadavg())
    first = peaks[0]
    return {
        "schema": SCHEMA,
        "environment": env,
        "settings": settings.to_dict(),
        "peak": {"tflops": peak, "device": first["device"], "dtype": first["dtype"], "size": first["size"],
                 "note": "median of every matmul sample, taken before and after the sweep", "measurements": peaks},  # fmt: skip
        "rows": rows,
        "elapsed_s": time.perf_counter() - started,
    }


def warm_up_process(settings: Settings, device: torch.device) -> None:
    """One throwaway eager forward before the first backend's memory baseline. A process's first forward makes
    one-time allocations (the CPU kernels' thread pools and scratch buffers, the GPU's cuBLAS workspace) that stay
    for every later backend: without it they landed in the first backend's peak (ViT-S at 64 px, batch 4 on a CPU:
    eager 104 MiB measured first, eager-math 89 MiB after it, and the other way round in the other order). The first model at the smallest batch size,
    in the first PyTorch precision; a sweep of artifacts alone warms up with a ViT-Ti/16."""
    config = next(settings.configs(), None) or get_config("vit_tiny_patch16_224")
    dtype = next((TORCH_DTYPES[p] for p in settings.precisions if p in TORCH_DTYPES), torch.float32)
    model = seeded_model(config).to(device, dtype).eval()
    with torch.inference_mode():
        model(random_inputs(min(settings.batches), config, dtype, device, 1)[0])
    del model
    release_memory(device)


def base_row(config: ViTConfig | None, backend: str, precision: str, batch: int, *, model: str | None = None,
             architecture_known: bool = True) -> dict[str, Any]:  # fmt: skip
    """A row with every field present (None until measured) and the model's FLOPs from its config
    (none for a graph whose architecture is unknown, e.g. another tool's ONNX)."""
    macs = count_macs(config) if config is not None and architecture_known else None
    row = dict.fromkeys(ROW_FIELDS)
    row |= {"model": model or config.name or "custom", "img_size": config.img_hw[0] if config else None, "backend": backend,
            "precision": precision, "batch": batch, "details": {},
            "gmacs_per_image": macs / 1e9 if macs else None, "gflops_per_image": 2 * macs / 1e9 if macs else None}  # fmt: skip
    return row


def _measure_backend(backend, precision, config, settings: Settings, platform: Platform, on_row, on_start) -> list[dict]:
    """Rows of one backend at one precision for every batch size (skipped / failed rows included)."""
    rows = [base_row(config, backend_label(backend, settings.options.compile_mode), precision, b) for b in settings.batches]
    label = f"{config.name} {config.img_hw[0]}px {rows[0]['backend']} {precision}"
    try:
        reason = skip_reason(backend, precision, platform, settings.options, config)
    except Exception as exc:  # a surprise in the checks fails this backend's rows, not the sweep and the rows measured before
        return _finish([r | _error(exc, settings.debug) for r in rows], on_row)
    if reason:
        return _finish([r | {"status": "skipped", "reason": reason} for r in rows], on_row)
    if on_start:
        on_start(f"{label}: building")
    probe = MemoryProbe(platform.device if backend not in ("onnxruntime", "openvino") else torch.device("cpu"))
    try:
        t0 = time.perf_counter()
        artifact, reused = prepare(backend, precision, config, settings.options)
        prepare_s = time.perf_counter() - t0
        probe.baseline()
        t0 = time.perf_counter()
        runner = build_runner(backend, precision, config, platform, settings.options, artifact)
        load_s = time.perf_counter() - t0
    except Exception as exc:  # a backend that fails to build is a row with the error, not a crash
        return _finish([r | _error(exc, settings.debug) for r in rows], on_row)
    if artifact:
        runner.details["artifact_reused"] = reused
    done = _measure_rows(runner, rows, config, label, settings, probe, prepare_s, load_s, on_row, on_start)
    del runner
    release_memory(platform.device)
    return done


def artifact_labels(paths: list[str]) -> list[str]:
    """Each artifact's row label (its `model`): the file name, or as many of its last path parts as tell it
    from the others (Optimum and Hub exports are all model.onnx), so rows and --compare keep them apart."""
    parts = [Path(p).parts for p in paths]
    labels = []
    for i, mine in enumerate(parts):
        n = next((n for n in range(1, len(mine)) if all(other[-n:] != mine[-n:] for j, other in enumerate(parts) if j != i)), len(mine))
        labels.append(Path(*mine[-n:]).as_posix())
    return labels


def _measure_artifact(path: Path, label: str, settings: Settings, platform: Platform, on_row, on_start) -> list[dict]:
    """Rows of one user artifact (`--artifact`), as it is (its own precision), at every batch size."""
    if on_start:
        on_start(f"{label}: loading")
    probe = MemoryProbe(torch.device("cpu") if is_onnx_artifact(path) else platform.device)
    probe.baseline()
    try:
        t0 = time.perf_counter()
        runner = artifact_runner(path, platform, settings.options)
        load_s = time.perf_counter() - t0
    except Exception as exc:
        outcome = {"status": "skipped", "reason": str(exc)} if isinstance(exc, BackendUnavailable) else _error(exc, settings.debug)
        return _finish([base_row(None, "artifact", "?", b, model=label) | outcome for b in settings.batches], on_row)
    engine = runner.engine
    known = not engine.metadata.get("foreign")
    rows = [base_row(engine.config, engine.kind, engine.precision, b, model=label, architecture_known=known) for b in settings.batches]
    runner.details["artifact"] = str(path)
    done = _measure_rows(runner, rows, engine.config, label, settings, probe, 0.0, load_s, on_row, on_start)
    del runner, engine
    release_memory(platform.device)
    return done


def _measure_rows(runner: Runner, rows: list[dict], config: ViTConfig, label: str, settings: Settings, probe: MemoryProbe,
                  prepare_s: float, load_s: float, on_row, on_start) -> list[dict]:  # fmt: skip
    probe.outside_torch = runner.memory_outside_torch
    done = []
    for row in rows:
        if on_start:
            on_start(f"{label} batch {row['batch']}")
        row |= {"prepare_s": prepare_s, "load_s": load_s, "runs_on": runner.runs_on, "timer": runner.timer, "details": runner.details}
        try:
            row |= _measure_batch(runner, config, row["batch"], row["gflops_per_image"], settings, probe)
        except Exception as exc:
            row |= _error(exc, settings.debug)
        done += _finish([row], on_row)
    return done


def _measure_batch(runner: Runner, config: ViTConfig, batch: int, gflops: float, settings: Settings, probe: MemoryProbe) -> dict:
    if runner.batch_range and not runner.batch_range[0] <= batch <= runner.batch_range[1]:
        return {"status": "skipped", "reason": f"batch {batch} is outside the engine's profile {runner.details.get('profile')}"}
    inputs = random_inputs(batch, config, runner.input_dtype, runner.device, settings.buffers)
    if runner.prepare:
        inputs = [runner.prepare(x) for x in inputs]
    first = time_calls(runner.call, inputs, 1, 0.0, runner.device, "perf_counter_ns")  # compiles / captures for this shape
    t0 = time.perf_counter()
    time_calls(runner.call, inputs, settings.warmup, float("inf"), runner.device, runner.timer)
    warmup_s = time.perf_counter() - t0
    reset_ok = probe.reset_peak()
    load = list(os.getloadavg())
    samples = [time_calls(runner.call, inputs, settings.repeats, settings.max_seconds, runner.device, runner.timer)
               for _ in range(REPEATS)]  # fmt: skip
    peak, method = probe.read(reset_ok)
    return {
        "status": "ok", "first_call_s": first[0] / 1e3, "warmup_s": warmup_s, "samples_ms": samples,
        **summarize(samples, batch, gflops), "loadavg": load,
        "peak_memory_mib": peak / 2**20 if peak is not None else None, "memory_method": method,
    }  # fmt: skip


def _error(exc: BaseException, debug: bool) -> dict:
    if debug:
        traceback.print_exc()
    return {"status": "error", "reason": describe_exception(exc)}


def _finish(rows: list[dict], on_row) -> list[dict]:
    for row in rows:
        on_row(row)
    return rows


# ---------------------------------------------------------------------------- files
def validate_result(result: Any, source: str = "result") -> dict[str, Any]:
    """Check a result has this schema's shape; ArtifactError naming what is missing otherwise."""
    if not isinstance(result, dict) or result.get("schema") != SCHEMA:
        found = result.get("schema") if isinstance(result, dict) else type(result).__name__
        raise ArtifactError(f"{source} is not a `vitfast bench --out` file (schema {found!r}, expected {SCHEMA!r})")
    for key in ("environment", "settings", "peak", "rows"):
        if key not in result:
            raise ArtifactError(f"{source} has no {key!r}; it was cut short or edited by hand: rerun the sweep")
    for i, row in enumerate(result["rows"]):
        missing = [k for k in ROW_FIELDS if k not in row]
        if missing:
            raise ArtifactError(f"{source} row {i} lacks {missing}; rerun the sweep")
        if row["status"] not in ("ok", "skipped", "error") or (row["status"] != "ok" and not row["reason"]):
            raise ArtifactError(f"{source} row {i} has status {row['status']!r} without a reason")
    return result


def load_result(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate a `vitfast bench --out` JSON file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ArtifactError(f"no such file: {path}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"cannot read {path} as JSON: {exc}") from None
    return validate_result(data, str(path))
