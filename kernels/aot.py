"""Ahead-of-time compile of the Triton kernels for GPU targets, on a machine without a GPU.

    python -m vitfast.kernels.aot [--arch sm_80,sm_89,sm_90a] [--json FILE] [--jobs N] [--cache DIR]

The launch arguments come from the real launchers, called on CPU tensors with the launch
recorded instead of run (`LAUNCHES`), so Triton specialises them exactly as on a GPU (integers
divisible by 16 or equal to 1, pointer alignment, constexprs). For each target, an autotuned
kernel keeps the configs that its own prune keeps for that target's shared memory; those are
compiled with the ptxas shipped in the triton wheel, and each compiled kernel's real shared
memory (`metadata.shared`) is checked against the target's limit and against the prune's
estimate; each fp16/bf16 dot must compile to the tensor cores (wgmma on sm_90a for tiles of 64
rows or more, mma.sync otherwise). Registers and spills (ptxas -v) are reported. Results are cached per compiled-kernel hash
(source, specialisation, options, target, Triton version) in --cache.

Must run without TRITON_INTERPRET (the interpreter replaces the compiler). Exit status 1 when
a kernel fails to compile, when a kept config exceeds the limit or its estimate, when a config that
asks for two programs per SM (PER_SM) cannot keep two resident (shared memory, registers), when an fp16/bf16
dot misses its tensor-core instruction, when a launch in the supported range
(`Launch.required`) has no config that fits, or when a kernel compiled with its float arguments
typed fp64 (as torch.compile's Inductor passes Python floats to user kernels) fails or does
fp64 arithmetic.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import io
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable
from unittest import mock

if __name__ == "__main__" and importlib.util.find_spec("triton") is None:  # one line, not an import traceback
    sys.exit("python -m vitfast.kernels.aot compiles the Triton kernels (no GPU needed) and needs triton: pip install 'vitfast[triton]'")

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.cache import get_cache_key
from triton.runtime.jit import create_function_from_signature

from vitfast.errors import describe_exception
from vitfast.kernels import _common, add_layernorm, attention, bias_gelu, bias_swiglu, linear_epilogue, linear_layernorm, rope
from vitfast.kernels.precompile import Recorded, recording

# Kernels with a tl.dot, checked for the tensor-core instruction they compile to
DOT_KERNELS = ("_attention_fwd_kernel", "_linear_epilogue_kernel", "_linear_epilogue_tma_kernel", "_linear_residual_layernorm_kernel",
               "_linear_residual_layernorm_tma_kernel")
RESULT_VERSION = "v3"  # bump when compile_one's cached fields change (v2: "mma", v3: "f64_ops")
# target -> (compute capability, bytes of shared memory per block: the opt-in maximum)
TARGETS = {"sm_80": (80, 166912), "sm_89": (89, 101376), "sm_90a": (90, 232448)}
# target -> shared memory per SM, of which each resident block also takes _common.BLOCK_RESERVED_SHARED; and the
# register file (64K 32-bit registers per SM on all three): what PER_SM programs of one config must share
SM_SHARED = {"sm_80": 167936, "sm_89": 102400, "sm_90a": 233472}
SM_REGISTERS = 65536
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclasses.dataclass(frozen=True)
class Launch:
    """One representative launcher call. `required`: inside the supported range, so every target
    must keep a config for it; `all_configs`: compile every config kept (the shapes where shared
    memory is tightest), otherwise one kept config per target, one not compiled yet where it can (`plan`);
    `min_capability`: compiled only for the targets from that compute capability on (TMA: 90)."""

    name: str
    dtype: str
    call: Callable[[torch.dtype], None]
    required: bool = True
    all_configs: bool = False
    min_capability: int = 0


def _attention(B, N, H, D):
    def call(dtype):
        attention.attention_launch(torch.empty(B, N, 3 * H * D, dtype=dtype).unflatten(-1, (3, H, D)),
                                   torch.empty(B, N, H * D, dtype=dtype))  # fmt: skip

    return call


def _add_layernorm(rows, C, branch, rms=False):
    def call(dtype):
        x, w, b, out = torch.empty(rows, C, dtype=dtype), torch.empty(C, dtype=dtype), torch.empty(C, dtype=dtype), torch.empty(rows, C, dtype=dtype)
        add_layernorm.add_layernorm_launch(x, torch.empty_like(x) if branch else None, w, None if rms else b, 1e-6, out,
                                           torch.empty_like(x) if branch else None, rms=rms)  # fmt: skip

    return call


def _bias_gelu(rows, C, approximate):
    def call(dtype):
        bias_gelu.bias_gelu_launch(torch.empty(rows, C, dtype=dtype), torch.empty(C, dtype=dtype), torch.empty(rows, C, dtype=dtype), approximate)

    return call


def _bias_swiglu(rows, H):
    def call(dtype):
        x, b, out = torch.empty(rows, 2 * H, dtype=dtype), torch.empty(2 * H, dtype=dtype), torch.empty(rows, H, dtype=dtype)
        bias_swiglu.bias_swiglu_launch(x, b, out)

    return call


def _swiglu(rows, H, stacked):
    """Unpacked: gate and value apart, or (`stacked`) column halves of one [rows, 2H] GEMM output."""

    def call(dtype):
        gate, value = torch.empty(rows, 2 * H, dtype=dtype).chunk(2, -1) if stacked else (torch.empty(rows, H, dtype=dtype) for _ in "gv")
        bias_swiglu.swiglu_launch(gate, value, torch.empty(rows, H, dtype=dtype))

    return call


def _rope(B, N, Np, H, D, fp32_tables, interleaved=False):
    """qkv as the qkv Linear's output view; cos / sin in fp32, or (`fp32_tables=False`) in qkv's dtype;
    DINOv3's rotate-half layout, or timm's `interleaved` one."""

    def call(dtype):
        qkv = torch.empty(B, N, 3 * H * D, dtype=dtype).unflatten(-1, (3, H, D))
        cos, sin = (torch.empty(Np, D, dtype=torch.float32 if fp32_tables else dtype) for _ in "cs")
        rope.rope_qkv_launch(qkv, cos, sin, torch.empty(qkv.shape, dtype=dtype), interleaved)

    return call


def _linear(rows, K, N, epilogue, bias=True, kernel="pointer"):
    def call(dtype):
        x, w, b, out = (torch.empty(s, dtype=dtype) for s in ((rows, K), (N, K), (N,), (rows, N)))
        kw = {"gelu": epilogue} if epilogue in bias_gelu.GELU_FORMS else {}
        if epilogue.startswith("residual"):
            kw = {"residual": torch.empty(rows, N, dtype=dtype), "gamma": b if epilogue == "residual_gamma" else None}
        linear_epilogue.linear_epilogue_launch(x, w, b if bias else None, out, **kw, kernel=kernel)

    return call


def _linear_layernorm(rows, K, N, gamma, bias=True, rms=False, kernel="pointer"):
    def call(dtype):
        x, w, res, r_out, out = (torch.empty(s, dtype=dtype) for s in ((rows, K), (N, K), (rows, N), (rows, N), (rows, N)))
        vec = torch.empty(N, dtype=dtype)
        linear_layernorm.linear_residual_layernorm_launch(x, w, vec if bias else None, res, vec if gamma else None, vec,
                                                          None if rms else vec, 1e-6, r_out, out, rms=rms, kernel=kernel)  # fmt: skip

    return call


def _launches() -> list[Launch]:
    """ViT shapes: ViT-S/B/L (head_dim 64, 6/12/16 heads, N 197/577), ViT-H/14 (head_dim 80, N 257), SigLIP so400m (72, N 729),
    head_dims 32 and 128 (DESIGN.md's range), 256 (the launcher's limit, outside the range). AIMv2-L/14
    at 224 px (256 tokens, C 1024, SwiGLU hidden 2816; RMSNorm, no linear biases): one launch per new
    variant, the GEMMs' at their real shape. DINOv3's RoPE at 224 px (201 tokens: 1 class + 4 registers
    + 196 patches) with ViT-B's and ViT-7B's heads, and an odd small shape; the interleaved RoPE of
    EVA-02 / timm at ViT-B/16 224 px and an odd small shape."""
    out = []
    for dt in DTYPES:
        every = dt == "fp16"  # bf16 tiles take fp16's shared memory; fp32 is not a speed path: sampled
        out += [
            Launch(f"attention B8 N197 H12 D64 {dt}", dt, _attention(8, 197, 12, 64)),
            Launch(f"attention B2 N577 H16 D64 {dt}", dt, _attention(2, 577, 16, 64)),
            Launch(f"attention B2 N257 H16 D80 {dt}", dt, _attention(2, 257, 16, 80)),  # ViT-H/14: head dim as 64 + 16
            Launch(f"attention B2 N729 H16 D72 {dt}", dt, _attention(2, 729, 16, 72)),  # SigLIP so400m/14 at 384 px: 64 + 16
            Launch(f"attention B2 N50 H6 D32 {dt}", dt, _attention(2, 50, 6, 32)),
            Launch(f"attention B2 N256 H8 D128 {dt}", dt, _attention(2, 256, 8, 128), all_configs=every),
            Launch(f"attention B1 N197 H2 D256 {dt}", dt, _attention(1, 197, 2, 256), required=False),
            Launch(f"add_layernorm 394x768 {dt}", dt, _add_layernorm(394, 768, True)),
            Launch(f"layernorm 394x384 {dt}", dt, _add_layernorm(394, 384, False)),
            Launch(f"add_layernorm 50x1280 {dt}", dt, _add_layernorm(50, 1280, True)),
            Launch(f"add_layernorm 7x37 {dt}", dt, _add_layernorm(7, 37, True)),
            Launch(f"layernorm 66x2730 {dt}", dt, _add_layernorm(66, 2730, False)),  # EVA-02 L's norm before fc2 (4096-wide tile)
            Launch(f"layernorm 5x6144 {dt}", dt, _add_layernorm(5, 6144, False)),  # BEiT-3 giant's (8192-wide, 16 warps)
            Launch(f"bias_gelu 394x3072 erf {dt}", dt, _bias_gelu(394, 3072, "none")),
            Launch(f"bias_gelu 13x1000 tanh {dt}", dt, _bias_gelu(13, 1000, "tanh")),
            Launch(f"bias_gelu 50x3072 sigmoid {dt}", dt, _bias_gelu(50, 3072, "sigmoid")),
            Launch(f"bias_swiglu 1374x4096 {dt}", dt, _bias_swiglu(1374, 4096)),  # DINOv2-g/14 at 518 px, reg4
            Launch(f"bias_swiglu 13x100 {dt}", dt, _bias_swiglu(13, 100)),
            Launch(f"linear fc1+gelu 1576x768->3072 {dt}", dt, _linear(1576, 768, 3072, "none"), all_configs=every),
            Launch(f"linear fc2+residual*gamma 197x3072->768 {dt}", dt, _linear(197, 3072, 768, "residual_gamma")),
            Launch(f"linear fc1+gelu_tanh 50x192->771 {dt}", dt, _linear(50, 192, 771, "tanh")),
            Launch(f"linear fc1+quick_gelu 257x1024->4096 {dt}", dt, _linear(257, 1024, 4096, "sigmoid")),
            Launch(f"linear fc2+residual 13x100->37 {dt}", dt, _linear(13, 100, 37, "residual")),
        ]
        if dt != "fp32":  # the Hopper GEMM (fp16 / bf16): its epilogues, every config at ViT-B's fc1
            out += [
                Launch(f"linear tma fc1+gelu 1576x768->3072 {dt}", dt, _linear(1576, 768, 3072, "none", kernel="tma"),
                       all_configs=every, min_capability=90),
                Launch(f"linear tma fc2+residual*gamma 197x3072->768 {dt}", dt,
                       _linear(197, 3072, 768, "residual_gamma", kernel="tma"), min_capability=90),
                Launch(f"linear tma fc1+gelu_tanh nobias 50x192->776 {dt}", dt,
                       _linear(50, 192, 776, "tanh", bias=False, kernel="tma"), min_capability=90),
                Launch(f"linear_layernorm tma proj 1576x768->768 {dt}", dt, _linear_layernorm(1576, 768, 768, False, kernel="tma"),
                       all_configs=every, min_capability=90),
                Launch(f"linear_layernorm tma fc2*gamma 197x3072->768 {dt}", dt, _linear_layernorm(197, 3072, 768, True, kernel="tma"),
                       min_capability=90),
                Launch(f"linear_layernorm tma rms nobias 13x104->40 {dt}", dt,
                       _linear_layernorm(13, 104, 40, False, bias=False, rms=True, kernel="tma"), min_capability=90),
            ]
        out += [
            Launch(f"linear_layernorm proj 1576x768->768 {dt}", dt, _linear_layernorm(1576, 768, 768, False), all_configs=every),
            Launch(f"linear_layernorm fc2*gamma 197x3072->768 {dt}", dt, _linear_layernorm(197, 3072, 768, True)),
            Launch(f"linear_layernorm 13x100->37 {dt}", dt, _linear_layernorm(13, 100, 37, False)),
            # AIMv2: RMSNorm, linears without bias, unpacked SwiGLU
            Launch(f"add_rmsnorm 256x1024 {dt}", dt, _add_layernorm(256, 1024, True, rms=True)),
            Launch(f"rmsnorm 7x37 {dt}", dt, _add_layernorm(7, 37, False, rms=True)),
            Launch(f"swiglu 256x2816 {dt}", dt, _swiglu(256, 2816, stacked=False)),
            Launch(f"swiglu stacked 13x100 {dt}", dt, _swiglu(13, 100, stacked=True)),
            Launch(f"linear fc2+residual nobias 256x2816->1024 {dt}", dt, _linear(256, 2816, 1024, "residual", bias=False)),
            Launch(f"linear_layernorm rms proj nobias 256x1024->1024 {dt}", dt, _linear_layernorm(256, 1024, 1024, False, bias=False, rms=True)),
            # DINOv3: RoPE on q and k of the patch tokens (1 class + 4 register tokens first)
            Launch(f"rope_qkv B8 N201 H12 D64 {dt}", dt, _rope(8, 201, 196, 12, 64, fp32_tables=True)),
            Launch(f"rope_qkv B2 N201 H32 D128 {dt}", dt, _rope(2, 201, 196, 32, 128, fp32_tables=True)),  # ViT-7B
            Launch(f"rope_qkv B3 N13 H3 D80 {dt}", dt, _rope(3, 13, 9, 3, 80, fp32_tables=False)),
            # EVA-02 / timm's axial RoPE: interleaved pairs; ViT-B/16 at 224 px (1 class + 196 patches), an odd small shape
            Launch(f"rope_qkv interleaved B8 N197 H12 D64 {dt}", dt, _rope(8, 197, 196, 12, 64, fp32_tables=True, interleaved=True)),
            Launch(f"rope_qkv interleaved B3 N13 H3 D72 {dt}", dt, _rope(3, 13, 9, 3, 72, fp32_tables=False, interleaved=True)),
        ]
    return out


LAUNCHES = _launches()


# ---------------------------------------------------------------------------- recording
def record(launch: Launch) -> Recorded:
    """The one kernel launch `launch.call` makes, recorded (CPU tensors) instead of run."""
    with recording(cpu=True) as calls:
        launch.call(DTYPES[launch.dtype])
    assert len(calls) == 1, f"{launch.name}: expected one kernel launch, got {len(calls)}"
    return calls[0]


# ---------------------------------------------------------------------------- compiling
_RECORDED: list = []


def _init_worker() -> None:
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="vitfast-aot-")  # ptxas always runs on our misses
    _RECORDED[:] = [record(launch) for launch in LAUNCHES]


def specialised_source(jit, args: tuple, kwargs: dict, arch: int, fp64_scalars: bool = False):
    """(ASTSource, GPUTarget, backend, options) of `jit` launched with `args` / `kwargs` (CPU tensors
    stand in for the GPU's) on compute capability `arch`: Triton's own binder and packer, so the
    specialisation (divisibility, alignment, constexprs) is what a GPU launch would get. `fp64_scalars`
    types the float arguments fp64, as Inductor does."""
    gpu = GPUTarget("cuda", arch, 32)
    backend = make_backend(gpu)
    bind = create_function_from_signature(jit.signature, jit.params, backend)
    bound, specialization, options = bind(*args, **kwargs)
    options, signature, constexprs, attrs = jit._pack_args(backend, options, bound, specialization, options)
    if fp64_scalars:
        signature = {name: "fp64" if kind == "fp32" else kind for name, kind in signature.items()}
    return ASTSource(jit, signature, constexprs, attrs), gpu, backend, options


def compile_one(job: tuple) -> dict:
    """Compile launch `i` with config `c` (an index into the kept list) for `target`; with
    `fp64_scalars`, its float arguments typed fp64, as Inductor types them."""
    i, c, target, fp64_scalars, cache_dir = job
    rec = _RECORDED[i]
    arch, limit = TARGETS[target]
    config = rec.configs(TARGETS[target])[c]
    jit = rec.jit
    src, gpu, backend, options = specialised_source(jit, rec.args, rec.launch_kwargs | config.all_kwargs(), arch, fp64_scalars)
    key = hashlib.sha256(get_cache_key(src, backend, options, {}).encode()).hexdigest()
    row = {"launch": LAUNCHES[i].name, "kernel": jit.__name__, "target": target, "limit": limit,
           "config": _common.describe_config(config), "estimate": _estimate(rec, config, arch),
           "mma_expected": expected_matrix_instruction(jit.__name__, LAUNCHES[i].dtype, target, config.kwargs.get("BLOCK_M", 0)),
           "scalars": "fp64" if fp64_scalars else "fp32", "per_sm": config.kwargs.get("PER_SM", 1), "warps": config.num_warps}  # fmt: skip
    cached = os.path.join(cache_dir, f"{key}.{RESULT_VERSION}.json")
    if os.path.exists(cached):
        with open(cached) as f:
            return {**row, **json.load(f), "cached": True}
    log, start = io.StringIO(), time.perf_counter()
    try:
        with mock.patch.object(knobs.nvidia, "dump_ptxas_log", True), contextlib.redirect_stdout(log):
            compiled = triton.compile(src, target=gpu, options=options.__dict__)
    except Exception as e:  # a compile error is a finding, reported with its first line
        return {**row, "error": describe_exception(e)}
    result = {"shared": compiled.metadata.shared, "compile_s": round(time.perf_counter() - start, 2),
              "mma": matrix_instruction(compiled.asm["ptx"]), "f64_ops": f64_arithmetic(compiled.asm["ptx"]),
              **_ptxas_stats(log.getvalue())}  # fmt: skip
    os.makedirs(cache_dir, exist_ok=True)
    with open(cached + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(cached + ".tmp", cached)
    return {**row, **result, "cached": False}


def matrix_instruction(ptx: str) -> str:
    """The tensor-core instruction a kernel's PTX uses: "wgmma" (Hopper's warpgroup MMA, sm_90a
    only), "mma.sync" (Ampere's, which Hopper runs at a fraction of its rate) or "none"."""
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    return "mma.sync" if re.search(r"\bmma\.sync\b", ptx) else "none"


def f64_arithmetic(ptx: str) -> int:
    """fp64 arithmetic instructions in the PTX (conversions, loads and moves are not counted)."""
    return len(re.findall(r"\b(?:add|sub|mul|fma|div|rcp|rsqrt|sqrt|max|min|neg|abs|ex2|lg2)(?:\.\w+)*\.f64\b", ptx))


def expected_matrix_instruction(kernel: str, dtype: str, target: str, block_m: int) -> str | None:
    """What a kernel's dot must compile to: fp16/bf16 GEMM and attention tiles on the tensor cores,
    as wgmma on sm_90a when the tile has a warpgroup's 64 rows (a 32-row tile, kept for small
    batches, takes mma.sync there too). None where nothing is required (no dot, or fp32, whose
    IEEE dot is FMAs)."""
    if kernel not in DOT_KERNELS or dtype == "fp32":
        return None
    return "wgmma" if target == "sm_90a" and block_m >= 64 else "mma.sync"


def _estimate(rec: Recorded, config, capability) -> int | None:
    if not hasattr(rec.kernel, "shared_memory_estimate"):
        return None
    return rec.kernel.shared_memory_estimate(config, rec.named_args(), capability)


def _ptxas_stats(log: str) -> dict:
    """Registers and spills from ptxas -v."""
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    return {
        "regs": int(regs.group(1)) if regs else None,
        "spill_stores": int(spills.group(1)) if spills else None,
        "spill_loads": int(spills.group(2)) if spills else None,
        "stack": int(stack.group(1)) if stack else None,
    }


# ---------------------------------------------------------------------------- the check
def plan(targets: list[str]) -> tuple[list[tuple], list[dict]]:
    """(compile jobs (launch, config, target, fp64 scalars), launches with no config on a target).
    A launch with `all_configs` compiles every config it keeps; any other one per target, the first in
    its rotation that its kernel has not compiled yet for that dtype and target (else the rotation's
    own). A config that some launch keeps and none compiled then compiles with the first launch that
    keeps it: every kernel x kept config x dtype x target compiles at least once (configs a prune keeps
    differ by launch: the whole-head attention tiles only where N and the head dim fit, e.g. sm_89's
    only at head_dim 32). The first launch of each kernel with a float argument is also compiled with
    it typed fp64 (torch.compile's Inductor passes Python floats to user kernels so:
    `torch._inductor.config._use_fp64_for_unbacked_floats`), on the last target."""
    kept = {(i, target): _RECORDED[i].configs(TARGETS[target]) for i, launch in enumerate(LAUNCHES) for target in targets
            if TARGETS[target][0] >= launch.min_capability}  # fmt: skip

    def compiled_as(i: int, target: str, config) -> tuple:
        return _RECORDED[i].jit.__name__, LAUNCHES[i].dtype, target, _common.describe_config(config)

    done = {compiled_as(i, target, c) for (i, target), configs in kept.items() if LAUNCHES[i].all_configs for c in configs}
    jobs, unfit, typed = [], [], set()
    for i, launch in enumerate(LAUNCHES):
        for t, target in enumerate(targets):
            configs = kept.get((i, target))
            if configs is None:
                continue
            if not configs:
                unfit.append({"launch": launch.name, "target": target, "required": launch.required})
                continue
            if launch.all_configs:
                picks = range(len(configs))
            else:
                rotation = [(i + t + k) % len(configs) for k in range(len(configs))]
                picks = [next((c for c in rotation if compiled_as(i, target, configs[c]) not in done), rotation[0])]
                done.add(compiled_as(i, target, configs[picks[0]]))
            jobs += [(i, c, target, False) for c in picks]
        rec = _RECORDED[i]
        if kept.get((i, targets[-1])) and rec.jit.__name__ not in typed and any(isinstance(v, float) for v in rec.named_args().values()):
            typed.add(rec.jit.__name__)
            jobs.append((i, 0, targets[-1], True))
    for (i, target), configs in kept.items():  # launch order: the first launch that keeps a config not compiled yet
        for c, config in enumerate(configs):
            if compiled_as(i, target, config) not in done:
                done.add(compiled_as(i, target, config))
                jobs.append((i, c, target, False))
    return jobs, unfit


def problems(rows: list[dict], unfit: list[dict]) -> list[str]:
    found = [f"{r['launch']} [{r['config']}] on {r['target']}: {r['error']}" for r in rows if "error" in r]
    for r in rows:
        if "shared" not in r:
            continue
        if r["shared"] > r["limit"]:
            found.append(f"{r['launch']} [{r['config']}] on {r['target']}: {r['shared']} B shared > limit {r['limit']} B")
        if r["estimate"] is not None and r["shared"] > r["estimate"]:
            found.append(f"{r['launch']} [{r['config']}] on {r['target']}: {r['shared']} B shared > estimate {r['estimate']} B")
        if r.get("per_sm", 1) > 1 and not fits_per_sm(r):
            found.append(f"{r['launch']} [{r['config']}] on {r['target']}: {r['per_sm']} programs per SM do not fit one SM "
                         f"({r['shared']} B shared, {r['regs']} registers x {r['warps']} warps each)")
        if r["mma_expected"] and r["mma"] != r["mma_expected"]:
            found.append(f"{r['launch']} [{r['config']}] on {r['target']}: compiles its dot to {r['mma']}, not {r['mma_expected']}")
        if r.get("scalars") == "fp64" and r.get("f64_ops"):
            found.append(f"{r['launch']} [{r['config']}] on {r['target']}: {r['f64_ops']} fp64 instructions with its float arguments "
                         "typed fp64 (as Inductor passes them): cast them to fp32 in the kernel")
    found += [f"{u['launch']} on {u['target']}: no config fits the shared memory" for u in unfit if u["required"]]
    return found


def fits_per_sm(row: dict) -> bool:
    """Whether `row["per_sm"]` programs of a compiled kernel can be resident on one SM of its target at
    once: their shared memory (plus the 1 KB reserved per block) and their registers (allocated per
    thread in multiples of 8; unknown counts as fitting)."""
    n = row["per_sm"]
    shared_ok = n * (row["shared"] + _common.BLOCK_RESERVED_SHARED) <= SM_SHARED[row["target"]]
    regs = row.get("regs")
    return shared_ok and (regs is None or n * -(-regs // 8) * 8 * 32 * row["warps"] <= SM_REGISTERS)


def table(rows: list[dict], unfit: list[dict]) -> str:
    head = f"{'target':<7} {'launch':<44} {'config':<34} {'shared':>7} {'estim':>7} {'regs':>4} {'spill':>5} {'mma':<8} {'f64':>3}"
    lines = [head, "-" * len(head)]
    for r in sorted(rows, key=lambda r: (r["target"], r["launch"], r["scalars"], r["config"])):
        launch = r["launch"] + (" (fp64 args)" if r["scalars"] == "fp64" else "")
        if "error" in r:
            lines.append(f"{r['target']:<7} {launch:<44} {r['config']:<34} ERROR {r['error']}")
            continue
        est = "" if r["estimate"] is None else r["estimate"]
        spill = r["spill_stores"] if r["spill_stores"] is not None else "?"
        lines.append(f"{r['target']:<7} {launch:<44} {r['config']:<34} {r['shared']:>7} {est:>7} {r['regs'] or '?':>4} {spill:>5} {r['mma']:<8} "
                     f"{r['f64_ops']:>3}")
    lines += [f"{u['target']:<7} {u['launch']:<44} no config fits ({'a failure' if u['required'] else 'the launcher refuses it'})" for u in unfit]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vitfast.kernels.aot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default=",".join(TARGETS), help=f"comma-separated targets from {', '.join(TARGETS)}")
    parser.add_argument("--json", help="write the rows, the launches with no config and the problems here")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "vitfast-aot-cache"), help="results cache folder")
    opts = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the interpreter replaces the compiler this check runs")
    targets = opts.arch.split(",")
    if unknown := [t for t in targets if t not in TARGETS]:
        parser.error(f"unknown target(s) {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
    start = time.perf_counter()
    _init_worker()
    jobs, unfit = plan(targets)
    jobs = [(*job, opts.cache) for job in jobs]
    if opts.jobs > 1:
        with ProcessPoolExecutor(opts.jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker) as pool:
            rows = list(pool.map(compile_one, jobs))
    else:
        rows = [compile_one(job) for job in jobs]
    found = problems(rows, unfit)
    print(table(rows, unfit))
    fresh = sum(1 for r in rows if r.get("cached") is False)
    print(f"\n{len(rows)} kernels ({fresh} compiled, {len(rows) - fresh - sum('error' in r for r in rows)} cached) "
          f"for {', '.join(targets)} in {time.perf_counter() - start:.0f} s")  # fmt: skip
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"targets": {t: TARGETS[t] for t in targets}, "rows": rows, "unfit": unfit, "problems": found}, f, indent=1)
    for p in found:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
