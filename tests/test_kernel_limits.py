"""The kernels past the sizes a small test normally reaches: element offsets beyond 2^31, grids
beyond CUDA's 65,535 limit on axes 1 and 2, and autotune configs beyond a GPU's shared memory.

Offsets: tensors whose rows lie 2^31 - 1 elements apart over a lazily allocated storage (8 GiB
of address space, only the rows' own pages are touched), so the kernels really index past 2^31
elements, in the interpreter here and on a GPU with VITFAST_TEST_DEVICE=cuda. With 32-bit row
offsets, row 2 (at 2^32 - 2 elements) wraps to -2 and the kernel reads the wrong elements."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'vitfast[triton]')")
from test_kernels import check_2x, poisoned  # noqa: E402

from vitfast.errors import InputError  # noqa: E402
from vitfast.kernels import _common  # noqa: E402
from vitfast.kernels import add_layernorm as aln  # noqa: E402
from vitfast.kernels import attention as att  # noqa: E402
from vitfast.kernels import bias_gelu as bg  # noqa: E402
from vitfast.kernels import linear_epilogue as le  # noqa: E402
from vitfast.kernels import bias_swiglu as bsw  # noqa: E402
from vitfast.kernels import linear_layernorm as lln  # noqa: E402

FAR = 2**31 - 1  # the largest stride that is still a 32-bit kernel argument
LEAD = 64  # elements before row 0, so the wrapped (negative) offsets of 32-bit code stay in the storage
BUDGET = {"sm_80": (80, 166912), "sm_89": (89, 101376), "sm_90a": (90, 232448)}  # (capability, bytes per block)


def far_apart(shape: tuple, device: str, dtype=torch.float16) -> torch.Tensor:
    """Random [3, ...] tensor whose leading-dim rows lie FAR elements apart (row 2 at 2^32 - 2)."""
    inner = math.prod(shape[1:])
    storage = torch.empty(LEAD + FAR * (shape[0] - 1) + inner, dtype=dtype, device=device)  # not touched
    strides = (FAR, *torch.empty(shape[1:]).stride())
    t = storage.as_strided(shape, strides, LEAD)
    t.copy_(torch.randn(shape))
    assert (shape[0] - 1) * FAR >= 2**32 - 2
    return t


# ---------------------------------------------------------------------------- offsets past 2^31
def test_attention_batch_offsets_past_2_31(device):
    qkv = far_apart((3, 37, 3, 2, 32), device)
    out = poisoned((3, 37, 64), torch.float16, device)
    att.attention_launch(qkv, out)
    exact = att.attention_reference(qkv.double())
    check_2x(out, att.attention_reference(qkv.float()).half(), exact, torch.float16)


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_add_layernorm_row_offsets_past_2_31(device, rms):
    C = 100
    x, y = far_apart((3, C), device), far_apart((3, C), device)
    w, b = torch.randn(C, device=device).half(), None if rms else torch.randn(C, device=device).half()
    out, res = poisoned((3, C), torch.float16, device), poisoned((3, C), torch.float16, device)
    aln.add_layernorm_launch(x, y, w, b, 1e-6, out, res, rms=rms)

    def reference(x, y, w, b):
        return aln.add_rmsnorm_reference(x, y, w, 1e-6) if rms else aln.add_layernorm_reference(x, y, w, b, 1e-6)

    exact_res, exact = reference(*(t.double() if t is not None else None for t in (x, y, w, b)))
    torch_res, torch_out = reference(x, y, w, b)
    check_2x(res, torch_res, exact_res, torch.float16)
    check_2x(out, torch_out, exact, torch.float16)


def test_bias_gelu_row_offsets_past_2_31(device):
    x, b = far_apart((3, 70), device), torch.randn(70, device=device).half()
    out = poisoned((3, 70), torch.float16, device)
    bg.bias_gelu_launch(x, b, out)
    check_2x(out, bg.bias_gelu_reference(x, b), bg.bias_gelu_reference(x.double(), b.double()), torch.float16)


def test_bias_swiglu_row_offsets_past_2_31(device):
    x, b = far_apart((3, 70), device), torch.randn(70, device=device).half()
    out = poisoned((3, 35), torch.float16, device)
    bsw.bias_swiglu_launch(x, b, out)
    check_2x(out, bsw.bias_swiglu_reference(x, b), bsw.bias_swiglu_reference(x.double(), b.double()), torch.float16)


def test_swiglu_row_offsets_past_2_31(device):
    """Unpacked: gate and value each with rows 2^31 - 1 apart."""
    gate, value = far_apart((3, 35), device), far_apart((3, 35), device)
    out = poisoned((3, 35), torch.float16, device)
    bsw.swiglu_launch(gate, value, out)
    check_2x(out, bsw.swiglu_reference(gate, value), bsw.swiglu_reference(gate.double(), value.double()), torch.float16)


def test_linear_epilogue_row_offsets_past_2_31(device):
    """x and the residual with rows 2^31 - 1 apart: computed, no longer refused."""
    K, N = 40, 24
    x, residual = far_apart((3, K), device), far_apart((3, N), device)
    w, b = (torch.randn(N, K, device=device) * K**-0.5).half(), torch.randn(N, device=device).half()
    out = poisoned((3, N), torch.float16, device)
    le.linear_epilogue_launch(x, w, b, out, residual=residual)
    exact = le.linear_epilogue_reference(x.double(), w.double(), b.double(), residual=residual.double())
    check_2x(out, le.linear_epilogue_reference(x, w, b, residual=residual), exact, torch.float16)


def test_linear_layernorm_row_offsets_past_2_31(device):
    """GEMM + residual + LayerNorm with x and the residual's rows 2^31 - 1 apart."""
    K, N = 40, 72
    x, residual = far_apart((3, K), device), far_apart((3, N), device)
    w, b = (torch.randn(N, K, device=device) * K**-0.5).half(), torch.randn(N, device=device).half()
    gamma, ln_w, ln_b = (torch.randn(N, device=device).half() for _ in range(3))
    res_out, out = poisoned((3, N), torch.float16, device), poisoned((3, N), torch.float16, device)
    lln.linear_residual_layernorm_launch(x, w, b, residual, gamma, ln_w, ln_b, 1e-6, res_out, out)
    as_double = [t.double() for t in (x, w, b, residual, gamma, ln_w, ln_b)]
    exact_res, exact = lln.linear_residual_layernorm_reference(*as_double, 1e-6)
    torch_res, torch_out = lln.linear_residual_layernorm_reference(x, w, b, residual, gamma, ln_w, ln_b, 1e-6)
    check_2x(res_out, torch_res, exact_res, torch.float16)
    check_2x(out, torch_out, exact, torch.float16)


