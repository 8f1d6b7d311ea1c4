"""Flash-style fused attention forward (inference) straight from the packed qkv projection.

q, k and v are read from the qkv Linear's output `[B, N, 3, H, D]` through strides (no
permute/contiguous copies) and the result is written as `[B, N, H*D]`, ready for the output
projection. Online softmax in base 2 with fp32 statistics and accumulation; any N, any head
dim up to 256 (non powers of two by masking, or as two column tiles where one would pad more:
80 = 64 + 16), fp16 / bf16 / fp32. Only the last query and key
tiles are masked, and with TAIL=16 they are 16 wide: at N = 197 a 64-row tiling computes 208 x 208
scores instead of 256 x 256. For N <= 256 in fp16/bf16, with the head dim in one tile and where shared memory
holds them, the autotuner may also pick a whole-head program (`WHOLE` configs, `_whole_head`): all keys and
values of one (batch, head) read once, every query tile's scores in one softmax pass.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from vitfast.errors import InputError

from ._common import INT32_MAX, INTERPRET, autotune, check_device, next_pow2, require_fitting_config, runs_reference, span, vitfast_op, wrap_triton

LOG2E = 1.0 / math.log(2.0)  # exp(x) = exp2(x / ln 2): folded into the softmax scale


def _configs() -> list[triton.Config]:
    if INTERPRET:  # the interpreter is slow and gains nothing from tuning: one config, with tail tiles
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "TAIL": 16, "WHOLE": False}, num_warps=4, num_stages=1)]
    # A short list, so a first call tunes in seconds: wide query tiles for the large batches,
    # 8-warp variants that keep fp32 (IEEE products) out of register spills (ptxas counts in
    # `python -m vitfast.kernels.aot`), and the small (64, 32) tiles that still fit fp32 at
    # head_dim 128 on 99 KB parts. TAIL=16: the last N % BLOCK rows and keys in 16-wide tiles
    # (ViT's N is 2^k * m + 1: 197, 257, 577, 1025), added to the tiles the H100 picked in its first
    # run (benchmarks/results/gpu-proof-h100-18ef7c3). The autotuner only benchmarks those that fit the
    # device's shared memory (`shared_memory_bytes`).
    tiles = [
        (64, 32, 0, 4, 2), (64, 64, 0, 4, 3), (64, 64, 16, 4, 3), (128, 32, 0, 8, 2), (128, 32, 16, 8, 2),
        (128, 64, 0, 8, 3), (128, 64, 16, 8, 3), (128, 128, 16, 8, 2),
    ]  # fmt: skip
    flash = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "TAIL": t, "WHOLE": False}, num_warps=w, num_stages=s) for bm, bn, t, w, s in tiles]
    # WHOLE: one program per (batch, head) holding all of its keys and values (N <= BLOCK_N = 256, fp16/bf16,
    # one head-dim tile, where shared memory holds them), its query tiles in a loop, one softmax pass each: ViT's
    # N = 197 ran 3 key tiles per query tile in the tiles above, too few to fill their pipeline (benchmarks/NOTES.md,
    # "Attention at N = 197"). Listed first: VITFAST_TUNE_CONFIGS=2 (the GPU proof's pytest) keeps the first and
    # the last, so a whole-head config and the largest flash tile both run there
    whole = [triton.Config({"BLOCK_M": bm, "BLOCK_N": 256, "TAIL": 0, "WHOLE": True}, num_warps=w, num_stages=1) for bm, w in ((64, 4), (64, 8))]
    return whole + flash


def shared_memory_bytes(config: triton.Config, args: dict, capability: int) -> int:
    """Upper estimate of the kernel's shared memory for one config, fitted to and checked against
    the compiled kernels' `metadata.shared` on sm_80/89/90a (tests/test_aot_compile.py): buffered
    k and v tiles [BLOCK_N, BLOCK_D + BLOCK_D1] (num_stages of them for fp16/bf16 on Hopper,
    num_stages - 1 with cp.async before it and for fp32), the query tile, and the layout change of
    p. The tail tiles are smaller and share it."""
    elsize, block_d = args["QKV"].element_size(), args["BLOCK_D"] + args.get("BLOCK_D1", 0)
    bm, bn, stages = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_stages
    if config.kwargs.get("WHOLE"):  # all keys and values at once, the query tile, p: for 16-bit, one head-dim tile, N <= BLOCK_N
        # (N is absent only in require_fitting_config's question whether any config fits; a launch passes it)
        if elsize != 2 or args.get("BLOCK_D1", 0) or args.get("N", 0) > bn:
            return 1 << 40
        return 2 * bn * block_d * elsize + bm * block_d * elsize + bm * bn * elsize
    buffers = stages if capability >= 90 and elsize == 2 else stages - 1
    p = bm * (bn + 1) * 4 if elsize == 4 else bm * bn * elsize
    return max(buffers, 1) * 2 * bn * block_d * elsize + bm * block_d * elsize + p


def head_dim_tiles(D: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_D1): the head dim as one power-of-two tile (BLOCK_D1 = 0), or, where that would
    pad more, a power of two plus a smaller one: 80 = 64 + 16 (ViT-H/14), 72 -> 64 + 16 (SigLIP
    so400m), 96 = 64 + 32; 112 stays one 128-wide tile. Tiles are at least 16 wide (the tensor cores'
    K step)."""
    whole = max(next_pow2(D), 16)
    first = max(16, 1 << (D.bit_length() - 1))  # the largest power of two <= D
    if first >= D:
        return whole, 0
    second = max(16, next_pow2(D - first))
    return (first, second) if first + second < whole else (whole, 0)


