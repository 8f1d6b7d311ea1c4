"""Where a small-batch forward's host time goes on a GPU: the kernels part's `host` section
(`benchmarks/gpu_proof.py --part kernels`), eager vs optimize() without CUDA graphs.

Why: the H200 run of 2026-11-27 on 465da19 timed ViT-B/16 optimize() at batch 64 at 9.2-9.4 ms without CUDA
graphs, 5.4-5.6 ms with them (the same kernels) and 5.5 ms on the commit before; eager's batch 1 read 3.0 to
5.7 ms in three calls on one machine. Nothing then measured host time. Per (backend, batch), after warm-up:

- enqueue_ms: host time of one forward started on an idle GPU (sync, then time model(x) alone). A forward's
  150-190 launches stay below CUDA's launch queue depth (about 1024), so it never waits for the GPU unless
  something in it synchronises: this is the Python and launch path's own cost.
- wall_ms: one forward, synchronised before and after; back_to_back_ms: forwards queued back to back for at
  least 0.3 s, one sync at the end, per forward (what the e2e rows' CUDA events time).
- sm_mhz: the SM clock nvidia-smi sampled every 50 ms during the back-to-back forwards (median, min): a GPU that
  a host-bound loop leaves idle between kernels may clock down, and every kernel then runs slower.
- syncs: what torch.cuda.set_sync_debug_mode("warn") reports during one forward (where: the Python line).
- api: CUDA runtime and driver calls per forward by host time (torch.profiler): launches, and any
  cudaStreamSynchronize, cudaMalloc, cudaMemcpy.
- python: the functions with the most own time in one forward (cProfile; its per-call cost inflates every
  Python frame alike, so read the order, not the microseconds).
Under --dry-run (CPU) the GPU-only columns are empty; the rest runs, so the plumbing is tested.
"""

from __future__ import annotations

import contextlib
import cProfile
import pstats
import re
import shutil
import statistics
import subprocess
import threading
import time
import warnings
from pathlib import Path

import torch

from vitfast.errors import describe_exception, first_line