def test_in_row_offsets_that_stay_32_bit_are_guarded():
    """Offsets within one image (attention) or one row / the weight (GEMM) stay 32-bit: a layout
    that would overflow them is refused with a clear error (meta tensors: nothing is allocated)."""
    qkv = torch.empty(1, 4, 3, 2, 16, device="meta").as_strided((1, 4, 3, 2, 16), (10, 2**30, 32, 16, 1))
    with pytest.raises(InputError, match="spans 2\\^31 elements"):
        att.attention_launch(qkv, torch.empty(1, 4, 32, device="meta"))
    x = torch.empty(2, 8, device="meta")
    weight = torch.empty(4, 8, device="meta").as_strided((4, 8), (2**30, 1))
    with pytest.raises(InputError, match="weight, or one row of x"):
        le.linear_epilogue_launch(x, weight, torch.empty(4, device="meta"), torch.empty(2, 4, device="meta"))
    vec = torch.empty(4, device="meta")
    with pytest.raises(InputError, match="linear \\+ LayerNorm: the weight, or one row of x"):
        lln.linear_residual_layernorm_launch(x, weight, vec, torch.empty(2, 4, device="meta"), None, vec, vec, 1e-6,
                                             torch.empty(2, 4, device="meta"), torch.empty(2, 4, device="meta"))


# ---------------------------------------------------------------------------- grids
CUDA_GRID_LIMITS = (2**31 - 1, 65535, 65535)


