"""Hopper (sm_90) form of the GEMM with an MLP epilogue: persistent, its tiles moved by TMA.

Same math and epilogues as linear_epilogue.py (bias, then GELU or the LayerScale'd residual add,
fp32 accumulation, one rounding), for fp16 / bf16 on compute capability >= 9.0. What differs, and
why (the first H100 run timed the pointer kernel's fc1 + GELU at ~55% of cuBLAS's GEMM rate,
below the ~62% at which the fused GELU pays for itself: benchmarks/NOTES.md):
- x, W, the residual and the output move through TMA descriptors made on the device
  (`tl.make_tensor_descriptor`): bulk async copies, no address arithmetic or masks per element
  (out-of-range rows and K columns read as zero, stores past the edge are dropped by the copy
  engine), the operand tiles land in shared memory laid out for wgmma;
- one program per SM walks the output tiles (grouped order, so W stays in L2) in one flattened
  loop, so the next tile's loads are in flight while this tile's epilogue runs, instead of the
  SM idling through each program's epilogue and start-up;
- the wide 128x256 tile stores its result in two 128-column halves, which halves the epilogue's
  shared-memory staging and leaves room for a fourth pipeline stage.
The launcher (`linear_epilogue_launch`) picks this kernel on an sm_90 GPU in eager calls when
every operand meets TMA's rules (`linear_epilogue.tma_ready`); under torch.compile / torch.export it keeps the
pointer kernel, whose launch needs no device-side scratch memory. Which of the two (and cuBLAS)
is faster per shape is the GPU proof's measurement (benchmarks/gpu_kernels.py, fc1 rows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, autotune, next_pow2, wrap_triton
from .linear_epilogue import branch_tile


def _configs() -> list[triton.Config]:
    if INTERPRET:  # one small config, the wide tile's split store included
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4, "SPLIT_N": 2}, num_warps=4, num_stages=1)]
    # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_N): the wgmma tiles of Triton's Hopper
    # matmul tutorial (128 rows, 128 or 256 columns) for the large batches, 64-row tiles so batch 1
    # (M = 197) still spreads over the SMs. No 4-warp 128x128 tile: it spills in the GELU epilogue
    # (204 bytes at 255 registers, sm_90a, `python -m vitfast.kernels.aot`)
    tiles = [
        (128, 256, 64, 8, 3, 2), (128, 256, 64, 8, 4, 2), (128, 128, 64, 8, 4, 1), (128, 128, 128, 8, 3, 1),
        (64, 128, 64, 4, 4, 1), (64, 64, 64, 4, 4, 1),
    ]  # fmt: skip
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SPLIT_N": split}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s, split in tiles
    ]


def shared_memory_bytes(config: triton.Config, args: dict, capability: int) -> int:
    """Upper estimate of one program's shared memory, checked against the compiled kernels'
    `metadata.shared` on sm_90a (tests/test_aot_compile.py): num_stages x and W tiles, the output
    staging tile (and the residual's), and 1 KB for the pipeline's barriers. No TMA before sm_90:
    larger than any budget there, so the prune keeps no config."""
    if capability < 90:
        return 1 << 40
    elsize, kw = args["X"].element_size(), config.kwargs
    operands = config.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * elsize
    staging = kw["BLOCK_M"] * kw["BLOCK_N"] // kw["SPLIT_N"] * elsize * (2 if args["RESIDUAL"] else 1)
    return operands + staging + 1024


@triton.jit
def _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of linear tile index `tile`: GROUP_M row tiles sweep the columns together."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile // per_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@triton.jit
def _epilogue_store(acc, out_desc, res_desc, Bias, Gamma, row, col, N,
                    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """acc [BLOCK_M, BLOCK_N] fp32 at (row, col) of the output: bias, GELU or the (scaled) residual, one rounding, TMA store."""
    acc = branch_tile(acc, Bias, Gamma, col + tl.arange(0, BLOCK_N), N, HAS_BIAS, ACTIVATION, RESIDUAL)
    if RESIDUAL > 0:
        acc += res_desc.load([row, col]).to(tl.float32)
    out_desc.store([row, col], acc.to(out_desc.dtype))


# Same tuning key as the pointer kernel: shape (M by power-of-two bucket) and epilogue; dtypes too.
@autotune(configs=_configs(), key=["M_BUCKET", "N", "K", "HAS_BIAS", "ACTIVATION", "RESIDUAL"], estimate=shared_memory_bytes)
@triton.jit(do_not_specialize=["M_BUCKET", "NUM_PROGRAMS"])
def _linear_epilogue_tma_kernel(
    X, W, Bias, Res, Gamma, Out,
    M, N, K, M_BUCKET, NUM_PROGRAMS,
    stride_xm, stride_wn, stride_rm, stride_om,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # 0: none, else GELU of form ACTIVATION - 1 (bias_gelu.GELU_FORMS)
    RESIDUAL: tl.constexpr,  # 0: none, 1: + Res, 2: Res + Gamma * (...)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_N: tl.constexpr,  # the output tile is stored in SPLIT_N (1 or 2) column pieces
):  # fmt: skip
    # -- descriptors: global shapes and strides, so the copy engine handles every edge
    STORE_N: tl.constexpr = BLOCK_N // SPLIT_N
    x_desc = tl.make_tensor_descriptor(X, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(W, shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
    out_desc = tl.make_tensor_descriptor(Out, shape=[M, N], strides=[stride_om, 1], block_shape=[BLOCK_M, STORE_N])
    res_desc = tl.make_tensor_descriptor(Res, shape=[M, N], strides=[stride_rm, 1], block_shape=[BLOCK_M, STORE_N])

    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # the epilogue keeps its own tile counter: shared with the loads, it would tie the next tile's
    # prologue to this tile's epilogue and stop the flattened loop from overlapping them
    tile_c = pid - NUM_PROGRAMS
    for tile in tl.range(pid, num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in range(k_tiles):
            a = x_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])  # [BLOCK_M, BLOCK_K]
            b = w_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])  # [BLOCK_N, BLOCK_K]: W as stored, transposed in the dot
            acc = tl.dot(a, b.T, acc)

        # -- epilogue in fp32 registers, stored in SPLIT_N column pieces
        tile_c += NUM_PROGRAMS
        pid_m, pid_n = _grouped_tile(tile_c, num_pid_m, num_pid_n, GROUP_M)
        row, col = pid_m * BLOCK_M, pid_n * BLOCK_N
        if SPLIT_N == 2:
            left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, STORE_N)), (0, 2, 1)))
            _epilogue_store(left, out_desc, res_desc, Bias, Gamma, row, col, N, HAS_BIAS, ACTIVATION, RESIDUAL, STORE_N)
            _epilogue_store(right, out_desc, res_desc, Bias, Gamma, row, col + STORE_N, N, HAS_BIAS, ACTIVATION, RESIDUAL, STORE_N)
        else:
            _epilogue_store(acc, out_desc, res_desc, Bias, Gamma, row, col, N, HAS_BIAS, ACTIVATION, RESIDUAL, STORE_N)


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator for the descriptors' global scratch (128 bytes per descriptor and program)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """Give Triton an allocator for the device-side descriptors unless the caller has set one (it is
    per context, so a server's worker thread gets its own here)."""
    from triton.runtime import _allocation  # private, so guarded: where it moved, always set ours

    try:
        unset = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except AttributeError:
        unset = True
    if unset:
        triton.set_allocator(_scratch)


def linear_epilogue_tma_launch(x2, weight, bias, res2, gamma, out2, activation: int, residual_mode: int, programs: int) -> None:
    """The launch, on 2-D views already checked by `linear_epilogue_launch` (and `tma_ready`):
    x2 [M, K], weight [N, K], res2 / out2 [M, N]; `programs`: the persistent grid's upper bound (the SM count)."""
    M, K = x2.shape
    N = weight.shape[0]
    if x2.is_cuda:
        _ensure_allocator()

    def grid(meta):
        return (min(programs, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)

    wrap_triton(_linear_epilogue_tma_kernel)[grid](
        x2, weight, bias if bias is not None else weight, res2, gamma if gamma is not None else weight, out2,
        M, N, K, next_pow2(M), programs,
        x2.stride(0), weight.stride(0), res2.stride(0), out2.stride(0),
        HAS_BIAS=bias is not None, ACTIVATION=activation, RESIDUAL=residual_mode,
    )  # fmt: skip
