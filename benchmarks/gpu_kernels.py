"""The kernels part of the GPU proof (`benchmarks/gpu_proof.py --part kernels`): ceilings, then each
Triton kernel against what it replaces, timed side by side.

1. Ceilings: device-to-device copy bandwidth (bytes read + written) and the fp16/bf16 matmul rate.
2. Attention from the packed qkv [B, N, 3, H, D] vs SDPA's flash, efficient and cuDNN backends fed
   from the same qkv (the permute is a view; the output transpose back to [B, N, H*D] is a copy,
   timed with it), N = 197/577/1025, D = 64/80/128, fp16, batch 256 at N = 197 (fewer images
   for longer sequences, the same token count order); and one fp32 row (ViT-B/16, batch 64), the
   path `optimize()` takes for an fp32 model: its IEEE dot compiles to unrolled FMA code that spills
   in all but one of the listed tiles on sm_90a (benchmarks/NOTES.md), so it may lose to SDPA. A
   backend that refuses the shape is a row with its reason.
3. add+LayerNorm GB/s vs PyTorch (x + y, then F.layer_norm) and as a fraction of the copy bandwidth;
   likewise the MLP's activations after a bias-free cuBLAS fc1: bias+GELU (ViT-B/16's 3072 wide) vs
   F.gelu(x + b), and bias+SwiGLU (the DINOv2 giant's packed 2 x 4096) vs silu(gate) * value of x + b;
   and the 2-D RoPE of q and k in the packed qkv (`vitfast::rope_qkv`) in both layouts: rotate-half
   (DINOv3 S/B/L at 256 px: N = 1 + 4 registers + 256 patches) and interleaved (EVA-02 B/L at 448 px:
   N = 1 + 1024 patches), fp16 and bf16, batch 64 and 256, vs the reference model's `layers.apply_rope`
   on the q and k views, checked against float64 with the 2x rule first.
4. Where one ViT-B/16 forward's time goes (batch 256): torch.profiler per kernel and per category,
   eager vs optimize() on each MLP path and with approximate_gelu (`forward_profile`).
5. The GEMMs with epilogues vs cuBLAS + the separate kernels, ViT-S/B/L widths, M = batch x 197:
   fc1 + bias + GELU (cuBLAS GEMM with bias + PyTorch's GELU, FusedBlock's cuBLAS path, vs one Triton GEMM); fc2 and
   proj + bias + LayerScale + residual + LayerNorm (cuBLAS GEMM + add+LayerNorm kernel vs one
   Triton GEMM). TFLOP/s, which is faster, parity of both vs fp32 with the 2x rule. On Hopper the
   Triton GEMM is the TMA kernel optimize() launches there, and `pointer_*` columns time the pointer
   kernel (what a torch.compile trace launches) beside it. `write_dispatch` turns the fc1/fc2 winners
   into kernels/mlp_dispatch.json entries. gpu_proof.py runs this section before 3's RoPE rows and 4.

Timing: device time on a GPU (CUDA events around each call, queued behind a spin kernel so launch
overhead stays out: `median_ms`), `perf_counter_ns` on the CPU; median, inputs rotated among buffers. Each autotuned kernel's row also records the config it picked and, when that row did the
tuning, every config's median time (`tuning`). Every function takes a `Shapes` (the GPU's, or tiny
ones for --dry-run on CPU) and a `deadline` (time.monotonic()): rows it cannot start in time say so
instead of being measured. The row functions append to the list they are given, so the rows
measured before a failure are kept.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from vitfast import fused
from vitfast.bench.measure import time_calls
from vitfast.errors import describe_exception, first_line
from vitfast.kernels import add_layernorm as aln
from vitfast.kernels import attention as att
from vitfast.kernels import bias_gelu as bg
from vitfast.kernels import bias_swiglu as bs
from vitfast.kernels import linear_epilogue as le
from vitfast.kernels import linear_layernorm as ll
from vitfast.kernels import rope
from vitfast.kernels._common import describe_config
from vitfast.kernels.precompile import precompile
from vitfast.layers import apply_rope
from vitfast.layers import rope_tables as layer_rope_tables

DISPATCH_TABLE = Path(__file__).resolve().parents[1] / "kernels" / "mlp_dispatch.json"
ATTENTION_TABLE = DISPATCH_TABLE.with_name("attention_dispatch.json")
NOT_REACHED = {"status": "not reached", "reason": "the part's time box ran out before this row"}


@dataclass(frozen=True)
class Shapes:
    """What one run measures: the GPU's shapes, or tiny ones under the interpreter (--dry-run)."""

    device: str
    dtypes: tuple[torch.dtype, ...]
    copy_elems: int
    matmul_n: int
    attention: tuple[tuple[int, int, int, int], ...]  # (B, N, H, D), in dtypes[0]
    attention_fp32: tuple[tuple[int, int, int, int], ...]  # (B, N, H, D), in fp32
    layernorm: tuple[tuple[int, int], ...]  # (rows, C)
    activations: tuple[tuple[str, int, int], ...]  # (op, rows, MLP width H): bias+GELU reads and writes H, bias+SwiGLU reads 2H
    mlp: dict  # model -> (C, hidden)
    mlp_batches: tuple[int, ...]
    profile: tuple[str, dict, int]  # (model, overrides, batch) of the per-kernel forward profile
    rope: tuple[tuple[str, dict], ...]  # (DINOv3 or EVA-02 model, overrides) whose packed qkv the RoPE rows rotate
    rope_batches: tuple[int, ...]
    tma: tuple[tuple[int, int, int], ...]  # (M, K, N) of the TMA GEMMs' check (`tma_check`)
    host_batches: tuple[int, ...] = (64, 1)  # of the profile's model, in gpu_host.py's host-time rows (64: the open question)
    host_s: float = 30  # those rows' own time box, compiling ahead included (they come first in the part)
    tokens: int = 197
    iters: int = 100


