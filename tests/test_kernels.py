"""Each Triton kernel against a float64 reference with the 2x rule of DESIGN.md: the kernel's
error may be at most twice plain PyTorch's error at the same precision, plus a small atol.
Outputs are poisoned with NaN before every launch so an unwritten element fails.

On CPU the kernels run under TRITON_INTERPRET=1. The interpreter computes bf16 `tl.dot` wrongly
and truncates fp32->bf16 casts, so bf16 is checked on the GPU only."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton", reason="Triton is not installed (pip install 'vitfast[triton]')")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import traced_vitfast_ops  # noqa: E402
from vitfast.kernels import _common  # noqa: E402
from vitfast.kernels import add_layernorm as aln  # noqa: E402
from vitfast.kernels import attention as att  # noqa: E402
from vitfast.kernels import bias_gelu as bg  # noqa: E402
from vitfast.kernels import bias_swiglu as bsw  # noqa: E402
from vitfast.kernels import linear_epilogue as le  # noqa: E402
from vitfast.kernels import linear_layernorm  # noqa: E402,F401  (registers its ops)

ATOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


@pytest.fixture(params=[torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def dtype(request, device) -> torch.dtype:
    if request.param == torch.bfloat16 and device == "cpu":
        pytest.skip("bf16 is checked on the GPU only: the Triton interpreter computes bf16 tl.dot wrongly "
                    "and truncates fp32->bf16 casts (run with VITFAST_TEST_DEVICE=cuda)")
    return request.param


def check_2x(kernel_out: torch.Tensor, torch_out: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(kernel_out).any(), "kernel left poisoned (unwritten) elements"
    err = (kernel_out.double() - exact).abs().max().item()
    torch_err = (torch_out.double() - exact).abs().max().item()
    assert err <= 2 * torch_err + ATOL[dtype], f"kernel error {err:.3g} vs PyTorch {torch_err:.3g} ({dtype})"


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


# ---------------------------------------------------------------------------- attention
def run_attention(qkv: torch.Tensor, dtype: torch.dtype) -> None:
    B, N, _, H, D = qkv.shape
    out = poisoned((B, N, H * D), dtype, qkv.device)
    att.attention_launch(qkv, out)
    exact = att.attention_reference(qkv.double())  # same rounded inputs, exact arithmetic
    check_2x(out, att.attention_reference(qkv), exact, dtype)


@pytest.mark.parametrize("B, N, H, D", [(2, 197, 2, 64), (1, 577, 1, 64), (2, 50, 3, 32), (1, 1025, 1, 32), (3, 1, 2, 80),
                                        (1, 13, 2, 96), (1, 65, 1, 128), (1, 33, 2, 72), (1, 40, 1, 5), (1, 17, 1, 160)])  # fmt: skip
def test_attention_odd_shapes(device, dtype, B, N, H, D):
    run_attention(torch.randn(B, N, 3, H, D, device=device).to(dtype), dtype)


@pytest.mark.parametrize("block_m, block_n, tail", [(32, 32, 0), (32, 16, 16), (64, 32, 16), (16, 64, 0)])
@pytest.mark.parametrize("N", [1, 15, 16, 17, 47, 64, 97])
def test_attention_tilings(device, monkeypatch, block_m, block_n, tail, N):
    """Each tiling the autotuner can pick, at N below, at and around its tile sizes: full tiles, query
    and key tails of TAIL rows, or (TAIL=0) one more masked tile of the full width."""
    import triton

    config = triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "TAIL": tail, "WHOLE": False}, num_warps=4, num_stages=1)
    monkeypatch.setattr(att._attention_fwd_kernel, "configs", [config])  # one config: no tuning
    run_attention(torch.randn(2, N, 3, 2, 32, device=device), torch.float32)
    run_attention(torch.randn(1, N, 3, 2, 80, device=device), torch.float32)  # head dim in two column tiles, 64 + 16


@pytest.mark.parametrize("N, D", [(1, 32), (15, 16), (64, 64), (65, 32), (197, 64), (256, 32), (40, 128)])
def test_attention_whole_head_programs(device, monkeypatch, N, D):
    """A WHOLE config: one program per (batch, head) holding its N <= 256 keys and values, its query tiles in a
    loop, each with all of its scores at once and one softmax pass (no running max): the 2x rule, wide logits
    too (fp16; bf16 on the GPU only: the interpreter's bf16 dot is wrong). The prune keeps WHOLE configs to
    these cases (tests/test_kernel_limits.py)."""
    import triton

    # on a GPU the configs the tuner can pick (64 query rows: wgmma on Hopper), under the interpreter a 32-row one
    shipped = [c for c in att._configs() if c.kwargs["WHOLE"]]
    for config in shipped or [triton.Config({"BLOCK_M": 32, "BLOCK_N": 256, "TAIL": 0, "WHOLE": True}, num_warps=4, num_stages=1)]:
        monkeypatch.setattr(att._attention_fwd_kernel, "configs", [config])  # one config: no tuning
        for dtype in (torch.float16, torch.bfloat16) if device == "cuda" else (torch.float16,):
            run_attention(torch.randn(2, N, 3, 3, D, device=device).to(dtype), dtype)
        run_attention((8 * torch.randn(1, N, 3, 2, D, device=device)).half(), torch.float16)
    if N <= 64:  # more keys than the config holds: refused, not computed over the first 256 alone
        qkv = torch.randn(1, 257, 3, 1, D, device=device).half()
        with pytest.raises(RuntimeError, match="holds 256 keys, not N = 257"):
            att.attention_launch(qkv, torch.empty(1, 257, D, dtype=torch.float16, device=device))


def test_attention_reads_strided_qkv_without_copies(device):
    """qkv as the Linear output view, sliced along batch and tokens: not contiguous."""
    B, N, H, D = 3, 40, 2, 48
    full = torch.randn(B * 2, N + 7, 3 * H * D, device=device)
    qkv = full[::2, 3 : 3 + N].unflatten(-1, (3, H, D))
    assert not qkv.is_contiguous()
    run_attention(qkv, torch.float32)


def test_attention_large_logits_stay_finite(device):
    """Scores around 1e3 would overflow a naive exp; the running max keeps softmax finite."""
    run_attention(30 * torch.randn(1, 97, 3, 2, 64, device=device), torch.float32)


@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 2), N=st.integers(1, 90), H=st.integers(1, 3), D=st.integers(16, 128))
def test_attention_property(B, N, H, D):
    import os

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    run_attention(torch.randn(B, N, 3, H, D, device=device), torch.float32)


def test_attention_op_matches_launcher(device):
    qkv = torch.randn(2, 30, 3, 2, 32, device=device)
    out = poisoned((2, 30, 64), torch.float32, device)
    att.attention_launch(qkv, out, 0.3)
    assert torch.equal(att.fused_attention(qkv, 0.3), out)


def test_attention_rejects_bad_input(device):
    with pytest.raises(ValueError, match=r"\[B, N, 3, H, D\]"):
        att.fused_attention(torch.randn(1, 4, 2, 2, 32, device=device), 0.1)
    with pytest.raises(ValueError, match="head_dim 1..256"):
        att.fused_attention(torch.randn(1, 4, 3, 1, 300, device=device), 0.1)
    qkv = torch.randn(1, 4, 3, 1, 32, device=device)
    for scale in (0.0, -0.1, float("nan")):  # the kernel takes each row's max before scaling
        with pytest.raises(ValueError, match="positive scale"):
            att.attention_launch(qkv, poisoned((1, 4, 32), torch.float32, device), scale)


# ---------------------------------------------------------------------------- add + LayerNorm / RMSNorm
@pytest.mark.parametrize("C", [192, 384, 768, 1024, 1280, 100, 37])
def test_add_layernorm_hidden_sizes(device, dtype, C):
    run_add_layernorm((2, 5, C), dtype, device)


@pytest.mark.parametrize("gamma", [True, False], ids=["layerscale", "no-layerscale"])
@pytest.mark.parametrize("C", [1024, 1000, 100, 37])
@pytest.mark.parametrize("lead", [(1,), (2, 5), (67,)])
def test_add_rmsnorm_hidden_sizes(device, dtype, lead, C, gamma):
    run_add_layernorm((*lead, C), dtype, device, rms=True, gamma=gamma)


def run_add_layernorm(shape, dtype, device, with_branch=True, rms=False, gamma=False):
    """add + LayerNorm (or RMSNorm with `rms`), the branch scaled by a LayerScale with `gamma`."""
    C = shape[-1]
    x = (torch.randn(shape, device=device) + 1.0).to(dtype)  # an offset mean, as a real residual stream has
    y = torch.randn(shape, device=device).to(dtype) if with_branch else None
    w = (1 + 0.1 * torch.randn(C, device=device)).to(dtype)
    b = None if rms else (0.1 * torch.randn(C, device=device)).to(dtype)
    g = (0.5 * torch.randn(C, device=device)).to(dtype) if gamma else None
    out, res = poisoned(shape, dtype, device), poisoned(shape, dtype, device)
    aln.add_layernorm_launch(x, y, w, b, 1e-6, out, res if with_branch else None, gamma=g, rms=rms)

    def reference(x, y, w, b, g):
        return aln.add_rmsnorm_reference(x, y, w, 1e-6, g) if rms else aln.add_layernorm_reference(x, y, w, b, 1e-6, g)

    exact_res, exact = reference(*(t.double() if t is not None else None for t in (x, y, w, b, g)))
    torch_res, torch_out = reference(x, y, w, b, g)
    check_2x(out, torch_out, exact, dtype)
    if with_branch:
        check_2x(res, torch_res, exact_res, dtype)


def test_plain_layernorm(device, dtype):
    run_add_layernorm((3, 7, 768), dtype, device, with_branch=False)


@pytest.mark.parametrize("shape", [(3, 7, 1024), (5, 100), (1, 37)])
def test_plain_rmsnorm(device, dtype, shape):
    run_add_layernorm(shape, dtype, device, with_branch=False, rms=True)


def test_layernorm_ops_match_launcher(device):
    x, y = torch.randn(2, 3, 64, device=device), torch.randn(2, 3, 64, device=device)
    w, b = torch.randn(64, device=device), torch.randn(64, device=device)
    res, out = aln.add_layernorm(x, y, w, b, 1e-5)
    exact_res, exact = aln.add_layernorm_reference(x, y, w, b, 1e-5)
    torch.testing.assert_close(res, exact_res)
    torch.testing.assert_close(out, exact, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aln.layernorm(x, w, b, 1e-5), aln.add_layernorm_reference(x, None, w, b, 1e-5)[1], atol=1e-5, rtol=1e-5)


def test_rmsnorm_ops_match_launcher(device):
    x, y = torch.randn(2, 3, 100, device=device) + 1, torch.randn(2, 3, 100, device=device)
    w, g = torch.randn(100, device=device), torch.randn(100, device=device)
    for gamma in (None, g):
        res, out = poisoned(x.shape, torch.float32, device), poisoned(x.shape, torch.float32, device)
        aln.add_layernorm_launch(x, y, w, None, 1e-5, out, res, gamma, rms=True)
        assert all(torch.equal(a, b) for a, b in zip(aln.add_rmsnorm(x, y, w, 1e-5, gamma), (res, out)))
        torch.testing.assert_close(out, aln.add_rmsnorm_reference(x, y, w, 1e-5, gamma)[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aln.rmsnorm(x, w, 1e-5), torch.nn.functional.rms_norm(x, (100,), w, 1e-5), atol=1e-5, rtol=1e-5)


def test_norm_bias_goes_with_layernorm_only(device):
    x, w = torch.randn(2, 8, device=device), torch.randn(8, device=device)
    out = torch.empty_like(x)
    with pytest.raises(ValueError, match="RMSNorm takes no bias, LayerNorm needs one"):
        aln.add_layernorm_launch(x, None, w, w, 1e-6, out, rms=True)
    with pytest.raises(ValueError, match="RMSNorm takes no bias, LayerNorm needs one"):
        aln.add_layernorm_launch(x, None, w, None, 1e-6, out)
    with pytest.raises(ValueError, match=r"weight and bias must be \[8\], got weight \(7,\)"):
        aln.rmsnorm(x, w[:7], 1e-6)


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 9), C=st.integers(1, 1300), rms=st.booleans())
def test_add_layernorm_property(rows, C, rms):
    import os

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    run_add_layernorm((rows, C), torch.float32, device, rms=rms)


# ---------------------------------------------------------------------------- bias + GELU
@pytest.mark.parametrize("approximate", ["none", "tanh", "sigmoid"])
@pytest.mark.parametrize("shape", [(2, 5, 768), (3, 37), (1, 7, 1000), (4, 3072)])
def test_bias_gelu(device, dtype, approximate, shape):
    x = (3 * torch.randn(shape, device=device)).to(dtype)
    b = torch.randn(shape[-1], device=device).to(dtype)
    out = poisoned(shape, dtype, device)
    bg.bias_gelu_launch(x, b, out, approximate)
    exact = bg.bias_gelu_reference(x.double(), b.double(), approximate)
    check_2x(out, bg.bias_gelu_reference(x, b, approximate), exact, dtype)


@triton.jit
def _gelu_probe(X, Y, n, FORM: tl.constexpr, FAST: tl.constexpr, BLOCK: tl.constexpr):
    """bg.gelu of x in fp32, stored in fp32: the form a 16-bit output takes (FAST) without its rounding."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(Y + offs, bg.gelu(x, FORM, FAST), mask=offs < n)


def test_fast_erf_gelu_is_as_accurate_as_fp32_erf_and_keeps_its_negative_tail(device):
    """The erfc form 16-bit outputs take: within 2x of PyTorch's fp32 erf GELU's absolute error against
    float64, relative error < 2e-5 down to |GELU| = 1e-30 (PyTorch's fp32 form rounds 1 + erf to 0 below
    x ~ -5.5), and +inf, nan, 0 and huge inputs come out as GELU's limits (-inf gives nan, as PyTorch's does)."""
    special = [0.0, -0.0, float("inf"), float("nan"), 1e30, -1e30, 3e38, -3e38]
    x = torch.cat([torch.linspace(-14, 14, 20001), torch.tensor(special)]).to(device)
    out = poisoned(x.shape, torch.float32, device)
    _gelu_probe[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), FORM=0, FAST=True, BLOCK=1024)
    xd = x.double()
    exact = 0.5 * xd * torch.special.erfc(-xd / math.sqrt(2))  # x Phi(x) with both tails accurate
    grid, tail = slice(0, -len(special)), exact.abs() > 1e-30
    err, torch_err = ((y[grid].double() - exact[grid]).abs().max().item() for y in (out, F.gelu(x)))
    assert err <= 2 * torch_err, f"error {err:.3g} vs PyTorch's fp32 GELU {torch_err:.3g}"
    rel = ((out.double() - exact) / exact)[grid][tail[grid]].abs().max().item()
    assert rel < 2e-5, f"relative error {rel:.3g}"
    assert out[(x < -6) & (x > -12)].ne(0).all(), "the negative tail cancelled to 0"
    torch.testing.assert_close(out[-len(special):].cpu(), torch.tensor([0.0, 0.0, float("inf"), float("nan"), 1e30, 0.0, 3e38, 0.0]),
                               equal_nan=True, atol=0, rtol=1e-6)


