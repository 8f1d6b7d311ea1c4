"""Kernel micro-benchmarks: attention TFLOP/s, add+LayerNorm GB/s, bias+GELU GB/s.

    VITFAST_TEST_DEVICE=cuda pytest benchmarks/test_bench_kernels.py --benchmark-only

On a GPU each kernel is checked against PyTorch, then timed with `triton.testing.do_bench`
(CUDA events, median, inputs rotated; `gpu_kernels.median_ms`) for the TFLOP/s or GB/s in
`extra_info`, and by pytest-benchmark itself for its table. On CPU the kernels run under
TRITON_INTERPRET=1 at tiny shapes: a correctness smoke test only, the time is the interpreter's.
"""

from __future__ import annotations

import os

# As tests/conftest.py (see benchmarks/test_bench_e2e.py for why this is not a conftest.py).
if os.environ.get("VITFAST_TEST_DEVICE", "cpu") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'vitfast[triton]')")
from vitfast.kernels import add_layernorm as aln  # noqa: E402
from vitfast.kernels import attention as att  # noqa: E402
from vitfast.kernels import bias_gelu as bg  # noqa: E402

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1"
DEVICE, DTYPE = ("cuda", torch.float16) if ON_GPU else ("cpu", torch.float32)
# GPU: ViT-B/16 at batch 64 (N=197 tokens, 12 heads of 64, C=768, 4C=3072); CPU: tiny and odd
ATTN = dict(B=64, N=197, H=12, D=64) if ON_GPU else dict(B=1, N=5, H=2, D=32)
ROWS, C = (64 * 197, 768) if ON_GPU else (5, 192)
TOL = 1e-2 if ON_GPU else 1e-4  # fp16 vs fp32 reference / fp32 interpreter vs fp32 PyTorch
PER_MS = {"TFLOPs": 1e9, "GBps": 1e6}  # FLOP per ms / 1e9 = TFLOP/s; bytes per ms / 1e6 = GB/s


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def measure(benchmark, fn, inputs: list[tuple], work: float, unit: str) -> None:
    """pytest-benchmark over rotating inputs; on a GPU also do_bench's median -> the rate in `unit`
    (`work` FLOPs or bytes per call) in extra_info."""
    state = {"i": 0}

    def step():
        state["i"] += 1
        fn(*inputs[state["i"] % len(inputs)])
        if ON_GPU:
            torch.cuda.synchronize()

    benchmark(step)
    if ON_GPU:
        from gpu_kernels import median_ms  # benchmarks/ is on sys.path under pytest's default import mode

        ms = median_ms(fn, inputs)
        benchmark.extra_info |= {"do_bench_median_ms": ms, unit: work / ms / PER_MS[unit]}
    else:
        benchmark.extra_info["note"] = "TRITON_INTERPRET=1: the time is the interpreter's, not the kernel's"


def test_attention(benchmark):
    B, N, H, D = ATTN.values()
    inputs = [(torch.randn(B, N, 3, H, D, device=DEVICE, dtype=DTYPE),) for _ in range(3)]
    qkv = inputs[0][0]
    assert rel_err(att.fused_attention(qkv, D**-0.5), att.attention_reference(qkv.float())) < TOL
    measure(benchmark, lambda q: att.fused_attention(q, D**-0.5), inputs, 4 * B * H * N * N * D, "TFLOPs")  # QK^T and PV


def test_add_layernorm(benchmark):
    inputs = [tuple(torch.randn(ROWS, C, device=DEVICE, dtype=DTYPE) for _ in range(2)) for _ in range(3)]
    w, b = 1 + 0.1 * torch.randn(C, device=DEVICE, dtype=DTYPE), torch.randn(C, device=DEVICE, dtype=DTYPE)
    x, y = inputs[0]
    res, out = aln.add_layernorm(x, y, w, b, 1e-6)
    ref_res, ref_out = aln.add_layernorm_reference(x.float(), y.float(), w.float(), b.float(), 1e-6)
    assert rel_err(res, ref_res) < TOL and rel_err(out, ref_out) < TOL
    nbytes = 4 * ROWS * C * x.element_size()  # read x, y; write x + y and LN(x + y)
    measure(benchmark, lambda x, y: aln.add_layernorm(x, y, w, b, 1e-6), inputs, nbytes, "GBps")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu(benchmark, approximate):
    inputs = [(3 * torch.randn(ROWS, 4 * C, device=DEVICE, dtype=DTYPE),) for _ in range(3)]
    bias = torch.randn(4 * C, device=DEVICE, dtype=DTYPE)
    x = inputs[0][0]
    assert rel_err(bg.bias_gelu(x, bias, approximate), bg.bias_gelu_reference(x.float(), bias.float(), approximate)) < TOL
    nbytes = 2 * x.numel() * x.element_size()  # read x, write gelu(x + bias); the bias stays in cache
    measure(benchmark, lambda x: bg.bias_gelu(x, bias, approximate), inputs, nbytes, "GBps")