@pytest.mark.parametrize("B, N, H", [(6000, 197, 12), (1, 1, 1), (4096, 577, 16), (65536, 50, 3)])
def test_attention_grid_fits_cuda_limits(B, N, H):
    """Batch 6000 x 12 heads put 72,000 on grid axis 1 (limit 65,535) before; one flat axis now."""
    for block_m in {c.kwargs["BLOCK_M"] for c in att._configs()} | {16, 128}:
        for tail in (0, 16):
            grid = att.attention_grid(B, N, H, block_m, tail)
            assert len(grid) <= 3 and all(0 < g <= limit for g, limit in zip(grid, CUDA_GRID_LIMITS))
            # one program per (query tile, batch, head): full tiles, then the rest in tiles of `tail` rows
            tiles = -(-N // block_m) if not tail else N // block_m + -(-(N % block_m) // tail)
            assert math.prod(grid) == tiles * B * H


@pytest.mark.parametrize("N, block_m, tail, tiles", [(197, 64, 16, 4), (197, 128, 16, 6), (197, 64, 0, 4), (256, 64, 16, 4),
                                                     (1, 128, 16, 1), (15, 16, 16, 1), (577, 128, 16, 9), (577, 128, 0, 5)])  # fmt: skip
def test_query_tiles_per_head(N, block_m, tail, tiles):
    """197 rows in 64-row tiles: 3 full + one 16-row tail (208 rows computed instead of 256)."""
    assert att.programs_per_head(N, block_m, tail) == tiles


def test_attention_grid_beyond_cuda_limit_is_refused():
    with pytest.raises(InputError, match="grid limit"):
        att.attention_grid(2**21, 1025, 16, 16)


# ---------------------------------------------------------------------------- shared-memory pruning
def gpu_configs(module, monkeypatch) -> list:
    """The module's GPU autotune list (the interpreter gets a single config)."""
    monkeypatch.setattr(module, "INTERPRET", False)
    return module._configs()


def test_interpreter_tunes_nothing():
    assert len(att._attention_fwd_kernel.configs) == 1 and len(le._linear_epilogue_kernel.configs) == 1


@pytest.mark.parametrize("D, tiles", [(64, (64, 0)), (80, (64, 16)), (72, (64, 16)), (96, (64, 32)), (112, (128, 0)), (48, (32, 16)),
                                      (40, (32, 16)), (24, (32, 0)), (5, (16, 0)), (16, (16, 0)), (160, (128, 32)), (200, (256, 0))])  # fmt: skip
def test_head_dim_tiles(D, tiles):
    """One power-of-two tile, or two where they pad less: ViT-H/14's 80 as 64 + 16 instead of 128."""
    assert att.head_dim_tiles(D) == tiles
    first, second = tiles
    assert first + second >= D and first % 16 == 0 and second % 16 == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [32, 64, 72, 80, 96, 128])
@pytest.mark.parametrize("arch", BUDGET)
def test_attention_has_a_fitting_config_for_vit_head_dims(monkeypatch, arch, head_dim, dtype):
    """Every head_dim of DESIGN.md's range, in every dtype, keeps at least one config on each
    target, and none of those kept exceeds the target's limit (tests/test_aot_compile.py checks
    the estimate against the compiled kernels' real shared memory)."""
    block_d, block_d1 = att.head_dim_tiles(head_dim)
    args = {"QKV": torch.empty(0, dtype=dtype), "BLOCK_D": block_d, "BLOCK_D1": block_d1}
    configs = gpu_configs(att, monkeypatch)
    kept = _common.configs_within(configs, att.shared_memory_bytes, args, BUDGET[arch])
    capability, limit = BUDGET[arch]
    assert kept and all(att.shared_memory_bytes(c, args, capability) <= limit for c in kept)
    assert len(configs) <= 10  # a first call must not tune for minutes


