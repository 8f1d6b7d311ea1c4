"""Helpers shared by the kernel launchers (importable without triton: vitfast/fused.py uses next_pow2)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import is_fake

from vitfast.errors import InputError

try:  # torch's switch for wrap_triton's higher-order op, off in a triton_op's eager call (private: guarded)
    from torch._library.triton import is_wrap_triton_enabled as _is_wrap_triton_enabled
    from torch._library.triton import set_wrap_triton_enabled as _set_wrap_triton_enabled
except ImportError:
    _is_wrap_triton_enabled = _set_wrap_triton_enabled = None

# this thread's torch dispatch modes (make_fx, FakeTensorMode, FlopCounterMode) and torch.func transforms
# (functionalize, vmap: their wrappers are plain-typed tensors); private, so guarded
_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", None)
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # what eager code passes; other types are subclasses (fake, DTensor, ...)

if _dispatch_stack_len is None or _functorch_active is None:

    def in_dispatch_mode() -> bool:  # this torch cannot say: correct, but every direct launch then re-tunes (`wrap_triton`)
        return True

else:

    def in_dispatch_mode() -> bool:
        """Whether this thread runs under a torch dispatch mode or a torch.func transform. Per thread: torch's
        `is_in_torch_dispatch_mode` reads a process-wide flag, so another thread's FakeTensorMode would switch
        this one to the slow path."""
        return _dispatch_stack_len() > 0 or _functorch_active()


def seen_by_torch(x: torch.Tensor) -> bool:
    """Whether ops on x must reach torch as ops (a dispatch mode or torch.func transform in this thread, or x a
    tensor subclass: a fake tensor met where its mode is not on the stack, as inside the mode's own dispatch),
    not run as direct launches."""
    return type(x) not in PLAIN_TENSORS or in_dispatch_mode()


# Read once, like triton itself: TRITON_INTERPRET must be set before triton is imported.
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# True inside kernels/precompile.py's `recording`, where launches are recorded and not run: their outputs are
# garbage, so nothing may keep them (vitfast/optimize.py's CudaGraphForward captures no graph then)
RECORDING = False
# True inside `recording(cpu=True)`: CPU tensors go through the launchers (to be recorded) instead of the reference
# math, as under the interpreter, while every choice a GPU launch makes (tile sizes, configs) stays the GPU's
CPU_LAUNCHES = False
INT32_MAX = 2**31 - 1
BLOCK_RESERVED_SHARED = 1024  # shared memory the system reserves for each resident block (sm_80 on), beside the kernel's own

# (config, launch arguments by name: tensors, ints and constexprs, compute capability as 80/89/90)
# -> bytes of shared memory
SharedMemoryEstimate = Callable[[Any, dict, int], int]


def next_pow2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def check_device(*tensors: torch.Tensor) -> None:
    """All on one device: CUDA, or CPU under the Triton interpreter."""
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        raise ValueError(f"all tensors must be on one device, got {[str(t.device) for t in tensors]}")
    if device.type != "cuda" and not (INTERPRET or CPU_LAUNCHES):
        raise ValueError(f"Triton kernels need CUDA tensors (got {device}); set TRITON_INTERPRET=1 to run them on CPU for testing")


def tracing(like: torch.Tensor) -> bool:
    """Whether a launch on `like` may be traced: wrap_triton's higher-order op on (it is off only in a
    triton_op's eager call) and `seen_by_torch(like)` (torch.compile, torch.export, make_fx even on real
    tensors). Outside every op the switch reads on, yet a plain tensor with no mode active is no trace."""
    return hop_dispatch_enabled() and seen_by_torch(like)


def wrap_triton(kernel, like: torch.Tensor):
    """`torch.library.wrap_triton(kernel)` where the launch may be traced (`tracing(like)`, `like` one
    of the launch's tensors), else the kernel as it is:
    - on real tensors outside an op, torch's higher-order op prunes an autotuned kernel's configs into a
      new autotuner, cache and all, on every call: each launch re-ran the whole tuning (0.5-1.2 s per
      GEMM call on the H200 run of 2026-11-27, benchmarks/results/gpu-proof-h200-34a1ddd);
    - in a triton_op's eager call torch launches directly anyway, but building its wrapper still costs
      5-7 us per launch (on this project's CPU VM);
    - under the Triton interpreter: torch 2.13's wrap_triton does the same by itself; torch 2.11
      (the GPU device's) refuses an interpreted kernel, or fails tracing an autotuned one."""
    if INTERPRET or not tracing(like):
        return kernel
    return torch.library.wrap_triton(kernel)


# name -> the op's launcher called straight, as torch's triton_op runs it on real tensors (the
# higher-order op off): what vitfast.fused calls in eager mode (`vitfast_op`)
EAGER_OPS: dict[str, Callable] = {}


def vitfast_op(name: str):
    """`torch.library.triton_op("vitfast::<name>")`, the function also kept in `EAGER_OPS`.

    Through the dispatcher a custom op costs about 30 us of host time per call on this project's
    CPU VM (autograd and backend redispatch, Dynamo's disable wrapper), 48 calls per ViT-B/16
    forward; at batch 1 on an H100 host time set optimize()'s latency (6.2 ms, 0.61 ms with CUDA
    graphs, eager 2.8 ms). `vitfast.fused.kernel_ops` calls these in eager mode
    (benchmarks/host_overhead.py); traces and dispatch modes still see the torch op."""

    def decorate(fn):
        if _set_wrap_triton_enabled is not None:

            def eager(*args, **kwargs):
                with eager_dispatch():
                    return fn(*args, **kwargs)

            EAGER_OPS[name] = functools.wraps(fn)(eager)
        return torch.library.triton_op(f"vitfast::{name}", mutates_args=())(fn)

    return decorate


def eager_dispatch():
    """The state a triton_op's eager call runs its body in: wrap_triton's switch off, so `tracing` says no
    at its first check (`vitfast_op`'s eager entries run in it, as torch's own eager call does)."""
    return _set_wrap_triton_enabled(False) if _set_wrap_triton_enabled is not None else contextlib.nullcontext()


def hop_dispatch_enabled() -> bool:
    """torch's wrap_triton switch: on outside every op and in traces, off in a triton_op's eager call
    (`tracing` decides with it); True where this torch cannot say."""
    return _is_wrap_triton_enabled() if _is_wrap_triton_enabled is not None else True


def runs_reference(t: torch.Tensor) -> bool:
    """Whether an op takes its plain-PyTorch reference instead of its Triton kernel.

    CUDA tensors always run the kernel. CPU tensors run it through the interpreter only when they
    are real, not bf16 and TRITON_INTERPRET=1; traced ones (fake tensors under torch.compile / torch.export,
    which the interpreter cannot read), bf16 ones (the interpreter computes bf16 tl.dot wrongly and truncates
    fp32 -> bf16 casts: a bf16 model's logits came out wrong by more than their own size) and any CPU tensor
    without the interpreter take the reference math, so an optimized model traces and runs on CPU as well.
    """
    return t.device.type == "cpu" and (not (INTERPRET or CPU_LAUNCHES) or is_fake(t) or t.dtype == torch.bfloat16)


def elementwise_tiles(M: int, width: int) -> tuple[int, int, tuple[int, int]]:
    """(BLOCK_M, BLOCK_N, grid) of a row-wise elementwise kernel writing [M, width]: 8 rows x up to 256
    columns per program (16 x 64 under the interpreter)."""
    block_m, block_n = (16, min(next_pow2(width), 64)) if INTERPRET else (8, min(next_pow2(width), 256))
    return block_m, block_n, (-(-M // block_m), -(-width // block_n))


def rows_view(t: torch.Tensor, C: int) -> torch.Tensor:
    """[..., C] -> [M, C] view with contiguous columns (copies only if it has to), as the row-wise kernels read it."""
    t2 = t.reshape(-1, C)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def span(t: torch.Tensor, dims: slice = slice(None)) -> int:
    """Largest element offset reachable through t's strides over `dims` (what a kernel multiplies out)."""
    return sum((n - 1) * abs(s) for n, s in zip(t.shape[dims], t.stride()[dims]))


def shared_memory_budget(device: torch.device) -> tuple[int, int] | None:
    """(compute capability as an int, 80 for sm_80, and the bytes of shared memory one program may
    use: the opt-in maximum Triton checks at launch, 163 KB on sm_80, 99 KB on sm_86/89, 227 KB on
    sm_90) of a CUDA device. None off CUDA: the interpreter has no such limit."""
    if device.type != "cuda":
        return None
    return _cuda_shared_memory_budget(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_shared_memory_budget(index: int) -> tuple[int, int]:
    from triton.runtime import driver  # lazy: triton is optional, and vitfast.fused imports this module without it

    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor, driver.active.utils.get_device_properties(index)["max_shared_mem"]


def configs_within(configs: list, estimate: SharedMemoryEstimate, args: dict, budget: tuple[int, int] | None) -> list:
    """The configs whose estimated shared memory fits the (capability, bytes) budget (all when None)."""
    if budget is None:
        return list(configs)
    capability, limit = budget
    return [c for c in configs if estimate(c, args, capability) <= limit]


def tune_limit() -> int:
    """VITFAST_TUNE_CONFIGS: at most this many of a kernel's fitting configs reach its tuner (unset or 0: all).
    The GPU proof's pytest sets it: its tests check results at odd shapes, and every config of every new shape
    is a compile (the H200 run of 2026-11-27 spent 16-33 s per test, 20 tests in its 65 s)."""
    value = os.environ.get("VITFAST_TUNE_CONFIGS", "")
    if value and not value.isdigit():
        raise ValueError(f"VITFAST_TUNE_CONFIGS must be a whole number of configs (0 or unset: all), got {value!r}")
    return int(value or 0)


def kept_configs(configs: list, estimate: SharedMemoryEstimate, args: dict, budget: tuple[int, int] | None) -> list:
    """The configs a tuner benchmarks: those that fit the budget (`configs_within`), cut to `tune_limit()`
    of them spread over the list, the first and the last kept (each kernel lists its tiles from one size extreme
    to the other, so the largest and the smallest tile stay; attention lists its whole-head configs first)."""
    fitting, n = configs_within(configs, estimate, args, budget), tune_limit()
    if n <= 0 or len(fitting) <= n:
        return fitting
    return [fitting[round(i * (len(fitting) - 1) / max(n - 1, 1))] for i in range(n)]


def autotune(configs: list, key: list[str], estimate: SharedMemoryEstimate):
    """`triton.autotune` that drops configs too big for the device's shared memory before tuning
    (instead of compiling them only to fail; where VITFAST_TUNE_CONFIGS is set, all but that many too:
    `kept_configs`), and keeps tuning results on disk (in Triton's cache
    dir, TRITON_CACHE_DIR) where the installed Triton can, unless VITFAST_TUNE_CACHE=0 (read at import:
    a process that tunes on a shared GPU, as the GPU proof's pytest workers do, must not leave its picks
    to the processes that time the kernels). `.shared_memory_estimate` is kept on the autotuner for the
    launchers' error messages and the ahead-of-time compile check."""
    import triton  # lazy: triton is optional, and vitfast.fused imports this module without it

    def prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        device = next(v.device for v in args.values() if isinstance(v, torch.Tensor))
        return kept_configs(configs, estimate, args, shared_memory_budget(device))

    keep = "cache_results" in inspect.signature(triton.autotune).parameters and os.environ.get("VITFAST_TUNE_CACHE") != "0"
    extra = {"cache_results": True} if keep else {}

    def decorate(fn):
        tuner = triton.autotune(configs=configs, key=key, prune_configs_by={"early_config_prune": prune}, **extra)(fn)
        tuner.shared_memory_estimate = estimate
        return tuner

    return decorate


def describe_config(config) -> str:
    """A config in one short string: its meta-parameters, then warps and stages (`BLOCK_M=64,w4,s2`)."""
    meta = ",".join(f"{k}={v}" for k, v in config.kwargs.items())
    return f"{meta}{',' if meta else ''}w{config.num_warps},s{config.num_stages}"


def require_fitting_config(tuner, args: dict, device: torch.device, what: str) -> None:
    """Raise a clear error when none of `tuner`'s configs fits the device's shared memory
    (Triton's own error would be 'No valid autotuner configs after pruning')."""
    budget = shared_memory_budget(device)
    if budget is None or configs_within(tuner.configs, tuner.shared_memory_estimate, args, budget):
        return
    capability, limit = budget
    smallest = min(tuner.shared_memory_estimate(c, args, capability) for c in tuner.configs)
    raise InputError(
        f"{what}: no kernel configuration fits this GPU's shared memory ({limit // 1024} KB per block; "
        f"the smallest needs {smallest // 1024} KB); use fp16/bf16 inputs or a smaller head_dim, "
        "or leave this layer to PyTorch"
    )