def tail_tiles(block: int, tail: int) -> int:
    """Rows (or keys) per tail tile: TAIL, or (TAIL=0) one more tile of the full width."""
    return tail if tail else block


def programs_per_head(N: int, block_m: int, tail: int, whole: bool = False) -> int:
    """Query tiles of one (batch, head): N // BLOCK_M full ones, then the rest in tail tiles; one program
    for all of them (`whole`)."""
    if whole:
        return 1
    return N // block_m + triton.cdiv(N % block_m, tail_tiles(block_m, tail))


@triton.jit
def _tile(base, rows, offs_d, N, stride_n, stride_d, HEAD_DIM: tl.constexpr, MASK_ROWS: tl.constexpr, ROWS_FIRST: tl.constexpr):
    """Rows x head-dim columns of q, k or v: [len(rows), len(offs_d)], or (ROWS_FIRST=False) its
    transpose, as k^T is read; zeros past HEAD_DIM and (MASK_ROWS: the last tiles only) past N."""
    mask_d = offs_d < HEAD_DIM
    if ROWS_FIRST:
        ptrs = base + rows[:, None] * stride_n + offs_d[None, :] * stride_d
        if MASK_ROWS:
            mask = (rows < N)[:, None] & mask_d[None, :]
        else:
            mask = mask_d[None, :]
    else:
        ptrs = base + rows[None, :] * stride_n + offs_d[:, None] * stride_d
        if MASK_ROWS:
            mask = (rows < N)[None, :] & mask_d[:, None]
        else:
            mask = mask_d[:, None]
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _dot(a, b, acc, IEEE_FP32: tl.constexpr):
    """acc + a @ b in fp32: IEEE products for fp32 inputs (not TF32), tensor cores for fp16/bf16."""
    if IEEE_FP32:
        out = tl.dot(a, b, acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def _kv_tile(acc, acc1, m_i, l_i, q, q1, k_base, v_base, start_n, N, stride_n, stride_d, qk_scale,
             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D1: tl.constexpr, BLOCK_N: tl.constexpr,
             MASK_N: tl.constexpr, IEEE_FP32: tl.constexpr):  # fmt: skip
    """One online-softmax step over keys [start_n, start_n + BLOCK_N): scores, running max and sum,
    acc rescaled then p @ v accumulated into it by the dot. With BLOCK_D1 the head dim is two
    column tiles (q, q1; acc, acc1), else acc1 and q1 pass through unused. MASK_N: keys past N score
    -inf (the last tiles only)."""
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    s = tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32)
    s = _dot(q, _tile(k_base, cols, offs_d, N, stride_n, stride_d, HEAD_DIM, MASK_N, False), s, IEEE_FP32)
    if BLOCK_D1 > 0:
        offs_d1 = BLOCK_D + tl.arange(0, BLOCK_D1)
        s = _dot(q1, _tile(k_base, cols, offs_d1, N, stride_n, stride_d, HEAD_DIM, MASK_N, False), s, IEEE_FP32)
    if MASK_N:
        s = tl.where((cols < N)[None, :], s, float("-inf"))
    # the max of the raw scores, scaled once per row (qk_scale > 0), then scale and shift in one FMA per
    # score, as Triton's fused-attention tutorial does: the softmax, not the dots, bounds short sequences
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)  # rescales what was accumulated under the old max
    l_i = l_i * alpha + tl.sum(p, 1)
    p = p.to(q.dtype)
    acc = _dot(p, _tile(v_base, cols, offs_d, N, stride_n, stride_d, HEAD_DIM, MASK_N, True), acc * alpha[:, None], IEEE_FP32)
    if BLOCK_D1 > 0:
        acc1 = _dot(p, _tile(v_base, cols, offs_d1, N, stride_n, stride_d, HEAD_DIM, MASK_N, True), acc1 * alpha[:, None], IEEE_FP32)
    return acc, acc1, m_new, l_i