def test_whole_head_configs_are_kept_only_where_one_program_holds_every_key(monkeypatch):
    """WHOLE configs hold all N keys and values of one (batch, head) in one program: kept for fp16/bf16 with one
    head-dim tile and N <= their BLOCK_N (256) where the target's shared memory holds them; pruned for fp32, a head
    dim in two tiles (80 = 64 + 16), N = 257, D = 64 on sm_89 (104 KB of 99), D = 128 on sm_80 (176 KB of 163). One
    program per (batch, head)."""
    configs = gpu_configs(att, monkeypatch)
    whole = [c for c in configs if c.kwargs.get("WHOLE")]

    def kept(dtype, D, N, arch="sm_90a"):
        block_d, block_d1 = att.head_dim_tiles(D)
        args = {"QKV": torch.empty(0, dtype=dtype), "BLOCK_D": block_d, "BLOCK_D1": block_d1, "N": N}
        return [c for c in _common.configs_within(configs, att.shared_memory_bytes, args, BUDGET[arch]) if c.kwargs.get("WHOLE")]

    assert whole and kept(torch.float16, 64, 197) == whole and kept(torch.bfloat16, 128, 256) == whole and not kept(torch.bfloat16, 128, 256, "sm_80")
    assert kept(torch.float16, 32, 197, "sm_89") == whole and not kept(torch.float16, 64, 197, "sm_89")
    assert not kept(torch.float16, 64, 257) and not kept(torch.float32, 64, 197) and not kept(torch.float16, 80, 197)
    prune = att._attention_fwd_kernel.early_config_prune  # the tuner's own prune, with the launch's N as Triton names it
    monkeypatch.setattr(_common, "shared_memory_budget", lambda device: BUDGET["sm_90a"])
    qkv = torch.empty(0, dtype=torch.float16)
    assert whole == [c for c in prune(configs, {"QKV": qkv, "N": 197}, BLOCK_D=64, BLOCK_D1=0) if c.kwargs["WHOLE"]]
    assert not [c for c in prune(configs, {"QKV": qkv, "N": 257}, BLOCK_D=64, BLOCK_D1=0) if c.kwargs["WHOLE"]]
    assert att.programs_per_head(197, 64, 0, whole=True) == 1 and att.attention_grid(3, 197, 12, 64, 0, True) == (36,)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("arch", BUDGET)
def test_linear_epilogue_has_a_fitting_config(monkeypatch, arch, dtype):
    args = {"X": torch.empty(0, dtype=dtype)}
    configs = gpu_configs(le, monkeypatch)
    kept = _common.configs_within(configs, le.shared_memory_bytes, args, BUDGET[arch])
    assert kept
    if dtype == torch.float32 and arch == "sm_89":  # the big fp32 tiles cannot run on a 99 KB part
        assert len(kept) < len(configs)


def test_two_per_sm_gemm_configs_are_kept_only_where_two_programs_fit_an_sm(monkeypatch):
    """The Hopper GEMM's PER_SM = 2 configs stay for fc1 (two 115 KB programs share the SM's 228 KB) and go
    where the residual's staging tile makes one program too big for two to be resident (fc2), and off Hopper."""
    monkeypatch.setattr(le, "INTERPRET", False)
    configs = le._tma_configs()
    pairs = [c for c in configs if c.kwargs["PER_SM"] == 2]
    assert len(pairs) == 2
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.empty(0, dtype=dtype)
        fc1 = _common.configs_within(configs, le.tma_shared_memory_bytes, {"X": x, "RESIDUAL": 0}, BUDGET["sm_90a"])
        fc2 = _common.configs_within(configs, le.tma_shared_memory_bytes, {"X": x, "RESIDUAL": 2}, BUDGET["sm_90a"])
        assert all(c in fc1 for c in pairs) and not [c for c in fc2 if c.kwargs["PER_SM"] == 2]
        assert fc1 == configs and fc2  # fc2's 4-stage 128x256 and 128x128x128 tiles also outgrow one program's 227 KB
        for c in pairs:  # what makes the pair fit: the estimate of one program, its 1 KB reservation, twice
            assert 2 * (le.tma_shared_memory_bytes(c, {"X": x, "RESIDUAL": 0}, 90) + 1024) <= 228 * 1024
        assert not _common.configs_within(configs, le.tma_shared_memory_bytes, {"X": x, "RESIDUAL": 0}, BUDGET["sm_80"])


def test_autotuner_prunes_by_the_device_limit(monkeypatch):
    """The autotuner's early prune asks the device for its limit and keeps what fits."""
    configs = gpu_configs(att, monkeypatch)
    prune = att._attention_fwd_kernel.early_config_prune
    qkv = torch.empty(0, dtype=torch.float32)
    monkeypatch.setattr(_common, "shared_memory_budget", lambda device: BUDGET["sm_89"])
    kept = prune(configs, {"QKV": qkv}, BLOCK_D=128)
    assert kept == _common.configs_within(configs, att.shared_memory_bytes, {"QKV": qkv, "BLOCK_D": 128}, BUDGET["sm_89"])
    assert 0 < len(kept) < len(configs)
    monkeypatch.setattr(_common, "shared_memory_budget", lambda device: None)  # the interpreter: no limit
    assert prune(configs, {"QKV": qkv}, BLOCK_D=128) == configs


