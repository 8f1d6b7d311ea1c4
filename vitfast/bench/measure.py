"""How a benchmark measures: timing loops, peak memory, the matmul ceiling and the environment.

- Timing: CUDA events around each call on a GPU (device time, the stream kept busy), a host
  `perf_counter_ns` pair on the CPU. Inputs rotate among several buffers so repeated calls do not
  time a warm cache on one tensor. Warm-up runs happen before, outside the timings, and so do an
  engine's input checks (`Runner.prepare`, once per buffer).
- Memory: on a GPU, `torch.cuda.max_memory_allocated` during the timed calls minus what was
  allocated before the backend was loaded; on the CPU, the peak resident set size (VmHWM, reset
  through /proc/self/clear_refs) during the timed calls minus the RSS before the backend was loaded (after any export).
  The sweep runs one throwaway forward before the first baseline (`sweep.warm_up_process`), so the process's
  one-time allocations are nobody's, not the first backend's.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from vitfast.info import collect

from .stats import percentile

MIN_ITERS = 5  # a repeat never stops early below this many calls, whatever --max-seconds says
CPU_MATMUL = (2048, torch.float32)
GPU_MATMUL = (8192, torch.float16)
SPIN_CYCLES = 1_000_000  # "cuda-device": ~0.5 ms of GPU clock at 1.98 GHz, longer than any timed call's host launch path


# ---------------------------------------------------------------------------- timing
def time_calls(fn: Callable, inputs: Sequence[Any], iters: int, max_seconds: float, device: torch.device,
               timer: str) -> list[float]:  # fmt: skip
    """Milliseconds of each of up to `iters` calls fn(inputs[i % len(inputs)]); stops early (after
    MIN_ITERS) once `max_seconds` of host time have passed, so slow rows stay bounded.

    Timers: "perf_counter_ns" (host clock, synchronised), "cuda-events" (events around each call:
    what a caller waits for, host launch time included where it is the longer, as end-to-end rows
    want) and "cuda-device" (each call queued behind a spin kernel, so the host has launched it before
    the GPU reaches its begin event: the kernels' own time, as kernel rows want; the H100 run of
    2026-11-26 timed add+LayerNorm at 0.17-0.19 ms for every width with "cuda-events")."""
    if timer in ("cuda-events", "cuda-device"):
        return _time_cuda(fn, inputs, iters, max_seconds, device, spin=timer == "cuda-device")
    return _time_host(fn, inputs, iters, max_seconds, device)


def _time_host(fn, inputs, iters, max_seconds, device) -> list[float]:
    out = []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    start = time.perf_counter_ns()
    for i in range(iters):
        t0 = time.perf_counter_ns()
        fn(inputs[i % len(inputs)])
        sync()  # a no-op on the CPU; host-timed GPU backends (ONNX Runtime) return finished work anyway
        t1 = time.perf_counter_ns()
        out.append((t1 - t0) / 1e6)
        if i + 1 >= MIN_ITERS and t1 - start > max_seconds * 1e9:
            break
    return out


def _time_cuda(fn, inputs, iters, max_seconds, device, spin: bool) -> list[float]:
    events = []
    torch.cuda.synchronize(device)
    start = time.perf_counter_ns()
    for i in range(iters):
        if spin:
            torch.cuda._sleep(SPIN_CYCLES)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn(inputs[i % len(inputs)])
        end.record()
        events.append((begin, end))
        if i + 1 >= MIN_ITERS and time.perf_counter_ns() - start > max_seconds * 1e9:
            break
    torch.cuda.synchronize(device)
    return [b.elapsed_time(e) for b, e in events]


def random_inputs(batch: int, config, dtype: torch.dtype, device: torch.device, buffers: int) -> list[torch.Tensor]:
    """`buffers` different normal-random image batches (never zeros: they can run faster than data)."""
    gen = torch.Generator().manual_seed(batch)
    shape = (batch, config.in_chans, *config.img_hw)
    return [torch.randn(shape, generator=gen).to(device, dtype) for _ in range(buffers)]


# ---------------------------------------------------------------------------- memory
def release_memory(device: torch.device) -> None:
    """Free what earlier rows left: Python garbage, the CUDA cache, glibc's retained heap."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _proc_status_kib(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