@triton.jit
def _query_tile(base, out_base, row0, N, stride_n, stride_3, stride_d, stride_on, stride_od, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D1: tl.constexpr, ROWS: tl.constexpr, MASK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, TAIL: tl.constexpr, IEEE_FP32: tl.constexpr):  # fmt: skip
    """Attention for query rows [row0, row0 + ROWS) of one (batch, head), written normalised. Keys in
    BLOCK_N tiles, all masked (TAIL=0), or (TAIL > 0) full tiles without masks then the last
    N % BLOCK_N keys in TAIL-wide masked tiles. (TAIL=0 keeps one loop: a second pipelined loop of
    BLOCK_N tiles would take a second set of shared-memory buffers.)"""
    rows = row0 + tl.arange(0, ROWS)
    offs_d = tl.arange(0, BLOCK_D)
    q = _tile(base, rows, offs_d, N, stride_n, stride_d, HEAD_DIM, MASK_M, True)  # rows past N: zeros, never stored
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    if BLOCK_D1 > 0:
        offs_d1 = BLOCK_D + tl.arange(0, BLOCK_D1)
        q1 = _tile(base, rows, offs_d1, N, stride_n, stride_d, HEAD_DIM, MASK_M, True)
        acc1 = tl.zeros([ROWS, BLOCK_D1], dtype=tl.float32)
    else:  # one column tile: these pass through the loops unused
        q1 = q
        acc1 = acc
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)  # running row max (base 2)
    l_i = tl.zeros([ROWS], dtype=tl.float32)  # running softmax denominator
    k_base, v_base = base + stride_3, base + 2 * stride_3
    if TAIL > 0:
        full = (N // BLOCK_N) * BLOCK_N
        for start_n in range(0, full, BLOCK_N):
            acc, acc1, m_i, l_i = _kv_tile(acc, acc1, m_i, l_i, q, q1, k_base, v_base, start_n, N, stride_n, stride_d, qk_scale,
                                           HEAD_DIM, BLOCK_D, BLOCK_D1, BLOCK_N, False, IEEE_FP32)  # fmt: skip
        for start_n in range(full, N, TAIL):
            acc, acc1, m_i, l_i = _kv_tile(acc, acc1, m_i, l_i, q, q1, k_base, v_base, start_n, N, stride_n, stride_d, qk_scale,
                                           HEAD_DIM, BLOCK_D, BLOCK_D1, TAIL, True, IEEE_FP32)  # fmt: skip
    else:
        for start_n in range(0, N, BLOCK_N):
            acc, acc1, m_i, l_i = _kv_tile(acc, acc1, m_i, l_i, q, q1, k_base, v_base, start_n, N, stride_n, stride_d, qk_scale,
                                           HEAD_DIM, BLOCK_D, BLOCK_D1, BLOCK_N, True, IEEE_FP32)  # fmt: skip
    mask_m = rows < N
    out_ptrs = out_base + rows[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(out_ptrs, (acc / l_i[:, None]).to(out_base.dtype.element_ty), mask=mask_m[:, None] & (offs_d < HEAD_DIM)[None, :])
    if BLOCK_D1 > 0:
        out_ptrs = out_base + rows[:, None] * stride_on + offs_d1[None, :] * stride_od
        tl.store(out_ptrs, (acc1 / l_i[:, None]).to(out_base.dtype.element_ty), mask=mask_m[:, None] & (offs_d1 < HEAD_DIM)[None, :])


@triton.jit
def _whole_head(base, out_base, N, stride_n, stride_3, stride_d, stride_on, stride_od, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Attention for every query row of one (batch, head) with N <= BLOCK_N: its keys and values read once, then
    per BLOCK_M query rows all BLOCK_N scores at once and one softmax pass (no running max, no rescale)."""
    offs_d = tl.arange(0, BLOCK_D)
    cols = tl.arange(0, BLOCK_N)
    k = _tile(base + stride_3, cols, offs_d, N, stride_n, stride_d, HEAD_DIM, True, False)  # [BLOCK_D, BLOCK_N], k^T
    v = _tile(base + 2 * stride_3, cols, offs_d, N, stride_n, stride_d, HEAD_DIM, True, True)  # [BLOCK_N, BLOCK_D]
    for row0 in range(0, N, BLOCK_M):
        rows = row0 + tl.arange(0, BLOCK_M)
        q = _tile(base, rows, offs_d, N, stride_n, stride_d, HEAD_DIM, True, True)  # rows past N: zeros, never stored
        s = tl.dot(q, k)
        s = tl.where((cols < N)[None, :], s, float("-inf"))
        m = tl.max(s, 1) * qk_scale  # as _kv_tile: the raw max, scaled once (qk_scale > 0)
        p = tl.math.exp2(s * qk_scale - m[:, None])
        acc = tl.dot(p.to(q.dtype), v) / tl.sum(p, 1)[:, None]
        out_ptrs = out_base + rows[:, None] * stride_on + offs_d[None, :] * stride_od
        tl.store(out_ptrs, acc.to(out_base.dtype.element_ty), mask=(rows < N)[:, None] & (offs_d < HEAD_DIM)[None, :])


# Keyed on the sequence length, the head dim and the number of (batch, head) pairs rounded up to
# a power of two (together they set how many programs run, which decides the best tile, so the
# tile tuned at batch 8 is not reused at batch 256); tensor dtypes are part of the key too.
@autotune(configs=_configs(), key=["N", "HEAD_DIM", "BH_BUCKET"], estimate=shared_memory_bytes)
@triton.jit(do_not_specialize=["BH_BUCKET"])  # a tuning key only: no recompile per bucket
def _attention_fwd_kernel(
    QKV, Out,
    stride_b, stride_n, stride_3, stride_h, stride_d,  # qkv [B, N, 3, H, D]
    stride_ob, stride_on, stride_oh, stride_od,  # out viewed as [B, N, H, D]
    N, H, BH_BUCKET, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D1: tl.constexpr,  # head_dim_tiles
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr, IEEE_FP32: tl.constexpr,
    WHOLE: tl.constexpr,  # one program per (batch, head): `_whole_head`
):  # fmt: skip
    # -- one flat grid axis (axis 1 would cap B * H at 65,535): the query tiles of one (batch,
    # head) are neighbours, so they share its k/v in L2; ceil(N / BLOCK_M) tiles, or (TAIL > 0)
    # N // BLOCK_M full tiles then the last N % BLOCK_M rows in TAIL-row tiles (programs_per_head)
    pid = tl.program_id(0)
    full_m = N // BLOCK_M
    if WHOLE:
        per_head = 1
    elif TAIL > 0:
        per_head = full_m + tl.cdiv(N - full_m * BLOCK_M, TAIL)
    else:
        per_head = tl.cdiv(N, BLOCK_M)
    pid_bh = pid // per_head
    tile = pid % per_head
    # (batch, head) base offsets in int64: B * N * 3 * H * D passes 2^31 at large batches; the
    # offsets inside one (batch, head) stay int32 (the launcher checks they fit)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    base = QKV + b * stride_b + h * stride_h
    out_base = Out + b * stride_ob + h * stride_oh
    # Inductor passes a Python float to a user kernel as fp64: without the cast the scores, and the
    # running max carried through the loop, would turn fp64 (a compile error in the loop)
    qk_scale = tl.cast(qk_scale, tl.float32)
    if WHOLE:  # the prune keeps WHOLE configs to these (shared_memory_bytes); N <= BLOCK_N is checked at launch
        tl.static_assert(BLOCK_D1 == 0 and not IEEE_FP32, "whole-head programs take one head-dim tile of fp16/bf16")
        _whole_head(base, out_base, N, stride_n, stride_3, stride_d, stride_on, stride_od, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N)
    elif TAIL == 0:
        _query_tile(base, out_base, tile * BLOCK_M, N, stride_n, stride_3, stride_d, stride_on, stride_od, qk_scale,
                    HEAD_DIM, BLOCK_D, BLOCK_D1, BLOCK_M, True, BLOCK_N, TAIL, IEEE_FP32)  # fmt: skip
    elif tile < full_m:
        _query_tile(base, out_base, tile * BLOCK_M, N, stride_n, stride_3, stride_d, stride_on, stride_od, qk_scale,
                    HEAD_DIM, BLOCK_D, BLOCK_D1, BLOCK_M, False, BLOCK_N, TAIL, IEEE_FP32)  # fmt: skip
    else:
        _query_tile(base, out_base, full_m * BLOCK_M + (tile - full_m) * TAIL, N, stride_n, stride_3, stride_d, stride_on, stride_od,
                    qk_scale, HEAD_DIM, BLOCK_D, BLOCK_D1, TAIL, True, BLOCK_N, TAIL, IEEE_FP32)  # fmt: skip


def attention_launch(qkv: torch.Tensor, out: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Run the kernel: qkv [B, N, 3, H, D] (any strides) -> out [B, N, H*D] (written in place)."""
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        raise ValueError(f"fused attention expects qkv of shape [B, N, 3, H, D], got {tuple(qkv.shape)}")
    B, N, _, H, D = qkv.shape
    if not 1 <= D <= 256:
        raise ValueError(f"fused attention supports head_dim 1..256, got {D}")
    if qkv.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"fused attention supports fp16/bf16/fp32, got {qkv.dtype}")
    if out.shape != (B, N, H * D) or out.dtype != qkv.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be a [B, N, H*D] {qkv.dtype} tensor with unit last stride, got {tuple(out.shape)} {out.dtype}")
    check_device(qkv, out)
    scale = attention_scale(D, scale)
    out4 = out.view(B, N, H, D)
    if max(span(qkv, slice(1, None)), span(out4, slice(1, None))) > INT32_MAX:
        raise InputError(f"fused attention: one image's qkv {tuple(qkv.shape[1:])} spans 2^31 elements or more "
                         "(the kernel's in-image offsets are 32-bit); use fewer tokens or heads")
    block_d, block_d1 = head_dim_tiles(D)
    if qkv.is_cuda:
        require_fitting_config(_attention_fwd_kernel, {"QKV": qkv, "BLOCK_D": block_d, "BLOCK_D1": block_d1}, qkv.device,
                               f"fused attention ({str(qkv.dtype).removeprefix('torch.')}, head_dim {D})")

    def grid(meta):
        if meta["WHOLE"] and N > meta["BLOCK_N"]:  # the prune keeps them to N <= BLOCK_N: never drop keys silently
            raise RuntimeError(f"fused attention: a whole-head config holds {meta['BLOCK_N']} keys, not N = {N}")
        return attention_grid(B, N, H, meta["BLOCK_M"], meta["TAIL"], meta["WHOLE"])

    wrap_triton(_attention_fwd_kernel, qkv)[grid](
        qkv, out4,
        *qkv.stride(), *out4.stride(),
        N, H, next_pow2(B * H), scale * LOG2E,
        HEAD_DIM=D, BLOCK_D=block_d, BLOCK_D1=block_d1, IEEE_FP32=qkv.dtype == torch.float32,
    )  # fmt: skip
    return out


def attention_scale(D: int, scale: float | None) -> float:
    """The softmax scale, head_dim^-0.5 by default; positive, since the kernel takes each row's max before scaling
    (the reference refuses the same, so the op behaves alike on CPU and GPU)."""
    scale = D**-0.5 if scale is None else scale
    if not scale > 0:
        raise ValueError(f"fused attention needs a positive scale, got {scale}")
    return scale


def attention_grid(B: int, N: int, H: int, block_m: int, tail: int = 0, whole: bool = False) -> tuple[int]:
    """One program per (query tile, batch, head), or per (batch, head) (`whole`), flattened on grid axis 0 (up to
    2^31 - 1 programs)."""
    programs = programs_per_head(N, block_m, tail, whole) * B * H
    if programs > INT32_MAX:
        raise InputError(f"fused attention: {programs} programs exceed CUDA's grid limit; split the batch")
    return (programs,)


@vitfast_op("fused_attention")
def fused_attention(qkv: torch.Tensor, scale: float) -> torch.Tensor:
    """qkv [B, N, 3, H, D] -> [B, N, H*D]; a torch op, so it composes with torch.compile."""
    if runs_reference(qkv):
        return attention_reference(qkv, scale)
    B, N, _, H, D = qkv.shape
    out = torch.empty((B, N, H * D), dtype=qkv.dtype, device=qkv.device)
    return attention_launch(qkv, out, scale)


def attention_reference(qkv: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Plain PyTorch: softmax(q k^T * scale) v, qkv [B, N, 3, H, D] -> [B, N, H*D], in qkv's dtype."""
    B, N, _, H, D = qkv.shape
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, N, D]
    scale = attention_scale(D, scale)
    attn = torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1)
    return (attn @ v).transpose(1, 2).reshape(B, N, H * D)