def test_bias_gelu_rejects_unknown_form(device):
    with pytest.raises(ValueError, match="approximate must be one of none, tanh, sigmoid, got 'quick'"):
        bg.bias_gelu(torch.randn(2, 8, device=device), torch.randn(8, device=device), "quick")


def test_gelu_sigmoid_form_is_quick_gelu_and_saturates(device):
    """The sigmoid form is CLIP's QuickGELU x sigmoid(1.702 x) (written out here, in float64) and
    stays finite where exp(-1.702 x) overflows fp32 (x = -1e4 gives -0)."""
    x = torch.tensor([[-1e4, -60.0, -3.0, -0.5, 0.0, 0.5, 3.0, 60.0, 1e4]], device=device)
    out = poisoned(x.shape, torch.float32, device)
    bg.bias_gelu_launch(x, torch.zeros(x.shape[1], device=device), out, "sigmoid")
    expected = x.double() / (1 + torch.exp(-1.702 * x.double()))
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------- bias + SwiGLU
@pytest.mark.parametrize("shape", [(2, 5, 2 * 384), (3, 2 * 37), (1, 7, 2 * 1000), (4, 2 * 4096)])
def test_bias_swiglu(device, dtype, shape):
    x = (3 * torch.randn(shape, device=device)).to(dtype)
    b = torch.randn(shape[-1], device=device).to(dtype)
    out = poisoned((*shape[:-1], shape[-1] // 2), dtype, device)
    bsw.bias_swiglu_launch(x, b, out)
    check_2x(out, bsw.bias_swiglu_reference(x, b), bsw.bias_swiglu_reference(x.double(), b.double()), dtype)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_bias_swiglu_is_silu_of_the_first_half_times_the_second_and_saturates(device, packed):
    """Written out in float64: the gate is the first half (timm's SwiGLUPacked, DINOv2's weights_in), or
    the first tensor (timm's SwiGLU, AIMv2's fc1_g), and silu stays finite where exp(-g) overflows
    fp32 (g = -1e4 gives -0 times the value)."""
    gate = torch.tensor([[-1e4, -60.0, -3.0, -0.5, 0.0, 0.5, 3.0, 60.0, 1e4]], device=device)
    value = torch.linspace(-2, 2, 9, device=device)[None]
    bias = torch.randn(18, device=device)
    out = poisoned(gate.shape, torch.float32, device)
    if packed:
        bsw.bias_swiglu_launch(torch.cat([gate, value], -1) - bias, bias, out)
    else:
        bsw.swiglu_launch(gate, value, out)
    g, v = gate.double(), value.double()
    torch.testing.assert_close(out.double(), g / (1 + torch.exp(-g)) * v, atol=1e-3, rtol=1e-5)  # x - b + b rounds in fp32


@pytest.mark.parametrize("shape", [(2, 5, 384), (3, 37), (1, 7, 1000), (2, 2816)])
def test_swiglu(device, dtype, shape):
    gate, value = ((3 * torch.randn(shape, device=device)).to(dtype) for _ in range(2))
    out = poisoned(shape, dtype, device)
    bsw.swiglu_launch(gate, value, out)
    check_2x(out, bsw.swiglu_reference(gate, value), bsw.swiglu_reference(gate.double(), value.double()), dtype)


def test_swiglu_reads_strided_gate_and_value(device, dtype):
    """gate and value as column slices of one GEMM output (fc1_g and fc1_x stacked: row stride 2H),
    value also sliced along tokens (another row stride), read in place; a transposed value (columns
    not contiguous) is copied first, and still right."""
    B, N, H = 2, 9, 100
    fc1 = (3 * torch.randn(B, N, 2 * H, device=device)).to(dtype)
    tokens = (3 * torch.randn(B, 2 * N, H + 5, device=device)).to(dtype)
    gate, in_place = fc1[..., :H], (fc1[..., H:], tokens[:, ::2, 3 : 3 + H])
    assert all(_common.rows_view(t, H).data_ptr() == t.data_ptr() for t in (gate, *in_place))  # no copies
    for value in (*in_place, torch.randn(B, H, N, device=device).to(dtype).transpose(1, 2)):
        assert not value.is_contiguous() and not gate.is_contiguous()
        out = poisoned((B, N, H), dtype, device)
        bsw.swiglu_launch(gate, value, out)
        check_2x(out, bsw.swiglu_reference(gate, value), bsw.swiglu_reference(gate.double(), value.double()), dtype)
        assert torch.equal(bsw.swiglu(gate, value), out)


def test_bias_swiglu_rejects_bad_input(device):
    with pytest.raises(ValueError, match="must be even, got 7"):
        bsw.bias_swiglu(torch.randn(2, 7, device=device), torch.randn(7, device=device))
    with pytest.raises(ValueError, match=r"bias must be \[8\]"):
        bsw.bias_swiglu(torch.randn(2, 8, device=device), torch.randn(4, device=device))
    with pytest.raises(ValueError, match="gate and value must agree in shape and dtype"):
        bsw.swiglu(torch.randn(2, 8, device=device), torch.randn(2, 7, device=device))
    with pytest.raises(ValueError, match="gate and value must agree in shape and dtype"):
        bsw.swiglu(torch.randn(2, 8, device=device), torch.randn(2, 8, device=device).half())


# ---------------------------------------------------------------------------- GEMM + epilogue
EPILOGUES = ["gelu", "gelu_tanh", "gelu_sigmoid", "residual", "residual_gamma", "bias_only"]


def epilogue_args(epilogue: str, out_shape, dtype, device) -> dict:
    """Keyword arguments of linear_epilogue_launch for one epilogue, random tensors in dtype."""
    N = out_shape[-1]
    if epilogue.startswith("gelu"):
        return {"gelu": epilogue.removeprefix("gelu_") if "_" in epilogue else "none"}
    if epilogue.startswith("residual"):
        gamma = (1 + 0.5 * torch.randn(N, device=device)).to(dtype) if epilogue == "residual_gamma" else None
        return {"residual": torch.randn(out_shape, device=device).to(dtype), "gamma": gamma}
    return {}


def run_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype, kernel: str = "auto", **kw) -> None:
    out = poisoned((*x.shape[:-1], w.shape[0]), dtype, x.device)
    assert le.linear_epilogue_launch(x, w, b, out, **kw, kernel=kernel) is out
    as_double = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    exact = le.linear_epilogue_reference(x.double(), w.double(), None if b is None else b.double(), **as_double)  # same rounded inputs
    check_2x(out, le.linear_epilogue_reference(x, w, b, **kw), exact, dtype)


def linear_inputs(M_shape, K, N, dtype, device, bias=True):
    x = torch.randn(*M_shape, K, device=device).to(dtype)
    w = (torch.randn(N, K, device=device) * K**-0.5).to(dtype)  # outputs of order 1, like a trained layer
    b = torch.randn(N, device=device).to(dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("M_shape, K, N", [((3, 197), 192, 192),  # ViT-Ti fc1-sized rows x 4*48 columns
                                           ((2, 50), 100, 37), ((1, 13), 769, 65), ((5,), 1, 3)])  # fmt: skip
def test_linear_epilogue_odd_shapes(device, dtype, epilogue, M_shape, K, N, bias):
    """The pointer kernel (what traces launch, and eager calls before Hopper); the TMA kernel has tests of its own."""
    x, w, b = linear_inputs(M_shape, K, N, dtype, device, bias)
    run_linear(x, w, b, dtype, kernel="pointer", **epilogue_args(epilogue, (*M_shape, N), dtype, device))


def test_linear_epilogue_reads_strided_inputs_without_copies(device):
    """x sliced (row stride) or transposed (column stride), W a slice of a wider matrix (as a
    fused qkv weight would be), residual transposed: all read through their strides."""
    K, N = 40, 24
    big = torch.randn(2 * 30, K + 9, device=device)
    w = (torch.randn(2 * N, K + 3, device=device) * K**-0.5)[::2, 2 : 2 + K]
    b = torch.randn(N, device=device)
    residual_t = torch.randn(N, 30, device=device).t()
    for x in (big[::2, 5 : 5 + K], torch.randn(K, 30, device=device).t()):
        assert not x.is_contiguous() and not w.is_contiguous()
        assert x.reshape(30, K).data_ptr() == x.data_ptr()  # 2-D: passed as it is
        run_linear(x, w, b, torch.float32, gelu="none")
        run_linear(x, w, b, torch.float32, residual=residual_t, gamma=torch.randn(N, device=device))
    # leading dims that cannot be flattened as a view are copied first, and still right
    x3 = torch.randn(3, 20, K, device=device)[:, ::2]
    run_linear(x3, w, b, torch.float32, gelu="tanh")


@settings(max_examples=15, deadline=None)
@given(M=st.integers(1, 80), K=st.integers(1, 80), N=st.integers(1, 80), epilogue=st.sampled_from(EPILOGUES), bias=st.booleans())
def test_linear_epilogue_property(M, K, N, epilogue, bias):
    import os

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    x, w, b = linear_inputs((M,), K, N, torch.float32, device, bias)
    run_linear(x, w, b, torch.float32, **epilogue_args(epilogue, (M, N), torch.float32, device))


def test_linear_epilogue_ops_match_launcher(device):
    x, w, b = linear_inputs((2, 9), 48, 20, torch.float32, device)
    r, g = torch.randn(2, 9, 20, device=device), torch.randn(20, device=device)
    for bias in (b, None):
        for approximate in ("none", "tanh", "sigmoid"):
            out = poisoned((2, 9, 20), torch.float32, device)
            assert torch.equal(le.linear_bias_gelu(x, w, bias, approximate), le.linear_epilogue_launch(x, w, bias, out, gelu=approximate))
        for gamma in (None, g):
            out = poisoned((2, 9, 20), torch.float32, device)
            expected = le.linear_epilogue_launch(x, w, bias, out, residual=r, gamma=gamma)
            assert torch.equal(le.linear_bias_residual(x, w, bias, r, gamma), expected)


def test_linear_epilogue_rejects_bad_input(device, monkeypatch):
    x, w, b = linear_inputs((4,), 16, 8, torch.float32, device)
    out = torch.empty(4, 8, device=device)
    with pytest.raises(ValueError, match="must agree on K"):
        le.linear_bias_gelu(x, w[:, :15], b, "none")
    with pytest.raises(ValueError, match=r"bias must be \[8\]"):
        le.linear_bias_gelu(x, w, b[:7], "none")
    with pytest.raises(ValueError, match="gelu must be None or one of none, tanh, sigmoid"):
        le.linear_bias_gelu(x, w, b, "quick")
    with pytest.raises(ValueError, match="must be torch.float32 like x, got weight torch.float16"):
        le.linear_bias_gelu(x, w.half(), b, "none")
    with pytest.raises(ValueError, match=r"residual must be \(4, 8\)"):
        le.linear_bias_residual(x, w, b, torch.randn(4, 9, device=device), None)
    with pytest.raises(ValueError, match=r"gamma must be \[8\]"):
        le.linear_bias_residual(x, w, b, out, torch.randn(3, device=device))
    with pytest.raises(ValueError, match="pass residual too"):
        le.linear_epilogue_launch(x, w, b, out, gamma=b)
    with pytest.raises(ValueError, match="must not be residual itself"):
        le.linear_epilogue_launch(x, w, b, out, residual=out)
    with pytest.raises(ValueError, match="out must be a contiguous tensor of shape"):
        le.linear_epilogue_launch(x, w, b, torch.empty(8, 4, device=device).t())
    monkeypatch.setattr("vitfast.kernels._common.INTERPRET", False)
    if device == "cpu":
        with pytest.raises(ValueError, match="need CUDA tensors.*TRITON_INTERPRET=1"):  # the op takes its reference
            le.linear_epilogue_launch(x, w, b, out, gelu="none")


# ---------------------------------------------------------------------------- the Hopper (TMA) GEMM
@pytest.fixture(params=[torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def tma_dtype(request, device) -> torch.dtype:
    """fp16 / bf16 (all the TMA kernel takes), on CPU under the interpreter or on a GPU of compute capability >= 9."""
    if request.param == torch.bfloat16 and device == "cpu":
        pytest.skip("bf16 is checked on the GPU only (see the module docstring)")
    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the TMA kernel needs compute capability 9.0 (Hopper) or newer")
    return request.param


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("M_shape, K, N", [((3, 197), 192, 200),  # several tiles per persistent program, a partial one on each edge
                                           ((1, 13), 776, 72), ((5,), 8, 8)])  # K past one BLOCK_K, then smaller than one  # fmt: skip
def test_linear_epilogue_tma_kernel(device, tma_dtype, epilogue, M_shape, K, N, bias):
    """The persistent TMA kernel (forced), every epilogue, against float64 with the 2x rule; TMA-ready
    widths (multiples of 8), partial tiles on every edge."""
    x, w, b = linear_inputs(M_shape, K, N, tma_dtype, device, bias)
    run_linear(x, w, b, tma_dtype, **epilogue_args(epilogue, (*M_shape, N), tma_dtype, device), kernel="tma")


def test_linear_epilogue_tma_kernel_reads_row_strides(device, tma_dtype):
    """x a column slice of a wider buffer (row stride 16-byte aligned, not its width), W a column slice of
    a wider weight: both read through their row strides (2x rule against float64)."""
    K, N, M = 64, 48, 70
    x = torch.randn(M, K + 16, device=device).to(tma_dtype)[:, 8 : 8 + K]
    w = (torch.randn(N, K + 8, device=device) * K**-0.5).to(tma_dtype)[:, :K]
    assert not x.is_contiguous() and not w.is_contiguous()
    b, r = torch.randn(N, device=device).to(tma_dtype), torch.randn(M, N, device=device).to(tma_dtype)
    run_linear(x, w, b, tma_dtype, gelu="none", kernel="tma")
    run_linear(x, w, b, tma_dtype, residual=r, kernel="tma")


def test_linear_epilogue_tma_kernel_refuses_what_tma_cannot_read(device):
    """Forced on operands TMA cannot take, the launcher says why instead of faulting inside the copy engine."""
    from vitfast.errors import InputError

    x, w, b = linear_inputs((4,), 100, 8, torch.float16, device)  # row stride 200 bytes: not 16-byte aligned
    with pytest.raises(InputError, match="kernel='tma' needs fp16/bf16 operands .* 16-byte aligned"):
        le.linear_epilogue_launch(x, w, b, torch.empty(4, 8, dtype=torch.float16, device=device), kernel="tma")
    x, w, b = linear_inputs((4,), 16, 8, torch.float32, device)
    with pytest.raises(InputError, match="kernel='tma' needs fp16/bf16"):
        le.linear_epilogue_launch(x, w, b, torch.empty(4, 8, device=device), kernel="tma")
    x, w, b = linear_inputs((4,), 24, 8, torch.float16, device)
    with pytest.raises(InputError, match="16-byte aligned"):  # start 2 bytes into the buffer
        le.linear_epilogue_launch(x.view(-1)[1 : 1 + 3 * 24].view(3, 24), w, b, torch.empty(3, 8, dtype=torch.float16, device=device),
                                  kernel="tma")  # fmt: skip
    with pytest.raises(ValueError, match="kernel must be one of auto, tma, pointer"):
        le.linear_epilogue_launch(x, w, b, torch.empty(4, 8, dtype=torch.float16, device=device), kernel="wgmma")


def test_auto_takes_the_tma_kernel_only_in_eager_calls_on_hopper(device, monkeypatch):
    """kernel="auto": the TMA kernel on compute capability >= 9 for TMA-ready operands outside traces;
    the pointer kernel under a trace (torch.compile / torch.export launch through wrap_triton), for
    unaligned operands, before Hopper, on CPU and under VITFAST_TMA=0. Which kernel launched is read off
    the recorded launch."""
    from vitfast.kernels.precompile import recording

    def launched(x, w, **kw) -> str:
        with recording(cpu=device == "cpu") as calls:
            le.linear_epilogue_launch(x, w, None, torch.empty(*x.shape[:-1], w.shape[0], dtype=x.dtype, device=device), **kw)
        return calls[0].jit.__name__

    x, w, _ = linear_inputs((2, 9), 64, 40, torch.float16, device)
    hopper = device == "cuda" and torch.cuda.get_device_capability()[0] >= 9
    assert launched(x, w) == ("_linear_epilogue_tma_kernel" if hopper else "_linear_epilogue_kernel")
    assert launched(x, w, kernel="pointer") == "_linear_epilogue_kernel"
    x60, w60, _ = linear_inputs((2, 9), 60, 40, torch.float16, device)
    assert launched(x60, w60) == "_linear_epilogue_kernel"  # 120-byte rows: not TMA-ready
    monkeypatch.setenv("VITFAST_TMA", "0")
    assert launched(x, w) == "_linear_epilogue_kernel"
    assert launched(x, w, kernel="tma") == "_linear_epilogue_tma_kernel"  # forcing it still works (tests, benchmarks)
    monkeypatch.delenv("VITFAST_TMA")
    with FakeTensorMode() as fake:  # as inside a trace: fake tensors, wrap_triton's switch on
        assert launched(fake.from_tensor(x), fake.from_tensor(w)) == "_linear_epilogue_kernel"


def test_launches_on_real_tensors_skip_torchs_wrapper(monkeypatch):
    """Outside every op torch's wrap_triton switch reads on, yet a launch on real tensors is no trace: it
    launches the kernel itself. Through torch's higher-order op an autotuned kernel with a config prune
    became a new autotuner with an empty cache on each call, so every launch re-ran the tuning (the H200 run
    of 2026-11-27: 0.5-1.2 s per GEMM call). Fake tensors (a trace) still get torch's wrapper; in an op's
    eager call (the switch off) nothing is a trace; under a dispatch mode real tensors may be."""
    wrapped = []
    monkeypatch.setattr(torch.library, "wrap_triton", lambda k: wrapped.append(k) or "torch's wrapper")
    monkeypatch.setattr(_common, "INTERPRET", False)  # the compiled path's rule (the interpreter never wraps)
    kernel, real = le._linear_epilogue_kernel, torch.randn(4, 8)
    assert _common.hop_dispatch_enabled()  # outside every op
    assert _common.wrap_triton(kernel, real) is kernel and not wrapped
    assert _common.wrap_triton(kernel, torch.nn.Parameter(real)) is kernel and not wrapped  # weights are plain too
    with FakeTensorMode() as fake:
        assert _common.wrap_triton(kernel, fake.from_tensor(real)) == "torch's wrapper" and wrapped == [kernel]
        with _common.eager_dispatch():
            assert not _common.tracing(fake.from_tensor(real))

    class Watching(TorchDispatchMode):  # as make_fx on real tensors: a mode sees every op
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watching():
        assert _common.tracing(real)

    class Subclass(torch.Tensor):  # a tensor subclass met with no mode on the stack (a fake one inside its own mode's dispatch)
        pass

    assert _common.tracing(real.as_subclass(Subclass))
    seen = []  # torch.func transforms: their wrappers are plain-typed and no Python mode is on
    torch.func.functionalize(lambda t: seen.append(_common.tracing(t)) or t * 2)(real)
    torch.func.vmap(lambda t: seen.append(_common.tracing(t)) or t * 2)(real)
    assert seen == [True, True]


# ---------------------------------------------------------------------------- tracing
def test_rmsnorm_no_bias_and_swiglu_ops_trace_as_one_graph(device):
    """The ops an AIMv2 block calls (RMSNorm, linears without bias, unpacked SwiGLU on column slices)
    trace with their None arguments: one graph, no break; torch.compile(fullgraph=True) and
    torch.export match eager. On CPU the traced ops take their reference math (see test_optimize's
    test_optimized_model_traces_as_one_graph), eager runs the kernels."""
    C, H = 40, 72
    p = {k: torch.randn(*s, device=device) * (s[-1] ** -0.5 if len(s) == 2 else 1) for k, s in
         dict(norm=(C,), ln_b=(C,), proj=(C, C), fc1=(2 * H, C), fc2=(C, H), fc2_gelu=(C, 2 * H)).items()}  # fmt: skip
    ops = torch.ops.vitfast

    def block(x):
        h = ops.rmsnorm(x, p["norm"], 1e-5)
        x, h = ops.add_rmsnorm(x, torch.nn.functional.linear(h, p["proj"]), p["norm"], 1e-5, None)
        gv = torch.nn.functional.linear(h, p["fc1"])  # fc1_g and fc1_x stacked
        x, h = ops.linear_residual_rmsnorm(ops.swiglu(gv[..., :H], gv[..., H:]), p["fc2"], None, x, None, p["norm"], 1e-5)
        x, h = ops.linear_residual_layernorm(h, p["proj"], None, x, p["norm"], p["norm"], p["ln_b"], 1e-5)
        return ops.linear_bias_residual(ops.linear_bias_gelu(h, p["fc1"], None, "tanh"), p["fc2_gelu"], None, x, None)

    x = torch.randn(2, 7, C, device=device) + 1
    ops_seen = traced_vitfast_ops(block, x, block(x), device)
    assert ops_seen == {f"vitfast.{op}.default" for op in ("rmsnorm", "add_rmsnorm", "swiglu", "linear_residual_rmsnorm",
                                                           "linear_residual_layernorm", "linear_bias_gelu", "linear_bias_residual")}