GPU = Shapes(
    device="cuda", dtypes=(torch.float16, torch.bfloat16), copy_elems=1 << 28, matmul_n=8192,
    # + ViT-B/16 at batch 1 and 8: the attention dispatch table's small batch x heads buckets
    attention=tuple((B, N, 12, D) for N, B in ((197, 256), (577, 64), (1025, 16)) for D in (64, 80, 128)) + ((1, 197, 12, 64), (8, 197, 12, 64)),
    attention_fp32=((64, 197, 12, 64),),
    layernorm=tuple((256 * 197, C) for C in (384, 768, 1024)),
    activations=(("bias+gelu", 256 * 197, 3072), ("bias+swiglu", 16 * 1370, 4096)),  # ViT-B/16 batch 256; giant/14 518 px batch 16
    # most important first, as a time box cuts the rest: ViT-B (the goals' model), large batches first (the
    # H200 run of 2026-11-27 reached ViT-S batch 1 and 8 only)
    mlp={"vit_base": (768, 3072), "vit_large": (1024, 4096), "vit_small": (384, 1536)}, mlp_batches=(256, 64, 8, 1),
    profile=("vit_base_patch16_224", {}, 256),
    # rotate-half, then interleaved at EVA-02's fine-tune size: EVA-02 L 448 px's qkv is 1.6 GB at batch 256, its
    # float64 check peaks near 30 GB (measured on CPU at batch 8, scaled)
    rope=tuple((f"vit_{size}_patch16_dinov3", {}) for size in ("small", "base", "large"))
    + tuple((f"eva02_{size}_patch14_448", {}) for size in ("base", "large")), rope_batches=(64, 256),
    # ViT-B/16 batch 8's fc1 and fc2 (M = 1576: a partial last row of tiles, 156 tiles on 132 SMs, so programs
    # take a second tile), and widths that end in partial tiles of every dimension
    tma=((8 * 197, 768, 3072), (8 * 197, 3072, 768), (77, 392, 1000)),
)  # fmt: skip
DRY_RUN = Shapes(
    device="cpu", dtypes=(torch.float32,), copy_elems=1 << 16, matmul_n=128,
    attention=((2, 13, 2, 32), (1, 9, 1, 80)), attention_fp32=((1, 9, 1, 32),), layernorm=((10, 96),),
    activations=(("bias+gelu", 10, 96), ("bias+swiglu", 7, 48)), mlp={"tiny": (32, 128)}, mlp_batches=(1, 2),
    profile=("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 2}, 2),
    rope=(("vit_small_patch16_dinov3", {"img_size": 48, "embed_dim": 48, "num_heads": 3}),
          ("eva02_tiny_patch14_224", {"img_size": 42, "embed_dim": 48, "num_heads": 2})), rope_batches=(1, 2),
    tma=((10, 32, 128), (7, 40, 24)), host_batches=(2, 1), host_s=600, tokens=5, iters=3,
)  # fmt: skip


def median_ms(fn, inputs: list, device: str = "cuda", iters: int = 100) -> float:
    """Median ms of fn(*inputs[i]) with i rotating (so repeated calls do not time a warm cache on one
    buffer), after a few untimed calls. On a GPU this is device time ("cuda-device"): events right
    around a short call time the host's launch path instead (the H100 run of 2026-11-26: add+LayerNorm
    0.17-0.19 ms at every width, the batch-1 MLP GEMMs 0.12-0.18 ms, the attention at batch 256 1.7x
    its autotuner's own figure)."""
    timer = "cuda-device" if device == "cuda" else "perf_counter_ns"
    call = lambda args: fn(*args)  # noqa: E731
    time_calls(call, inputs, min(iters, 10), 30.0, torch.device(device), timer)
    return statistics.median(time_calls(call, inputs, iters, 10.0, torch.device(device), timer))


def rel_err(out, ref) -> float:
    """Relative L2 error; for (residual, normalised) pairs the larger of the two."""
    if isinstance(out, tuple):
        return max(rel_err(o, r) for o, r in zip(out, ref))
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def tuning(tuner, call) -> dict:
    """Run `call` once (the first call of a shape autotunes) and return the config the autotuner
    picked, with the median ms of every config it tried when this call did the tuning (None when
    it came from a cache or there was one config), so a GPU session can see which tiles matter. A call
    that never launched `tuner` (another kernel ran: the H100 run of 2026-11-27 asked for the pointer
    kernel's tuner where the op took the TMA kernel) says so instead of a stale or empty pick; the row's timings stand."""
    tuner.best_config, timings_before = None, getattr(tuner, "configs_timings", None)  # Triton sets both in run()
    call()
    if tuner.best_config is None:
        kernel = getattr(tuner, "base_fn", tuner).__name__
        return {"picked": None, "error": f"the call did not launch {kernel}: the row names the wrong kernel"}
    timings = getattr(tuner, "configs_timings", None)
    timings = timings if timings is not timings_before else None
    return {"picked": describe_config(tuner.best_config),
            "ms_by_config": {describe_config(c): _first(t) for c, t in timings.items()} if timings else None}  # fmt: skip


def _first(timing) -> float:
    """do_bench's result as the autotuner keeps it: the median first when it asked for quantiles."""
    return float(timing[0] if isinstance(timing, (list, tuple)) else timing)


def randn(device: str, dtype: torch.dtype, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """Normal(0, scale^2) values drawn in fp32, then cast: the GEMM rows' operands."""
    return (scale * torch.randn(*shape, device=device)).to(dtype)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------- compiling ahead
# Each timed section first compiles, in parallel, every kernel x config its rows will autotune
# (kernels/precompile.py; inputs are allocated, never read), so the time box goes to measuring
# rather than to Triton compiling one config after another. Only a speed-up: a failure is recorded
# and the section runs anyway, compiling as it goes.
def best_effort(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs) -> dict:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            return {"launches": 0, "compiled": 0, "reason": f"compiling ahead failed: {describe_exception(exc)}"}

    return run


@best_effort
def warm_model(cfg, dtype: torch.dtype, device: str, batches, mlps=("auto", "epilogue")) -> dict:
    """Compile ahead what optimize(model, mlp=...) launches at each batch (on a model of its own)."""
    import vitfast

    with torch.device(device):  # initialised where it runs: a ViT-L's CPU init would take seconds
        model = vitfast.create_model(cfg).to(dtype=dtype).eval()

    def forward(mlp: str, batch: int):
        vitfast.optimize(model, mlp=mlp)
        model(torch.empty(batch, cfg.in_chans, *cfg.img_hw, device=device, dtype=dtype))

    with torch.no_grad():
        return precompile(*(lambda m=m, b=b: forward(m, b) for m in mlps for b in batches))


@best_effort
def warm_attention(s: Shapes) -> dict:
    return precompile(*(lambda B=B, N=N, H=H, D=D, dtype=dtype: att.fused_attention(torch.empty(B, N, 3, H, D, device=s.device, dtype=dtype), D**-0.5)
                        for (B, N, H, D), dtype in attention_cases(s)))  # fmt: skip


def attention_cases(s: Shapes):
    """((B, N, H, D), dtype) of every attention row."""
    yield from ((shape, s.dtypes[0]) for shape in s.attention)
    yield from ((shape, torch.float32) for shape in s.attention_fp32)


@best_effort
def warm_mlp(s: Shapes) -> dict:
    """Both paths of every row of `mlp_gemms`: the epilogue GEMMs and the standalone kernels."""

    def calls(dtype, C, hidden, M):
        def e(*shape):
            return torch.empty(*shape, device=s.device, dtype=dtype)

        return (lambda: le.linear_bias_gelu(e(M, C), e(hidden, C), e(hidden), "none"),
                lambda: le.linear_epilogue_launch(e(M, C), e(hidden, C), e(hidden), e(M, hidden), gelu="none", kernel="pointer"),
                lambda: ll.linear_residual_layernorm_launch(e(M, hidden), e(C, hidden), e(C), e(M, C), e(C), e(C), e(C), 1e-6, e(M, C), e(M, C),
                                                            kernel="pointer"),
                lambda: ll.linear_residual_layernorm_launch(e(M, C), e(C, C), e(C), e(M, C), e(C), e(C), e(C), 1e-6, e(M, C), e(M, C),
                                                            kernel="pointer"),
                lambda: ll.linear_residual_layernorm(e(M, hidden), e(C, hidden), e(C), e(M, C), e(C), e(C), e(C), 1e-6),
                lambda: ll.linear_residual_layernorm(e(M, C), e(C, C), e(C), e(M, C), e(C), e(C), e(C), 1e-6),
                lambda: aln.add_layernorm(e(M, C), e(M, C), e(C), e(C), 1e-6, e(C)),
                lambda: aln.layernorm(e(M, C), e(C), e(C), 1e-6))  # fmt: skip

    return precompile(*(c for dtype, _, C, hidden, _, M in mlp_shapes(s) for c in calls(dtype, C, hidden, M)))


@best_effort
def warm_rope(s: Shapes) -> dict:
    def call(dtype, cfg, B):
        qkv = torch.empty(B, cfg.seq_len, 3, cfg.num_heads, cfg.head_dim, device=s.device, dtype=dtype)
        rope.rope_qkv(qkv, *rope_tables(cfg, s.device), interleaved(cfg))

    return precompile(*(lambda d=dtype, c=cfg, B=B: call(d, c, B) for dtype, _, cfg, B in rope_cases(s)))


def rope_cases(s: Shapes):
    """(dtype, model, config, batch) of every RoPE row."""
    import vitfast

    for dtype in s.dtypes:
        for model, overrides in s.rope:
            cfg = vitfast.get_config(model, **overrides)
            for B in s.rope_batches:
                yield dtype, model, cfg, B


def interleaved(cfg) -> bool:
    """The model's RoPE layout: EVA-02's axial tables rotate pairs (2j, 2j + 1), DINOv3's the halves."""
    return cfg.rope == "axial"


def rope_tables(cfg, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (cos, sin) [patches, D] a RoPE model hands its blocks: fp32 tables, which an fp16 or bf16 model
    keeps in fp32 (RopeTables; the kernel rotates in fp32, apply_rope casts them to q's dtype)."""
    grid = (cfg.rope_ref_grid, cfg.rope_grid_indexing, cfg.rope_grid_offset)
    return layer_rope_tables(cfg.rope, cfg.grid_size, cfg.head_dim, cfg.rope_base, torch.float32, device, *grid)


def mlp_shapes(s: Shapes):
    """(dtype, model, C, hidden, batch, M = batch x tokens) of every MLP row."""
    for dtype in s.dtypes:
        for model, (C, hidden) in s.mlp.items():
            for batch in s.mlp_batches:
                yield dtype, model, C, hidden, batch, batch * s.tokens


def ceilings(s: Shapes) -> dict:
    bufs = [(torch.randn(s.copy_elems, device=s.device), torch.empty(s.copy_elems, device=s.device)) for _ in range(2)]
    bufs = [(a.half(), b.half()) for a, b in bufs]
    copy_ms = median_ms(lambda a, b: b.copy_(a), bufs, s.device, s.iters)
    out = {"copy_GBps": 2 * s.copy_elems * 2 / copy_ms / 1e6}
    del bufs
    for dtype in s.dtypes:
        mats = [tuple(torch.randn(s.matmul_n, s.matmul_n, device=s.device, dtype=dtype) for _ in range(2)) for _ in range(2)]
        ms = median_ms(torch.mm, mats, s.device, max(s.iters // 4, 3))
        out[f"matmul_{dtype_name(dtype)}_TFLOPs"] = 2 * s.matmul_n**3 / ms / 1e9
    return out


def _sdpa(backend_name: str):
    """SDPA on the packed qkv's views as FusedBlock's "sdpa" path runs it, on one backend, or
    ("default") on the one PyTorch picks."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "default": None}[backend_name]  # fmt: skip

    def run(qkv):
        B, N, _, H, D = qkv.shape
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # views, last stride 1
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            o = F.scaled_dot_product_attention(q, k, v)
        return o.transpose(1, 2).reshape(B, N, H * D)  # back to token-major (a copy unless SDPA wrote it so)

    return run


def attention_speed(s: Shapes, deadline: float, rows: list) -> list[dict]:
    for (B, N, H, D), dtype in attention_cases(s):
        row = dict(B=B, N=N, H=H, D=D, dtype=dtype_name(dtype))
        if time.monotonic() > deadline:
            rows.append(row | NOT_REACHED)
            continue
        flops = 4 * B * H * N * N * D  # QK^T and PV
        qkvs = [(torch.randn(B, N, 3, H, D, device=s.device, dtype=dtype),) for _ in range(3)]
        row["tuning"] = tuning(att._attention_fwd_kernel, lambda: att.fused_attention(*qkvs[0], D**-0.5))
        ours = median_ms(lambda qkv: att.fused_attention(qkv, D**-0.5), qkvs, s.device, s.iters)
        row |= dict(status="ok", vitfast_ms=ours, vitfast_TFLOPs=flops / ours / 1e9)
        for name in ("flash", "efficient", "cudnn", "default"):
            try:
                ms = median_ms(_sdpa(name), qkvs, s.device, s.iters)
                row |= {f"sdpa_{name}_ms": ms, f"sdpa_{name}_TFLOPs": flops / ms / 1e9}
            except RuntimeError as exc:  # this backend does not take the shape / dtype / device
                row[f"sdpa_{name}_reason"] = first_line(exc)
        best = min((row[k] for k in row if k.startswith("sdpa_") and k.endswith("_ms")), default=None)
        row["speedup_vs_best_sdpa"] = best / ours if best else None
        row["speedup_vs_sdpa_default"] = row["sdpa_default_ms"] / ours if "sdpa_default_ms" in row else None
        rows.append(row)
        del qkvs
    return rows


def layernorm_speed(s: Shapes, copy_GBps: float, deadline: float, rows: list) -> list[dict]:
    dtype = s.dtypes[0]
    for M, C in s.layernorm:
        row = dict(C=C, rows=M, dtype=dtype_name(dtype))
        if time.monotonic() > deadline:
            rows.append(row | NOT_REACHED)
            continue
        sets = [tuple(torch.randn(M, C, device=s.device, dtype=dtype) for _ in range(2)) for _ in range(3)]
        w, b = torch.randn(C, device=s.device, dtype=dtype), torch.randn(C, device=s.device, dtype=dtype)
        nbytes = 4 * M * C * sets[0][0].element_size()  # read x, y; write x + y, LN(x + y)
        rows.append(row | bandwidth(s, sets, nbytes, copy_GBps, lambda x, y: aln.add_layernorm(x, y, w, b, 1e-6),
                                    lambda x, y: F.layer_norm(x + y, (C,), w, b, 1e-6)))  # fmt: skip
    return rows


def bandwidth(s: Shapes, sets: list, nbytes: int, copy_GBps: float, ours_fn, torch_fn) -> dict:
    """A memory-bound kernel and the PyTorch ops it replaces, timed on the same rotating inputs: ms, GB/s
    (`nbytes` moved per call) and our GB/s as a fraction of the copy bandwidth."""
    ours, ref = (median_ms(fn, sets, s.device, s.iters) for fn in (ours_fn, torch_fn))
    gbps = nbytes / ours / 1e6
    return dict(status="ok", vitfast_ms=ours, torch_ms=ref, vitfast_GBps=gbps, torch_GBps=nbytes / ref / 1e6, fraction_of_copy=gbps / copy_GBps)


def activation_speed(s: Shapes, copy_GBps: float, deadline: float, rows: list) -> list[dict]:
    """The bias + activation kernels vs the PyTorch ops they replace, in GB/s and as a fraction of copy bandwidth."""
    dtype = s.dtypes[0]
    ops = {  # op -> (fc1 output width, ours, torch's)
        "bias+gelu": (1, lambda x, b: bg.bias_gelu(x, b, "none"), lambda x, b: F.gelu(x + b)),
        "bias+swiglu": (2, bs.bias_swiglu, lambda x, b: (lambda g, v: F.silu(g) * v)(*(x + b).chunk(2, dim=-1))),
    }
    for op, M, H in s.activations:
        row = dict(op=op, rows=M, H=H, dtype=dtype_name(dtype))
        if time.monotonic() > deadline:
            rows.append(row | NOT_REACHED)
            continue
        width, ours_fn, torch_fn = ops[op]
        sets = [(torch.randn(M, width * H, device=s.device, dtype=dtype),) for _ in range(3)]
        b = torch.randn(width * H, device=s.device, dtype=dtype)
        nbytes = (width + 1) * M * H * sets[0][0].element_size()  # read fc1's output, write the activation
        timed = bandwidth(s, sets, nbytes, copy_GBps, lambda x: ours_fn(x, b), lambda x: torch_fn(x, b))
        rows.append(row | timed | dict(speedup=timed["torch_ms"] / timed["vitfast_ms"]))
    return rows


def rope_speed(s: Shapes, copy_GBps: float, deadline: float, rows: list) -> list[dict]:
    """RoPE in each model's layout (`layout`: DINOv3's rotate-half, EVA-02's interleaved): the kernel (packed
    qkv in, a new packed qkv out) vs what the reference Attention runs between its qkv GEMM and SDPA
    (`apply_rope` on the q and k views), in GB/s and as a fraction of copy bandwidth. The kernel is first
    checked on the timed inputs against float64 in the same layout, next to the eager path's error (the 2x
    rule, as `gemm_row`), so a wrong kernel is not reported as a fast one."""
    for dtype, model, cfg, B in rope_cases(s):
        N, H, D = cfg.seq_len, cfg.num_heads, cfg.head_dim
        ilv = interleaved(cfg)
        row = dict(model=model, layout="interleaved" if ilv else "rotate_half", B=B, N=N, H=H, D=D, dtype=dtype_name(dtype))
        if time.monotonic() > deadline:
            rows.append(row | NOT_REACHED)
            continue
        cos, sin = rope_tables(cfg, s.device)

        def eager(qkv):  # Attention.forward with rope: q, k, v views of the packed qkv, then q and k rotated
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            return apply_rope(q, cos, sin, ilv), apply_rope(k, cos, sin, ilv), v

        sets = [(torch.randn(B, N, 3, H, D, device=s.device, dtype=dtype),) for _ in range(3)]
        qkv = sets[0][0]
        exact = rope.rope_reference(qkv.double(), cos.double(), sin.double(), ilv)
        # into a NaN-filled output, so an element the kernel leaves unwritten fails the check
        vitfast_err = rel_err(rope.rope_qkv_launch(qkv, cos, sin, torch.full_like(qkv, float("nan")), ilv), exact)
        torch_err = rel_err(torch.stack(eager(qkv)).permute(1, 3, 0, 2, 4), exact)  # [3, B, H, N, D] -> [B, N, 3, H, D]
        del exact
        nbytes = 2 * qkv.nbytes + cos.nbytes + sin.nbytes  # read qkv, write the new one; the tables once (cached after)
        timed = bandwidth(s, sets, nbytes, copy_GBps, lambda x: rope.rope_qkv(x, cos, sin, ilv), eager)
        rows.append(row | timed | dict(speedup=timed["torch_ms"] / timed["vitfast_ms"], torch_rel_err=torch_err,
                                       vitfast_rel_err=vitfast_err, passes_2x_rule=vitfast_err <= 2 * torch_err + 1e-3))  # fmt: skip
        del sets, qkv
    return rows


def tma_check(s: Shapes) -> dict:
    """The TMA GEMMs forced (kernel="tma") at s.tma's (M, K, N), fp16, before anything times them: fc1's
    bias + GELU, fc2's bias + LayerScale + residual, and proj / fc2 + residual + LayerNorm, each into
    NaN-filled outputs (an element a tile leaves unwritten fails), checked against fp32 with the 2x rule
    next to plain PyTorch in fp16. gpu_proof.py runs this in a process of its own (a fault on the device
    poisons the process's CUDA context) and sets VITFAST_TMA=0 for everything after when a row fails.
    Returns {"rows": one per check, "precompile": compiling ahead's counts}."""
    dtype, rows, cases = torch.float16, [], []
    rand = functools.partial(randn, s.device, dtype)

    def nan(M, N):
        return torch.full((M, N), float("nan"), device=s.device, dtype=dtype)

    for M, K, N in s.tma:
        x, w, b, res = rand(M, K), rand(N, K, scale=K**-0.5), rand(N), rand(M, N)
        gamma, lnw, lnb = rand(N, scale=0.1), 1 + rand(N, scale=0.1), rand(N, scale=0.1)
        row = dict(M=M, K=K, N=N, dtype=dtype_name(dtype))

        def layernorm(x=x, w=w, b=b, res=res, gamma=gamma, lnw=lnw, lnb=lnb, M=M, N=N):
            outs = nan(M, N), nan(M, N)
            ll.linear_residual_layernorm_launch(x, w, b, res, gamma, lnw, lnb, 1e-6, *outs, kernel="tma")
            return outs

        cases += [
            (dict(op="bias+gelu") | row, lambda x=x, w=w, b=b, M=M, N=N: le.linear_epilogue_launch(
                x, w, b, nan(M, N), gelu="none", kernel="tma"), lambda *a: le.linear_epilogue_reference(*a, "none"), (x, w, b)),
            (dict(op="bias+layerscale+residual") | row, lambda x=x, w=w, b=b, res=res, gamma=gamma, M=M, N=N:
                le.linear_epilogue_launch(x, w, b, nan(M, N), residual=res, gamma=gamma, kernel="tma"),
                lambda x, w, b, res, gamma: le.linear_epilogue_reference(x, w, b, residual=res, gamma=gamma), (x, w, b, res, gamma)),
            (dict(op="bias+layerscale+residual+layernorm") | row, layernorm,
                lambda *a: ll.linear_residual_layernorm_reference(*a, 1e-6), (x, w, b, res, gamma, lnw, lnb)),
        ]  # fmt: skip
    compiled = precompile(*(run for _, run, _, _ in cases)) if s.device == "cuda" else {}
    for row, run, reference, args in cases:
        try:
            exact = reference(*(t.float() for t in args))
            torch_err, tma_err = rel_err(reference(*args), exact), rel_err(run(), exact)
            _sync(s.device)
        except Exception as exc:  # an illegal address surfaces here, or at the next call
            rows.append(row | {"status": "error", "reason": describe_exception(exc), "passes_2x_rule": False})
            continue
        rows.append(row | dict(status="ok", tma_rel_err=tma_err, torch_rel_err=torch_err, passes_2x_rule=tma_err <= 2 * torch_err + 1e-3))
    return {"rows": rows, "precompile": compiled}


def mlp_gemms(s: Shapes, deadline: float, rows: list) -> list[dict]:
    """Per dtype, model width and batch: fc1, fc2 and proj, cuBLAS + separate kernels vs one Triton GEMM."""
    for dtype in s.dtypes:
        rand = functools.partial(randn, s.device, dtype)
        for model, (C, hidden) in s.mlp.items():
            w1, b1 = rand(hidden, C, scale=C**-0.5), rand(hidden)  # nn.Linear layout [out, in]
            w2, b2 = rand(C, hidden, scale=hidden**-0.5), rand(C)
            wp, bp = rand(C, C, scale=C**-0.5), rand(C)
            gamma, lnw, lnb = rand(C, scale=0.1), 1 + rand(C, scale=0.1), rand(C, scale=0.1)
            for batch in s.mlp_batches:
                M = batch * s.tokens
                common = dict(model=model, dtype=dtype_name(dtype), C=C, hidden=hidden, batch=batch, M=M, m_bucket=fused.m_bucket(M))
                if time.monotonic() > deadline:
                    rows += [dict(op=op, **common) | NOT_REACHED for op in ("fc1", "fc2", "proj")]
                    continue
                hs = [(rand(M, C),) for _ in range(3)]
                tma = le.takes_tma("auto", "fc1", hs[0][0], w1, None, hs[0][0].new_empty(M, hidden))  # what the op launches: x, w, residual, out
                rows.append(gemm_row(
                    "fc1+bias+gelu", common, 2 * M * C * hidden, s, hs, le._linear_epilogue_tma_kernel if tma else le._linear_epilogue_kernel,
                    cublas=lambda h: F.gelu(F.linear(h, w1, b1)),  # what FusedBlock's cuBLAS path runs for GELU
                    epilogue=lambda h: le.linear_bias_gelu(h, w1, b1, "none"),
                    reference=lambda h, w, b: le.linear_epilogue_reference(h, w, b, "none"), ref_args=(w1, b1),
                    # bias_gelu: fc1's third path, cuBLAS without the bias, then the bias+GELU kernel (its erfc form);
                    # optimize(approximate_gelu=True): GELU's tanh form in cuBLASLt's epilogue, its error still vs erf;
                    # on Hopper the epilogue column is the TMA kernel, and `pointer` the kernel it replaced there
                    variants={"bias_gelu": lambda h: bg.bias_gelu(F.linear(h, w1), b1, "none"),
                              "cublaslt_tanh": lambda h: fused.linear_gelu_tanh(h, w1, b1)} | ({"pointer": lambda h: le.linear_epilogue_launch(
                        h, w1, b1, h.new_empty(M, hidden), gelu="none", kernel="pointer")} if tma else {}),
                    more={"epilogue_kernel": "tma" if tma else "pointer"},
                ))  # fmt: skip
                for op, K, w, b in (("fc2", hidden, w2, b2), ("proj", C, wp, bp)):
                    ins = [(rand(M, K), rand(M, C)) for _ in range(3)]
                    tma = le.takes_tma("auto", op, ins[0][0], w)

                    def pointer(y, x, w=w, b=b):  # the kernel a trace launches, where eager takes the TMA one
                        r, out = torch.empty_like(x), torch.empty_like(x)
                        ll.linear_residual_layernorm_launch(y, w, b, x, gamma, lnw, lnb, 1e-6, r, out, kernel="pointer")
                        return r, out

                    rows.append(gemm_row(
                        f"{op}+bias+layerscale+residual+layernorm", common, 2 * M * K * C, s, ins,
                        ll._linear_residual_layernorm_tma_kernel if tma else ll._linear_residual_layernorm_kernel,
                        cublas=lambda y, x, w=w, b=b: aln.add_layernorm(x, F.linear(y, w, b), lnw, lnb, 1e-6, gamma),
                        epilogue=lambda y, x, w=w, b=b: ll.linear_residual_layernorm(y, w, b, x, gamma, lnw, lnb, 1e-6),
                        reference=lambda y, x, w, b, *rest: ll.linear_residual_layernorm_reference(y, w, b, x, *rest, 1e-6),
                        ref_args=(w, b, gamma, lnw, lnb), variants={"pointer": pointer} if tma else {},
                        # the residual add inside cuBLAS's GEMM (beta = 1 reads x as its C) and a LayerNorm that reads
                        # one tensor: the data movement of carrying the branch's bias to the next norm instead of adding
                        # it here (not built: benchmarks/NOTES.md, "Residual inside cuBLAS"); no bias, so timed only
                        timed={"residual_in_cublas": lambda y, x, w=w: aln.layernorm(torch.addmm(x, y, w.t()), lnw, lnb, 1e-6)},
                        more={"epilogue_kernel": "tma" if tma else "pointer"},
                    ))  # fmt: skip
                    del ins
                del hs
    return rows


def gemm_row(op: str, common: dict, flops: int, s: Shapes, inputs: list, tuner, *, cublas, epilogue, reference, ref_args,
             variants: dict | None = None, timed: dict | None = None, more: dict | None = None) -> dict:  # fmt: skip
    """Both paths timed on the same rotating inputs; errors relative to the fp32 result, next to
    plain PyTorch's (the reference in the same dtype) for the 2x rule. `variants`: more paths by name,
    each timed and checked the same way (columns `<name>_ms`, `<name>_TFLOPs`, `<name>_speedup` over the
    cuBLAS path, `<name>_rel_err`, `<name>_passes_2x_rule`); `timed`: paths that compute something else
    with the same data movement, timed only (`<name>_ms`, `<name>_speedup`); `more`: fields copied into the row."""
    tuned = tuning(tuner, lambda: epilogue(*inputs[0]))
    cublas_ms, epilogue_ms = median_ms(cublas, inputs, s.device, s.iters), median_ms(epilogue, inputs, s.device, s.iters)
    args = (*inputs[0], *ref_args)
    exact = reference(*(t.float() for t in args))
    torch_err = rel_err(reference(*args), exact)
    cublas_err, epilogue_err = rel_err(cublas(*inputs[0]), exact), rel_err(epilogue(*inputs[0]), exact)
    more = dict(more or {})
    for name, fn in (variants or {}).items():
        ms, err = median_ms(fn, inputs, s.device, s.iters), rel_err(fn(*inputs[0]), exact)
        more |= {f"{name}_ms": ms, f"{name}_TFLOPs": flops / ms / 1e9, f"{name}_speedup": cublas_ms / ms, f"{name}_rel_err": err,
                 f"{name}_passes_2x_rule": err <= 2 * torch_err + 1e-3}  # fmt: skip
    for name, fn in (timed or {}).items():
        ms = median_ms(fn, inputs, s.device, s.iters)
        more |= {f"{name}_ms": ms, f"{name}_speedup": cublas_ms / ms}
    return more | dict(op=op, **common, status="ok", cublas_ms=cublas_ms, epilogue_ms=epilogue_ms,
                cublas_TFLOPs=flops / cublas_ms / 1e9, epilogue_TFLOPs=flops / epilogue_ms / 1e9,
                speedup=cublas_ms / epilogue_ms, faster="epilogue" if epilogue_ms < cublas_ms else "cublas",
                torch_rel_err=torch_err, cublas_rel_err=cublas_err, epilogue_rel_err=epilogue_err,
                passes_2x_rule=epilogue_err <= 2 * torch_err + 1e-3, tuning=tuned)  # fmt: skip


# kernel name patterns -> category, first match wins (cuBLAS names its kernels gemm / xmma /
# cutlass / nvjet; vitfast's GEMMs with a LayerNorm epilogue count as GEMMs)
KERNEL_CATEGORIES = (
    ("attention", ("attention", "attn", "fmha", "flash")),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "linear", "matmul", "aten::mm", "aten::addmm")),
    ("layernorm", ("layer_norm", "layernorm")),
    ("gelu", ("gelu",)),
    ("swiglu", ("swiglu", "silu")),
    ("elementwise", ("elementwise", "copy", "cat", "add", "mul", "fill")),
)


def kernel_category(name: str) -> str:
    low = name.lower()
    return next((cat for cat, words in KERNEL_CATEGORIES if any(w in low for w in words)), "other")


def forward_profile(s: Shapes, deadline: float, iters: int = 10) -> dict:
    """Where one forward's GPU time goes (torch.profiler, kernels only), eager vs optimize() on
    each MLP path: per kernel, launches and microseconds per forward, and totals per category, so
    a missed end-to-end goal can be traced to a kernel in the same call. Under --dry-run the
    profile is of CPU ops (the plumbing runs; the figures mean nothing)."""
    import vitfast
    from torch.profiler import ProfilerActivity, profile

    name, overrides, batch = s.profile
    dtype, gpu = s.dtypes[0], s.device == "cuda"
    cfg = vitfast.get_config(name, **overrides)
    model = vitfast.create_model(cfg).to(device=s.device, dtype=dtype).eval()
    x = torch.randn(batch, cfg.in_chans, *cfg.img_hw, device=s.device, dtype=dtype)
    result = {"model": name, "overrides": overrides, "batch": batch, "dtype": dtype_name(dtype), "iters": iters, "backends": {}}
    variants = (("eager", None), ("optimize mlp=auto", dict(mlp="auto")), ("optimize mlp=auto approximate_gelu", dict(mlp="auto", approximate_gelu=True)),
                ("optimize mlp=epilogue", dict(mlp="epilogue")))  # fmt: skip
    for label, options in variants:
        if time.monotonic() > deadline:
            result["backends"][label] = dict(NOT_REACHED)
            continue
        if options:
            vitfast.optimize(model, **options)
        with torch.no_grad():
            for _ in range(3):  # autotuning and compiles stay out of the profile
                model(x)
            _sync(s.device)
            with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu) as prof:  # kernels: the CUDA rows
                for _ in range(iters):
                    model(x)
                _sync(s.device)
        if options:
            vitfast.restore(model)
        result["backends"][label] = kernel_table(prof.key_averages(), iters, gpu)
    return result


def kernel_table(averages, iters: int, gpu: bool, top: int = 15) -> dict:
    """Per-forward launches and time per kernel (the `top` slowest listed) and per category."""
    rows = []
    for e in averages:
        us = e.self_device_time_total if gpu else e.self_cpu_time_total
        if us > 0 and (not gpu or e.device_type == torch.autograd.DeviceType.CUDA):
            rows.append({"kernel": e.key[:120], "category": kernel_category(e.key), "launches": e.count / iters, "us": us / iters})
    rows.sort(key=lambda r: -r["us"])
    total = sum(r["us"] for r in rows)
    by_category: dict[str, float] = {}
    for r in rows:
        r["share"] = r["us"] / total
        by_category[r["category"]] = by_category.get(r["category"], 0.0) + r["us"]
    return {"status": "ok", "us_per_forward": total, "launches_per_forward": sum(r["launches"] for r in rows),
            "us_by_category": by_category, "kernels": rows[:top]}  # fmt: skip


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def write_attention_dispatch(rows: list[dict], env: dict, path: Path = ATTENTION_TABLE) -> list[dict]:
    """Merge this run's attention rows into the attention table at `path` (atomically); returns the
    new entries. A shape gets "sdpa" only where SDPA's default backend was >= min_speedup faster than
    the autotuned kernel; entries of other GPUs and shapes are kept."""
    table = json.loads(path.read_text())
    min_speedup = table["min_speedup"]
    new = []
    for row in rows:
        if row.get("status") != "ok" or "sdpa_default_ms" not in row:
            continue
        faster = row["vitfast_ms"] / row["sdpa_default_ms"]  # > 1: SDPA is faster
        new.append(dict(compute_capability=env["compute_capability"], gpu=env["gpu"], dtype=row["dtype"], N=row["N"], head_dim=row["D"],
                        bh_bucket=fused.next_pow2(row["B"] * row["H"]), path="sdpa" if faster >= min_speedup else "vitfast",
                        vitfast_ms=round(row["vitfast_ms"], 5), sdpa_ms=round(row["sdpa_default_ms"], 5), git_sha=env["git_sha"],
                        command=env["command"]))  # fmt: skip
    merge_entries(path, table, new, lambda e: (e["compute_capability"], e["dtype"], e["N"], e["head_dim"], e["bh_bucket"]))
    fused.attention_dispatch_table.cache_clear()  # optimize(attention="auto") in this process sees the new table
    return new


def merge_entries(path: Path, table: dict, new: list[dict], key) -> None:
    """Write `table` to `path` (atomically: a temporary beside it, then a rename) with `new` in place of
    its entries of the same `key`, every entry in `key` order."""
    replaced = {key(e) for e in new}
    table["entries"] = sorted([e for e in table["entries"] if key(e) not in replaced] + new, key=key)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    os.replace(tmp, path)


def write_dispatch(rows: list[dict], env: dict, path: Path = DISPATCH_TABLE) -> list[dict]:
    """Merge this run's fc1/fc2 winners into the dispatch table at `path` (atomically); returns the
    new entries. A path other than "cublas" wins a shape only where it was >= min_speedup faster than
    cuBLAS + PyTorch's kernels and passed the 2x rule: "epilogue" (fc1, fc2), or for fc1 "bias_gelu"
    (cuBLAS without the bias, then vitfast's bias+GELU kernel), the faster of the two where both
    qualify. Entries of other GPUs and shapes are kept. `fc1_traced` / `fc2_traced`: the choices under
    torch.compile / torch.export, judged by the pointer kernels' own timings where eager timed the TMA ones."""
    table = json.loads(path.read_text())
    min_speedup = table["min_speedup"]

    def choice(row: dict, columns: dict[str, str]) -> str:
        """The fastest path that passed the 2x rule (`columns`: path -> the prefix of its row's speedup and
        passes_2x_rule columns; "cublas" is 1.0), "cublas" unless that path beat it by min_speedup."""
        speedups = {"cublas": 1.0} | {p: row[f"{c}speedup"] for p, c in columns.items() if row.get(f"{c}passes_2x_rule")}
        best = max(speedups, key=speedups.get)
        return best if speedups[best] >= min_speedup else "cublas"

    def traced(row: dict) -> str:  # the epilogue's columns in a trace: the pointer kernel's where eager ran the TMA one
        return "pointer_" if row.get("epilogue_kernel") == "tma" else ""

    by_shape: dict[tuple, dict] = {}
    for row in rows:
        if row.get("status", "ok") == "ok":
            key = (row["dtype"], row["C"], row["hidden"], row["m_bucket"])
            by_shape.setdefault(key, {})[row["op"].split("+")[0]] = row
    new = []
    for (dtype, C, hidden, bucket), ops in sorted(by_shape.items()):
        if not {"fc1", "fc2"} <= ops.keys():
            continue
        fc1, fc2 = ops["fc1"], ops["fc2"]
        new.append(dict(compute_capability=env["compute_capability"], gpu=env["gpu"], dtype=dtype, C=C, hidden=hidden,
                        m_bucket=bucket, fc1=choice(fc1, {"epilogue": "", "bias_gelu": "bias_gelu_"}), fc2=choice(fc2, {"epilogue": ""}),
                        fc1_traced=choice(fc1, {"epilogue": traced(fc1), "bias_gelu": "bias_gelu_"}),
                        fc2_traced=choice(fc2, {"epilogue": traced(fc2)}), fc1_speedup=round(fc1["speedup"], 3),
                        fc2_speedup=round(fc2["speedup"], 3))
                   | ({"fc1_bias_gelu_speedup": round(fc1["bias_gelu_speedup"], 3)} if "bias_gelu_speedup" in fc1 else {})
                   | dict(git_sha=env["git_sha"], command=env["command"]))  # fmt: skip
    merge_entries(path, table, new, lambda e: (e["compute_capability"], e["dtype"], e["C"], e["m_bucket"], e["hidden"]))
    fused.mlp_dispatch_table.cache_clear()  # optimize(mlp="auto") in this process sees the new table
    return new
