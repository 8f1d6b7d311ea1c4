"""Compile, in parallel, every Triton kernel and autotune config some code will launch, before it runs.

    stats = precompile(lambda: model(images))          # model optimized, images on the GPU

An optimized model's first forward at a new shape autotunes each kernel: Triton compiles the
configs one after another (about a second each), and a ViT's first forward spends tens of seconds
there. `precompile(fn)` runs `fn` with every kernel launch recorded instead of run (`recording`:
the launchers validate and allocate as usual, the kernels do not run, so outputs are garbage; a
tensor argument is kept as its dtype and address only), then compiles each recorded launch with
every config its autotuner would try on this device, through Triton's own warm-up path
(`JITFunction.warmup`: the exact specialisation and cache key of a launch) under Triton's
`AsyncCompileMode` with a thread pool: its compiler releases the GIL for most of the work and ptxas
is a subprocess, so threads overlap. The kernels land in the kernel's in-process cache and
Triton's disk cache; the autotuning that follows only times them.
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator
from unittest import mock

from triton import Config

from . import _common, add_layernorm, attention, bias_gelu, bias_swiglu, linear_epilogue, linear_layernorm, rope

KERNEL_MODULES = (add_layernorm, attention, bias_gelu, bias_swiglu, linear_epilogue, linear_layernorm, rope)


@dataclass(frozen=True)
class Pointer:
    """A tensor argument as far as compiling goes (Triton specialises a pointer on its dtype and
    16-byte alignment), kept instead of the tensor so that recording a forward holds no memory."""

    dtype: Any
    address: int
    itemsize: int
    device: Any

    def data_ptr(self) -> int:
        return self.address

    def element_size(self) -> int:
        return self.itemsize


def _standin(value):
    """A tensor argument as a `Pointer`; anything else as it is."""
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return Pointer(value.dtype, value.data_ptr(), value.element_size(), value.device)
    return value


@dataclass(frozen=True)
class Recorded:
    """One kernel launch as a launcher made it: the kernel (an autotuner or a plain JIT function)
    and its arguments (tensors as `Pointer`s, ints, constexprs; for a plain kernel num_warps /
    num_stages too)."""

    kernel: Any
    args: tuple
    kwargs: dict

    @property
    def jit(self):
        return self.kernel.fn if hasattr(self.kernel, "configs") else self.kernel

    @property
    def launch_kwargs(self) -> dict:
        """The keyword arguments a launch binds: num_warps / num_stages come from the config."""
        return {k: v for k, v in self.kwargs.items() if k not in ("num_warps", "num_stages")}

    def named_args(self) -> dict:
        return {**dict(zip(self.jit.arg_names, self.args)), **self.kwargs}

    def configs(self, budget: tuple[int, int] | None) -> list[Config]:
        """The configs its autotuner keeps for a (capability, shared-memory bytes) budget (its own
        prune's rule), or the launch's single config for a plain kernel."""
        if not hasattr(self.kernel, "configs"):
            return [Config({}, num_warps=self.kwargs.get("num_warps", 4), num_stages=self.kwargs.get("num_stages", 3))]
        return _common.kept_configs(self.kernel.configs, self.kernel.shared_memory_estimate, self.named_args(), budget)


@contextlib.contextmanager
def recording(cpu: bool = False) -> Iterator[list[Recorded]]:
    """Inside, every vitfast kernel launch is appended to the yielded list and not run (a model
    optimized with `cuda_graphs` runs its plain forward: a graph captured here would replay without
    the kernels). `cpu=True` also sends CPU tensors through the launchers (as under the interpreter)
    instead of the reference math, for recording on a machine without a GPU."""
    calls: list[Recorded] = []

    def record(kernel, args, kwargs):
        calls.append(Recorded(kernel, tuple(_standin(a) for a in args), {k: _standin(v) for k, v in kwargs.items()}))

    def wrap_triton(kernel, like):
        def launch(*args, **kwargs):
            if args[0] is not like:  # every launcher passes its activation, the kernel's first argument
                raise RuntimeError(f"{getattr(kernel, '__name__', kernel)}: wrap_triton's `like` is not the launch's first tensor")
            record(kernel, args, kwargs)

        return _Grid(launch)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(_common, "RECORDING", True))
        if cpu:
            stack.enter_context(mock.patch.object(_common, "CPU_LAUNCHES", True))
        for module in KERNEL_MODULES:
            stack.enter_context(mock.patch.object(module, "wrap_triton", wrap_triton))
        yield calls


class _Grid:
    """What `wrap_triton(kernel, like)` returns: subscripted with a grid, a callable."""

    def __init__(self, launch: Callable):
        self.launch = launch

    def __getitem__(self, grid) -> Callable:
        return self.launch


def compile_recorded(launches: list[Recorded], budget: tuple[int, int] | None, threads: int | None = None) -> dict:
    """Compile each launch with each config it keeps for `budget` (see `Recorded.configs`) in a
    pool of `threads` (default: one per CPU). Returns the launches, the (launch, config) jobs after
    dropping exact repeats, the distinct kernels compiled, threads and seconds; with a Triton that
    has no AsyncCompileMode (before 3.4) it compiles nothing and says so."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return {"launches": len(launches), "compiled": 0,
                "reason": "this Triton has no AsyncCompileMode (Triton >= 3.4): kernels compile at first launch"}
    threads = threads or os.cpu_count() or 1
    jobs = {}
    for launch in launches:
        for config in launch.configs(budget):
            jobs[(launch.jit, _specialisation_key(launch.args, launch.launch_kwargs, config))] = (launch, config)
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool, AsyncCompileMode(pool) as mode:
        for launch, config in jobs.values():
            launch.jit.warmup(*launch.args, grid=(1,), **launch.launch_kwargs, **config.all_kwargs())
        compiled = len(mode.future_kernels)  # distinct kernels not yet in memory (Triton's disk cache may still hold some)
    return {"launches": len(launches), "jobs": len(jobs), "compiled": compiled, "threads": threads,
            "seconds": round(time.perf_counter() - start, 2)}  # fmt: skip


def _specialisation_key(args: tuple, kwargs: dict, config: Config) -> tuple:
    """Equal for launches that compile to the same kernel (a ViT's blocks repeat theirs): tensors
    by dtype and 16-byte alignment (all Triton specialises a pointer on), everything else by value.
    Conservative: launches it tells apart may still share a kernel, which Triton then compiles once."""

    def one(v):
        return ("pointer", str(v.dtype), v.data_ptr() % 16 == 0) if isinstance(v, Pointer) else v

    return (tuple(one(a) for a in args), tuple(sorted((k, one(v)) for k, v in kwargs.items())), tuple(sorted(config.all_kwargs().items())))


def precompile(*fns: Callable[[], Any], threads: int | None = None) -> dict:
    """Record the kernel launches each `fn()` makes (on CUDA tensors) and compile them all for this
    GPU in one pool before anything runs for real: see the module docstring. Returns
    `compile_recorded`'s counts."""
    launches: list[Recorded] = []
    for fn in fns:
        with recording() as calls:
            fn()
        launches += calls
    if not launches:
        return {"launches": 0, "compiled": 0}
    if _common.INTERPRET:
        return {"launches": len(launches), "compiled": 0, "reason": "TRITON_INTERPRET=1: the interpreter compiles nothing"}
    tensor = next(a for launch in launches for a in launch.args if hasattr(a, "device"))
    return compile_recorded(launches, _common.shared_memory_budget(tensor.device), threads)
