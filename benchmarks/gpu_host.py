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
- sm_mhz: the SM clock nvidia-smi read during the back-to-back forwards (median, min; after 0.2 s of untimed
  ones): a GPU that a host-bound loop leaves idle between kernels may clock down, and every kernel then runs slower.
- syncs: what torch.cuda.set_sync_debug_mode("warn") reports during one forward (where: the Python line).
- api: CUDA runtime and driver calls per forward by host time (torch.profiler): launches, and any
  cudaStreamSynchronize, cudaMalloc, cudaMemcpy; dispatcher_ops: `vitfast::` ops per forward, 0 where
  optimize()'s blocks call their launchers straight, as meant in eager mode.
- python: the functions with the most own time in one forward (cProfile; its cost per call inflates functions
  of many cheap calls most: read the order, not the microseconds).
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

from gpu_kernels import NOT_REACHED, dtype_name
from vitfast.errors import describe_exception, first_line

# optimize() first: its batch-64 row is the open question; then approximate_gelu, twice as slow again at batch 1-64
# (H100 run of 4b0fe1f, H200 run of 465da19; not on the runs before them), cause not found
BACKENDS = (("optimize", {"mlp": "auto"}), ("optimize approximate_gelu", {"mlp": "auto", "approximate_gelu": True}), ("eager", None))
CUDA_API = re.compile(r"cu(da)?[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, cudaStreamSynchronize; not aten:: or cudnn
SM_CLOCK_QUERY = ("nvidia-smi", "--id=0", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits")
CLOCK_INTERVAL_S = 0.05
PRE_ROLL_S = 0.2  # untimed back-to-back forwards first: a GPU left idle by the synchronised ones clocks up again
BACK_TO_BACK_S = 0.5
REPEATS = 20
INPUTS = 4  # input buffers the timed forwards rotate among, as the e2e rows' (vitfast.bench.measure.random_inputs)


@contextlib.contextmanager
def sm_clock_samples(gpu: bool, interval_s: float = CLOCK_INTERVAL_S):
    """(samples, errors) filled in while the block runs: samples (time.monotonic(), SM MHz) of the machine's
    first GPU (the proof's machines have one), from one-shot nvidia-smi queries in a thread (a looping
    nvidia-smi writing to a pipe may buffer its lines, which would then arrive late and be timed wrong); a
    failing query stops the sampling and says why in `errors`. Both empty off a GPU."""
    samples: list[tuple[float, float]] = []
    errors: list[str] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                done = subprocess.run(SM_CLOCK_QUERY, capture_output=True, text=True, timeout=5)
                if done.returncode != 0:
                    errors.append(f"nvidia-smi exited {done.returncode}: {first_line(done.stderr or done.stdout)}")
                    return
                samples.append(((t0 + time.monotonic()) / 2, float(done.stdout.split()[0])))
            except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
                errors.append(f"nvidia-smi: {describe_exception(exc)}")
                return
            stop.wait(interval_s)

    thread = None
    if gpu and shutil.which(SM_CLOCK_QUERY[0]):
        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
    try:
        yield samples, errors
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=6)


def _sync(gpu: bool) -> None:
    if gpu:
        torch.cuda.synchronize()


def timings(model, xs: list, gpu: bool, clocks: list, repeats: int) -> dict:
    """enqueue_ms, wall_ms (medians of `repeats`), back_to_back_ms and the SM clock meanwhile; the
    inputs rotate among `xs`, as the e2e rows' do."""
    enqueue, wall = [], []
    for i in range(repeats):
        _sync(gpu)
        t0 = time.perf_counter()
        model(xs[i % len(xs)])
        t1 = time.perf_counter()
        _sync(gpu)
        enqueue.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
    start = time.monotonic()
    while time.monotonic() - start < PRE_ROLL_S:
        model(xs[0])
    _sync(gpu)
    n, start = 0, time.monotonic()
    while n < repeats or time.monotonic() - start < BACK_TO_BACK_S:
        model(xs[n % len(xs)])
        n += 1
    _sync(gpu)
    end = time.monotonic()
    mhz = [m for t, m in clocks if start <= t <= end]
    return {"enqueue_ms": 1e3 * statistics.median(enqueue), "wall_ms": 1e3 * statistics.median(wall),
            "back_to_back_ms": 1e3 * (end - start) / n, "forwards": n,
            "sm_mhz_median": statistics.median(mhz) if mhz else None, "sm_mhz_min": min(mhz) if mhz else None}  # fmt: skip


def sync_sites(model, x) -> list[str]:
    """Each synchronising call torch reports during one forward, as 'file:line: message' (other warnings
    raised meanwhile are left out)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            model(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{Path(w.filename).name}:{w.lineno}: {first_line(str(w.message))}" for w in caught if "synchroniz" in str(w.message)]


def profiled_calls(model, x, gpu: bool, forwards: int = 3, top: int = 8) -> tuple[list[dict], float]:
    """(CUDA runtime / driver calls per forward, the most host time first; `vitfast::` dispatcher ops per
    forward: 0 where optimize()'s blocks call the launchers straight, as meant in eager mode) from
    torch.profiler over `forwards` forwards, the GPU synchronised before, not inside (a sync of ours would
    read as one of the forward's)."""
    from torch.profiler import ProfilerActivity, profile

    _sync(gpu)
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu) as prof:
        for _ in range(forwards):
            model(x)
    averages = prof.key_averages()
    rows = [{"call": e.key, "per_forward": e.count / forwards, "us": e.self_cpu_time_total / forwards}
            for e in averages if e.device_type == torch.autograd.DeviceType.CPU and CUDA_API.match(e.key)]  # fmt: skip
    dispatcher_ops = sum(e.count for e in averages if e.key.startswith("vitfast::")) / forwards
    return sorted(rows, key=lambda r: -r["us"])[:top], dispatcher_ops


def python_hotspots(model, x, gpu: bool, forwards: int = 3, top: int = 8) -> list[dict]:
    """The Python functions with the most own time per forward (cProfile)."""
    _sync(gpu)
    prof = cProfile.Profile()
    prof.enable()
    try:
        for _ in range(forwards):
            model(x)
    finally:
        prof.disable()
    rows = [{"function": f"{Path(file).name}:{line}({name})", "calls": calls / forwards, "own_us": 1e6 * own / forwards,
             "cumulative_us": 1e6 * cumulative / forwards}
            for (file, line, name), (_, calls, own, cumulative, _) in pstats.Stats(prof).stats.items()]  # fmt: skip
    return sorted(rows, key=lambda r: -r["own_us"])[:top]


def host_row(model, xs: list, gpu: bool, clocks: list, repeats: int) -> dict:
    x = xs[0]
    for _ in range(3):  # autotuning and compiles stay out
        model(x)
    row = {"status": "ok"} | timings(model, xs, gpu, clocks, repeats)
    row["syncs"] = sync_sites(model, x) if gpu else None  # torch's sync debug mode is CUDA's
    row["api"], row["dispatcher_ops"] = profiled_calls(model, x, gpu)
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
    result = {"model": name, "overrides": overrides, "dtype": dtype_name(dtype), "rows": []}
    with sm_clock_samples(gpu) as (clocks, clock_errors), torch.inference_mode():  # as vitfast.bench runs a model
        for label, options in BACKENDS:
            if options:
                vitfast.optimize(model, **options)
            for batch in batches:
                row = {"backend": label, "batch": batch}
                if time.monotonic() > deadline:
                    row |= NOT_REACHED
                else:
                    xs = [torch.randn(batch, cfg.in_chans, *cfg.img_hw, device=device, dtype=dtype) for _ in range(INPUTS)]
                    try:
                        row |= host_row(model, xs, gpu, clocks, repeats)
                    except Exception as exc:
                        row |= {"status": "error", "reason": describe_exception(exc)}
                result["rows"].append(row)
            if options:
                vitfast.restore(model)
    result |= {"clock_samples": len(clocks), "clock_errors": clock_errors}
    return result


def host_markdown(host: dict | None, md_table) -> list[str]:
    """The host section: one table of timings, then per row its syncs, CUDA calls and Python hotspots."""
    if not host:
        return []
    lines = ["", f"## Host time of one forward ({host['model']}, {host['dtype']}, no CUDA graphs; gpu_host.py)", "",
             "enqueue: host time of one forward from an idle GPU; wall: one forward synchronised; back_to_back: "
             "forwards queued back to back (as the e2e rows run); sm_mhz: nvidia-smi's SM clock meanwhile "
             f"({host['clock_samples']} samples{'; ' + '; '.join(host['clock_errors']) if host['clock_errors'] else ''}); "
             "dispatcher_ops: vitfast:: ops per forward (0: launchers called straight).", ""]  # fmt: skip
    lines += md_table(host["rows"], ["backend", "batch", "status", "dispatcher_ops", "enqueue_ms", "wall_ms", "back_to_back_ms", "forwards",
                                     "sm_mhz_median", "sm_mhz_min", "reason"])  # fmt: skip
    for row in (r for r in host["rows"] if r.get("status") == "ok"):
        syncs = ("not checked (off a GPU)" if row["syncs"] is None else "; ".join(f"`{s}`" for s in row["syncs"][:5])
                 or "none reported by torch's sync debug mode")  # fmt: skip
        lines += ["", f"{row['backend']}, batch {row['batch']}: synchronising calls: {syncs}"]
        if row["api"]:
            lines += [""] + md_table(row["api"], ["call", "per_forward", "us"])
        lines += [""] + md_table(row["python"], ["function", "calls", "own_us", "cumulative_us"])
    return lines