@pytest.mark.parametrize("setting, cached", [(None, True), ("1", True), ("0", False)])
def test_tuning_results_go_to_disk_unless_turned_off(monkeypatch, setting, cached):
    """VITFAST_TUNE_CACHE=0 keeps a process's autotune picks out of Triton's disk cache (the GPU proof's pytest
    workers tune on a GPU they share; the processes that time the kernels must tune their own)."""
    import triton

    asked = []

    def fake_autotune(configs, key, prune_configs_by=None, cache_results=False):
        asked.append(cache_results)
        return lambda fn: type("Tuner", (), {})()

    monkeypatch.setattr(triton, "autotune", fake_autotune)
    if setting is None:
        monkeypatch.delenv("VITFAST_TUNE_CACHE", raising=False)
    else:
        monkeypatch.setenv("VITFAST_TUNE_CACHE", setting)
    _common.autotune([], ["N"], att.shared_memory_bytes)(lambda: None)
    assert asked == [cached]


@pytest.mark.parametrize("setting, picked", [(None, list(range(10))), ("0", list(range(10))), ("1", [0]), ("2", [0, 9]),
                                             ("3", [0, 4, 9]), ("8", [0, 1, 3, 4, 5, 6, 8, 9]), ("20", list(range(10)))])  # fmt: skip
def test_tune_configs_cuts_what_the_tuner_and_precompile_see(monkeypatch, setting, picked):
    """VITFAST_TUNE_CONFIGS=n (the GPU proof's pytest): at most n of the fitting configs, first and last kept, in the
    tuner's prune and in precompile's plan alike; unset or 0: every fitting config."""
    from vitfast.kernels.precompile import Recorded

    configs = gpu_configs(att, monkeypatch)
    assert len(configs) == 10 and configs[0].kwargs["WHOLE"] and not configs[-1].kwargs["WHOLE"]  # both kinds at 2
    monkeypatch.setattr(att._attention_fwd_kernel, "configs", configs)
    if setting is None:
        monkeypatch.delenv("VITFAST_TUNE_CONFIGS", raising=False)
    else:
        monkeypatch.setenv("VITFAST_TUNE_CONFIGS", setting)
    args = {"QKV": torch.empty(2, 197, 3, 12, 64, dtype=torch.float16), "BLOCK_D": 64, "BLOCK_D1": 0}
    kept = _common.kept_configs(configs, att.shared_memory_bytes, args, BUDGET["sm_90a"])
    assert kept == [configs[i] for i in picked]
    recorded = Recorded(att._attention_fwd_kernel, (args["QKV"],), {"BLOCK_D": 64, "BLOCK_D1": 0})
    assert recorded.configs(BUDGET["sm_90a"]) == kept
    fp32 = args | {"QKV": args["QKV"].float(), "BLOCK_D": 128}  # on a 99 KB part only some tiles fit: the cut comes after
    fitting = _common.configs_within(configs, att.shared_memory_bytes, fp32, BUDGET["sm_89"])
    kept = _common.kept_configs(configs, att.shared_memory_bytes, fp32, BUDGET["sm_89"])
    assert 0 < len(fitting) < 10 and len(kept) == min(len(picked), len(fitting)) and all(c in fitting for c in kept)


def test_a_malformed_tune_configs_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("VITFAST_TUNE_CONFIGS", "two")
    with pytest.raises(ValueError, match="VITFAST_TUNE_CONFIGS must be a whole number of configs"):
        _common.tune_limit()


def test_no_fitting_config_is_a_clear_error(monkeypatch):
    """fp32 attention at head_dim 256 on a 99 KB GPU (sm_86/89): no tile fits."""
    configs = gpu_configs(att, monkeypatch)
    monkeypatch.setattr(att._attention_fwd_kernel, "configs", configs)
    monkeypatch.setattr(_common, "_cuda_shared_memory_budget", lambda index: BUDGET["sm_89"])
    args = {"QKV": torch.empty(0, dtype=torch.float32), "BLOCK_D": 256}
    with pytest.raises(InputError, match=r"fused attention \(fp32, head_dim 256\): no kernel configuration fits "
                                         r"this GPU's shared memory \(99 KB per block; the smallest needs \d+ KB\)"):
        _common.require_fitting_config(att._attention_fwd_kernel, args, torch.device("cuda", 0),
                                       "fused attention (fp32, head_dim 256)")
    args["QKV"] = torch.empty(0, dtype=torch.float16)
    args["BLOCK_D"] = 128
    _common.require_fitting_config(att._attention_fwd_kernel, args, torch.device("cuda", 0), "fp16 fits")