class MemoryProbe:
    """Peak memory of one backend: `baseline()` before building it, `reset_peak()` after warm-up,
    `read()` after the timed calls -> (bytes or None, how it was measured or why not)."""

    def __init__(self, device: torch.device, outside_torch: str | None = None):
        self.device = device
        self.outside_torch = outside_torch  # a reason: the backend allocates where we cannot see
        self.base = 0

    def baseline(self) -> None:
        release_memory(self.device)
        if self.device.type == "cuda":
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.base = (_proc_status_kib("VmRSS") or 0) * 1024

    def reset_peak(self) -> bool:
        """Start a new peak; False when this system cannot (then `read` says so)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return True
        release_memory(self.device)
        try:
            Path("/proc/self/clear_refs").write_text("5")  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
        except OSError:
            return False
        return _proc_status_kib("VmHWM") is not None

    def read(self, reset_ok: bool) -> tuple[int | None, str]:
        if self.outside_torch:
            return None, self.outside_torch
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) - self.base
            return peak, "torch.cuda.max_memory_allocated during the timed calls minus allocations before the backend was loaded"
        if not reset_ok:
            return None, "peak RSS cannot be reset here (/proc/self/clear_refs not writable), so no per-row CPU peak"
        peak = (_proc_status_kib("VmHWM") or 0) * 1024 - self.base
        return peak, "peak RSS (VmHWM) during the timed calls minus RSS before the backend was loaded (exports excluded)"


# ---------------------------------------------------------------------------- ceiling
def matmul_peak(device: torch.device, repeats: int = 2, iters: int = 8) -> dict[str, Any]:
    """The measured dense matmul rate of this device (fp32 2048^3 on CPU, fp16 8192^3 on GPU)."""
    n, dtype = GPU_MATMUL if device.type == "cuda" else CPU_MATMUL
    gen = torch.Generator().manual_seed(0)
    pairs = [tuple(torch.randn(n, n, generator=gen).to(device, dtype) for _ in range(2)) for _ in range(2)]
    timer = "cuda-events" if device.type == "cuda" else "perf_counter_ns"
    mm = lambda ab: torch.mm(*ab)  # noqa: E731
    time_calls(mm, pairs, 3, 60.0, device, timer)  # warm-up: thread pools, cuBLAS handles
    samples = [time_calls(mm, pairs, iters, 30.0, device, timer) for _ in range(repeats)]
    del pairs
    release_memory(device)
    return {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "size": n, "samples_ms": samples}


def peak_tflops(peaks: Sequence[dict[str, Any]]) -> float:
    """TFLOP/s at the median of every matmul sample taken (before and after the sweep)."""
    n = peaks[0]["size"]
    samples = [t for p in peaks for rep in p["samples_ms"] for t in rep]
    return 2 * n**3 / percentile(samples, 50) / 1e9


# ---------------------------------------------------------------------------- environment
def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git_state() -> dict[str, Any]:
    """The vitfast source checkout's commit, and which tracked files differ from it (no commit, source
    "installed package", for a vitfast that is not a checkout of its own); or the commit named by VITFAST_GIT_SHA, for a tree copied without its own history (the lent GPU machine gets
    the working tree beside an older .git, which would name the wrong commit and list every file
    changed since as uncommitted)."""
    if os.environ.get("VITFAST_GIT_SHA"):
        return {"sha": os.environ["VITFAST_GIT_SHA"], "dirty": None, "changed_files": [], "source": "VITFAST_GIT_SHA"}
    root = Path(__file__).resolve().parents[2]
    # an installed vitfast sits in site-packages, and git would walk up to whatever repository holds the venv
    # (the user's own project): only a checkout whose top level is vitfast's source tree names vitfast's commit
    top = _run(["git", "rev-parse", "--show-toplevel"], root)
    if top is None or Path(top).resolve() != root or not _is_vitfast_tree(root):
        return {"sha": None, "dirty": None, "changed_files": [], "source": "installed package"}
    sha = _run(["git", "rev-parse", "HEAD"], root)
    changed = _run(["git", "diff", "--name-only", "HEAD"], root)
    return {"sha": sha, "dirty": bool(changed) if changed is not None else None, "changed_files": (changed or "").split(),
            "source": "git checkout"}  # fmt: skip


def _is_vitfast_tree(root: Path) -> bool:
    """`root/pyproject.toml` names the vitfast project."""
    try:
        return tomllib.loads((root / "pyproject.toml").read_text()).get("project", {}).get("name") == "vitfast"
    except (OSError, tomllib.TOMLDecodeError):
        return False


def environment(command: str, ort_threads: int | None) -> dict[str, Any]:
    """Everything that decides a figure: versions, GPU and driver, CPU, threads, git sha, command."""
    env = collect()
    gpu = env["gpu"]
    if gpu.get("available"):
        gpu["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    env |= {
        "command": command,
        "argv": shlex.join(sys.argv),
        "git": git_state(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": {
            "model": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "onnxruntime_threads": ort_threads or "onnxruntime default (one per physical core)",
            "loadavg_start": list(os.getloadavg()),
        },
    }
    return env
