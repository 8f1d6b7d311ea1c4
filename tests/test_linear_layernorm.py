"""The branch-end kernels of the optimized block against a float64 reference with the 2x rule:
GEMM + bias + LayerScale + residual + LayerNorm or RMSNorm (kernels/linear_layernorm.py) and add +
LayerNorm with a LayerScale (kernels/add_layernorm.py). Outputs are poisoned with NaN before the launch."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'vitfast[triton]')")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_kernels import check_2x, dtype, poisoned, tma_dtype  # noqa: E402,F401  (dtype, tma_dtype are fixtures)

from vitfast.kernels import add_layernorm as aln  # noqa: E402
from vitfast.kernels import linear_layernorm as ll  # noqa: E402


def branch_inputs(lead, K, N, dtype, device, gamma=True, bias=True, rms=False):
    """x [*lead, K], W [N, K], bias, residual [*lead, N], gamma, norm weight/bias; rounded to dtype.
    bias, gamma (and ln_bias with `rms`, for RMSNorm) None when left out."""
    t = dict(
        x=torch.randn(*lead, K), weight=torch.randn(N, K) * K**-0.5, bias=torch.randn(N) if bias else None,
        residual=3 * torch.randn(*lead, N) + 1.0,  # an offset mean, as a real residual stream has
        gamma=0.1 * torch.randn(N) if gamma else None, ln_weight=1 + 0.1 * torch.randn(N), ln_bias=None if rms else 0.1 * torch.randn(N),
    )  # fmt: skip
    return {k: v.to(device=device, dtype=dtype) if v is not None else None for k, v in t.items()}


def branch_reference(t: dict, eps: float, rms: bool, double: bool = False):
    """(r, norm(r)) in plain PyTorch for branch_inputs `t` (in float64 with `double`)."""
    t = {k: v.double() if double and v is not None else v for k, v in t.items()}
    if rms:
        return ll.linear_residual_rmsnorm_reference(*(v for k, v in t.items() if k != "ln_bias"), eps)
    return ll.linear_residual_layernorm_reference(*t.values(), eps)


def run_branch(t: dict, rms: bool, kernel: str = "auto") -> None:
    """The launcher on branch_inputs `t` against the float64 reference, 2x rule, poisoned outputs."""
    x = t["x"]
    shape = (*x.shape[:-1], t["weight"].shape[0])
    r_out, out = poisoned(shape, x.dtype, x.device), poisoned(shape, x.dtype, x.device)
    ll.linear_residual_layernorm_launch(**t, eps=1e-6, residual_out=r_out, out=out, rms=rms, kernel=kernel)
    exact, plain = branch_reference(t, 1e-6, rms, double=True), branch_reference(t, 1e-6, rms)
    check_2x(r_out, plain[0], exact[0], x.dtype)
    check_2x(out, plain[1], exact[1], x.dtype)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("gamma", [True, False], ids=["layerscale", "no-layerscale"])
@pytest.mark.parametrize("lead, K, N", [((2, 197), 192, 192), ((1, 50), 96, 200), ((3, 17), 384, 64), ((37,), 40, 1000)])
def test_linear_residual_layernorm_odd_shapes(device, dtype, gamma, bias, norm, lead, K, N):
    """The pointer kernel (what traces launch, and eager calls before Hopper); the TMA kernel is tested below."""
    rms = norm == "rmsnorm"
    run_branch(branch_inputs(lead, K, N, dtype, device, gamma, bias, rms), rms, kernel="pointer")


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("gamma", [True, False], ids=["layerscale", "no-layerscale"])
@pytest.mark.parametrize("lead, K, N", [((2, 197), 192, 200), ((1, 50), 776, 64), ((3,), 8, 24)])  # TMA-ready widths (multiples of 8)
def test_linear_residual_layernorm_tma_kernel(device, tma_dtype, gamma, bias, norm, lead, K, N):
    """The Hopper form (forced): x and W by TMA, K past one step and shorter than one, N across column chunks."""
    rms = norm == "rmsnorm"
    run_branch(branch_inputs(lead, K, N, tma_dtype, device, gamma, bias, rms), rms, kernel="tma")


def test_linear_residual_layernorm_tma_kernel_refuses_unaligned_rows(device):
    from vitfast.errors import InputError

    t = branch_inputs((4,), 100, 8, torch.float16, device)  # x rows of 200 bytes: not 16-byte aligned
    with pytest.raises(InputError, match=r"linear \+ LayerNorm: kernel='tma' needs fp16/bf16 operands"):
        run_branch(t, rms=False, kernel="tma")


@settings(max_examples=12, deadline=None)
@given(M=st.integers(1, 70), K=st.integers(1, 100), N=st.integers(1, 300), gamma=st.booleans(), bias=st.booleans(), rms=st.booleans())
def test_linear_residual_layernorm_property(M, K, N, gamma, bias, rms):
    """Any M, K, N (tails of every tile, N below / across column chunks), fp32, 2x rule."""
    import os

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    run_branch(branch_inputs((M,), K, N, torch.float32, device, gamma, bias, rms), rms)


def test_linear_residual_layernorm_reads_strided_inputs(device):
    """x sliced along tokens (not contiguous) and W as a column slice of a wider weight."""
    t = branch_inputs((2, 40), 64, 96, torch.float32, device)
    t["x"] = torch.randn(2, 80, 64, device=device)[:, ::2]
    t["weight"] = torch.randn(96, 128, device=device)[:, :64] * 0.125
    r, out = ll.linear_residual_layernorm(*t.values(), 1e-5)
    ref = ll.linear_residual_layernorm_reference(*t.values(), 1e-5)
    torch.testing.assert_close(r, ref[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out, ref[1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_linear_residual_rmsnorm_op_matches_launcher(device, bias):
    t = branch_inputs((2, 9), 48, 40, torch.float32, device, bias=bias, rms=True)
    r_out, out = poisoned((2, 9, 40), torch.float32, device), poisoned((2, 9, 40), torch.float32, device)
    ll.linear_residual_layernorm_launch(**t, eps=1e-5, residual_out=r_out, out=out, rms=True)
    del t["ln_bias"]
    got = ll.linear_residual_rmsnorm(*t.values(), 1e-5)
    assert torch.equal(got[0], r_out) and torch.equal(got[1], out)


def test_linear_residual_layernorm_rejects_bad_input(device):
    t = branch_inputs((2, 5), 16, 24, torch.float32, device)
    shape = (2, 5, 24)
    outs = dict(residual_out=torch.empty(shape, device=device), out=torch.empty(shape, device=device))
    with pytest.raises(ValueError, match="must agree on K"):
        ll.linear_residual_layernorm_launch(**(t | {"x": t["x"][..., :8]}), eps=1e-6, **outs)
    with pytest.raises(ValueError, match=r"gamma and the LayerNorm weight/bias must be \[24\], got gamma \(23,\)"):
        ll.linear_residual_layernorm_launch(**(t | {"gamma": t["gamma"][:23]}), eps=1e-6, **outs)
    with pytest.raises(ValueError, match="all tensors must be torch.float32"):
        ll.linear_residual_layernorm_launch(**(t | {"bias": t["bias"].half()}), eps=1e-6, **outs)
    with pytest.raises(ValueError, match="must not be residual itself"):
        ll.linear_residual_layernorm_launch(**t, eps=1e-6, residual_out=t["residual"], out=outs["out"])
    with pytest.raises(ValueError, match="RMSNorm takes no bias, LayerNorm needs one"):
        ll.linear_residual_layernorm_launch(**t, eps=1e-6, **outs, rms=True)
    with pytest.raises(ValueError, match="RMSNorm takes no bias, LayerNorm needs one"):
        ll.linear_residual_layernorm_launch(**(t | {"ln_bias": None}), eps=1e-6, **outs)


def test_add_layernorm_with_layerscale(device, dtype):
    x, y = (torch.randn(2, 197, 384, device=device).to(dtype) for _ in range(2))
    w, b, g = (torch.randn(384, device=device).to(dtype) for _ in range(3))
    res, out = poisoned(x.shape, dtype, device), poisoned(x.shape, dtype, device)
    aln.add_layernorm_launch(x, y, w, b, 1e-6, out, res, gamma=g)
    exact = aln.add_layernorm_reference(x.double(), y.double(), w.double(), b.double(), 1e-6, g.double())
    plain = aln.add_layernorm_reference(x, y, w, b, 1e-6, g)
    check_2x(res, plain[0], exact[0], dtype)
    check_2x(out, plain[1], exact[1], dtype)
    with pytest.raises(ValueError, match="gamma scales the branch"):
        aln.add_layernorm_launch(x, None, w, b, 1e-6, out, None, gamma=g)


def test_ops_take_the_reference_on_cpu_without_the_interpreter(monkeypatch):
    """Without TRITON_INTERPRET (or for fake tensors while tracing) a CPU op runs its reference
    math instead of failing in the launcher: this is what torch.compile / torch.export trace."""
    from vitfast.kernels import _common

    monkeypatch.setattr(_common, "INTERPRET", False)
    launched = []
    monkeypatch.setattr(ll, "linear_residual_layernorm_launch", lambda *a, **k: launched.append(1))
    t = branch_inputs((2, 7), 16, 24, torch.float32, "cpu")
    got = torch.ops.vitfast.linear_residual_layernorm(*t.values(), 1e-6)
    ref = ll.linear_residual_layernorm_reference(*t.values(), 1e-6)
    assert not launched and all(torch.equal(a, b) for a, b in zip(got, ref))
    t = branch_inputs((2, 7), 16, 24, torch.float32, "cpu", gamma=False, bias=False, rms=True)
    got = torch.ops.vitfast.linear_residual_rmsnorm(*(v for k, v in t.items() if k != "ln_bias"), 1e-6)
    assert not launched and all(torch.equal(a, b) for a, b in zip(got, branch_reference(t, 1e-6, rms=True)))