BACKENDS = (("eager", None), ("optimize", {"mlp": "auto"}))
CUDA_API = re.compile(r"cu(da)?[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, cudaStreamSynchronize; not aten:: or cudnn
CLOCK_INTERVAL_MS = 50
BACK_TO_BACK_S = 0.3
REPEATS = 20


@contextlib.contextmanager
def sm_clock_samples(gpu: bool):
    """[(time.monotonic(), SM MHz), ...] filled in while the block runs: `nvidia-smi -lms` of the
    machine's first GPU (the proof's machines have one). Empty off a GPU or without nvidia-smi."""
    samples: list[tuple[float, float]] = []
    if not gpu or shutil.which("nvidia-smi") is None:
        yield samples
        return
    proc = subprocess.Popen(["nvidia-smi", "--id=0", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
                             f"--loop-ms={CLOCK_INTERVAL_MS}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip

    def read():
        for line in proc.stdout:
            with contextlib.suppress(ValueError):
                samples.append((time.monotonic(), float(line.strip())))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield samples
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        reader.join(timeout=2)


def _sync(gpu: bool) -> None:
    if gpu:
        torch.cuda.synchronize()


def timings(model, x, gpu: bool, clocks: list, repeats: int) -> dict:
    """enqueue_ms, wall_ms (medians of `repeats`), back_to_back_ms and the SM clock meanwhile."""
    enqueue, wall = [], []
    for _ in range(repeats):
        _sync(gpu)
        t0 = time.perf_counter()
        model(x)
        t1 = time.perf_counter()
        _sync(gpu)
        enqueue.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
    _sync(gpu)
    n, start = 0, time.monotonic()
    while n < repeats or time.monotonic() - start < BACK_TO_BACK_S:
        model(x)
        n += 1
    _sync(gpu)
    end = time.monotonic()
    mhz = [m for t, m in clocks if start <= t <= end]
    return {"enqueue_ms": 1e3 * statistics.median(enqueue), "wall_ms": 1e3 * statistics.median(wall),
            "back_to_back_ms": 1e3 * (end - start) / n, "forwards": n,
            "sm_mhz_median": statistics.median(mhz) if mhz else None, "sm_mhz_min": min(mhz) if mhz else None}  # fmt: skip


def sync_sites(model, x) -> list[str]:
    """Each synchronising call torch reports during one forward, as 'file:line: message'."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            model(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{Path(w.filename).name}:{w.lineno}: {first_line(str(w.message))}" for w in caught]


def api_calls(model, x, gpu: bool, forwards: int = 3, top: int = 8) -> list[dict]:
    """CUDA runtime / driver calls per forward, the most host time first (torch.profiler)."""
    if not gpu:
        return []
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            model(x)
        _sync(gpu)
    rows = [{"call": e.key, "per_forward": e.count / forwards, "us": e.self_cpu_time_total / forwards}
            for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU and CUDA_API.match(e.key)]  # fmt: skip
    return sorted(rows, key=lambda r: -r["us"])[:top]


def python_hotspots(model, x, gpu: bool, forwards: int = 3, top: int = 8) -> list[dict]:
    """The Python functions with the most own time per forward (cProfile)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(forwards):
        model(x)
    _sync(gpu)
    prof.disable()
    rows = [{"function": f"{Path(file).name}:{line}({name})", "calls": calls / forwards, "own_us": 1e6 * own / forwards,
             "cumulative_us": 1e6 * cumulative / forwards}
            for (file, line, name), (_, calls, own, cumulative, _) in pstats.Stats(prof).stats.items()]  # fmt: skip
    return sorted(rows, key=lambda r: -r["own_us"])[:top]


def host_row(model, x, gpu: bool, clocks: list, repeats: int) -> dict:
    for _ in range(3):  # autotuning and compiles stay out
        model(x)
    row = {"status": "ok"} | timings(model, x, gpu, clocks, repeats)
    row["syncs"] = sync_sites(model, x) if gpu else None  # torch's sync debug mode is CUDA's
    row["api"] = api_calls(model, x, gpu)
    row["python"] = python_hotspots(model, x, gpu)
    return row


def host_profile(name: str, overrides: dict, dtype: torch.dtype, device: str, batches, deadline: float, repeats: int = REPEATS) -> dict:
    """Rows per (backend, batch) of one model (see the module docstring); a row that cannot start
    before `deadline` says so, one that fails records why. `repeats`: forwards per median (fewer under --dry-run)."""
    import vitfast

    gpu = device == "cuda"
    cfg = vitfast.get_config(name, **overrides)
    with torch.device(device):
        model = vitfast.create_model(cfg).to(dtype=dtype).eval()
    result = {"model": name, "overrides": overrides, "dtype": str(dtype).removeprefix("torch."), "rows": []}
    with sm_clock_samples(gpu) as clocks, torch.no_grad():
        for label, options in BACKENDS:
            if options:
                vitfast.optimize(model, **options)
            for batch in batches:
                row = {"backend": label, "batch": batch}
                if time.monotonic() > deadline:
                    row |= {"status": "not reached", "reason": "the part's time box ran out before this row"}
                else:
                    x = torch.randn(batch, cfg.in_chans, *cfg.img_hw, device=device, dtype=dtype)
                    try:
                        row |= host_row(model, x, gpu, clocks, repeats)
                    except Exception as exc:
                        row |= {"status": "error", "reason": describe_exception(exc)}
                result["rows"].append(row)
            if options:
                vitfast.restore(model)
    result["clock_samples"] = len(clocks)
    return result


def host_markdown(host: dict | None, md_table) -> list[str]:
    """The host section: one table of timings, then per row its syncs, CUDA calls and Python hotspots."""
    if not host:
        return []
    lines = ["", f"## Host time of one forward ({host['model']}, {host['dtype']}, no CUDA graphs; gpu_host.py)", "",
             "enqueue: host time of one forward from an idle GPU; wall: one forward synchronised; back_to_back: "
             "forwards queued back to back (as the e2e rows run); sm_mhz: nvidia-smi's SM clock meanwhile.", ""]  # fmt: skip
    lines += md_table(host["rows"], ["backend", "batch", "status", "enqueue_ms", "wall_ms", "back_to_back_ms", "forwards",
                                     "sm_mhz_median", "sm_mhz_min", "reason"])  # fmt: skip
    for row in (r for r in host["rows"] if r.get("status") == "ok"):
        syncs = ("not checked (off a GPU)" if row["syncs"] is None else "; ".join(f"`{s}`" for s in row["syncs"][:5])
                 or "none reported by torch's sync debug mode")  # fmt: skip
        lines += ["", f"{row['backend']}, batch {row['batch']}: synchronising calls: {syncs}"]
        if row["api"]:
            lines += [""] + md_table(row["api"], ["call", "per_forward", "us"])
        lines += [""] + md_table(row["python"], ["function", "calls", "own_us", "cumulative_us"])
    return lines
