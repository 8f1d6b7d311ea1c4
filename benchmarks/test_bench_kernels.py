"""Kernel micro-benchmarks: attention TFLOP/s, add+LayerNorm GB/s, bias+GELU GB/s, and the MLP
GEMMs (fc1 + bias + GELU, fc2 + bias + residual) TFLOP/s by both paths (cuBLAS + standalone
kernels, Triton GEMM with the epilogue).

    VITFAST_TEST_DEVICE=cuda pytest benchmarks/test_bench_kernels.py --benchmark-only

On a GPU each kernel is checked against PyTorch, then timed by `gpu_kernels.median_ms`
(CUDA events, median, inputs rotated) for the TFLOP/s or GB/s in
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
from vitfast.kernels import linear_epilogue as le  # noqa: E402

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
    """pytest-benchmark over rotating inputs; on a GPU also gpu_kernels.median_ms -> the rate in `unit`
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
        benchmark.extra_info |= {"median_ms": ms, unit: work / ms / PER_MS[unit]}
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


def mlp_weights(K: int, N: int):
    w = (torch.randn(N, K, device=DEVICE) * K**-0.5).to(DTYPE)  # nn.Linear layout [out, in]
    return w, torch.randn(N, device=DEVICE, dtype=DTYPE)


@pytest.mark.parametrize("path", ["cublas", "epilogue"])
def test_fc1_bias_gelu(benchmark, path):
    """h [ROWS, C] -> gelu(h W1^T + b1) [ROWS, 4C]: cuBLAS GEMM + bias_gelu kernel, or one Triton GEMM."""
    w, b = mlp_weights(C, 4 * C)
    inputs = [(torch.randn(ROWS, C, device=DEVICE, dtype=DTYPE),) for _ in range(3)]
    fn = {
        "cublas": lambda h: bg.bias_gelu(torch.nn.functional.linear(h, w), b, "none"),
        "epilogue": lambda h: le.linear_bias_gelu(h, w, b, "none"),
    }[path]
    h = inputs[0][0]
    assert rel_err(fn(h), le.linear_epilogue_reference(h.float(), w.float(), b.float(), "none")) < TOL
    measure(benchmark, fn, inputs, 2 * ROWS * C * 4 * C, "TFLOPs")


@pytest.mark.parametrize("path", ["cublas", "epilogue"])
def test_fc2_bias_residual(benchmark, path):
    """m [ROWS, 4C], x [ROWS, C] -> x + (m W2^T + b2): cuBLAS GEMM + add, or one Triton GEMM."""
    w, b = mlp_weights(4 * C, C)
    inputs = [(torch.randn(ROWS, 4 * C, device=DEVICE, dtype=DTYPE), torch.randn(ROWS, C, device=DEVICE, dtype=DTYPE)) for _ in range(3)]
    fn = {
        "cublas": lambda m, x: x + torch.nn.functional.linear(m, w, b),
        "epilogue": lambda m, x: le.linear_bias_residual(m, w, b, x, None),
    }[path]
    m, x = inputs[0]
    assert rel_err(fn(m, x), le.linear_epilogue_reference(m.float(), w.float(), b.float(), residual=x.float())) < TOL
    measure(benchmark, fn, inputs, 2 * ROWS * C * 4 * C, "TFLOPs")


def test_write_dispatch_merges_measured_winners(tmp_path, monkeypatch):
    """gpu_kernels.write_dispatch (gpu_proof.py --part kernels): epilogue only where >= min_speedup faster and within the
    2x rule; other GPUs' entries kept, this GPU's same shapes replaced; fused reads the result."""
    import functools
    import json

    import gpu_kernels

    from vitfast import fused

    table = tmp_path / "mlp_dispatch.json"
    old = dict(compute_capability="9.0", gpu="H100", dtype="float16", C=768, hidden=3072, m_bucket=65536, fc1="cublas", fc2="cublas")
    other_gpu = dict(old, compute_capability="8.0", gpu="A100", fc1="epilogue")
    table.write_text(json.dumps({"about": "test", "min_speedup": 1.03, "entries": [old, other_gpu]}))
    common = dict(dtype="float16", C=768, hidden=3072, m_bucket=65536)
    rows = [
        dict(op="fc1+bias+gelu", **common, speedup=1.2, passes_2x_rule=True),
        dict(op="fc2+bias+residual", **common, speedup=1.02, passes_2x_rule=True),  # within noise: cuBLAS
        dict(op="fc1+bias+gelu", **(common | {"m_bucket": 256}), speedup=1.5, passes_2x_rule=False),  # wrong: cuBLAS
        dict(op="fc2+bias+residual", **(common | {"m_bucket": 256}), speedup=0.8, passes_2x_rule=True),
    ]
    env = dict(compute_capability="9.0", gpu="H100", git_sha="abc", command="gpu_proof.py --part kernels")
    gpu_kernels.write_dispatch(rows, env, table)
    entries = json.loads(table.read_text())["entries"]
    assert other_gpu in entries and old not in entries and len(entries) == 3
    got = {(e["compute_capability"], e["m_bucket"]): (e["fc1"], e["fc2"]) for e in entries}
    assert got == {("8.0", 65536): ("epilogue", "cublas"), ("9.0", 65536): ("epilogue", "cublas"), ("9.0", 256): ("cublas", "cublas")}
    monkeypatch.setattr(fused, "mlp_dispatch_table", functools.cache(lambda: tuple(entries)))  # (write_dispatch clears its cache)
    monkeypatch.setattr(fused, "_capability", lambda device: "9.0")
    assert fused.choose_mlp_paths("auto", torch.device("cuda"), torch.float16, 768, 3072, 256 * 197) == ("epilogue", "cublas")
    # the pointer kernel's timing decides fc1 for traces where eager timed the TMA kernel (Hopper)
    assert [e["fc1_traced"] for e in entries if e["compute_capability"] == "9.0"] == ["cublas", "epilogue"]  # no TMA rows: as fc1
    rows[0] |= dict(epilogue_kernel="tma", pointer_speedup=0.9, pointer_passes_2x_rule=True)
    entries = [e for e in gpu_kernels.write_dispatch(rows, env, table) if e["m_bucket"] == 65536]
    assert (entries[0]["fc1"], entries[0]["fc1_traced"], entries[0]["fc2_traced"]) == ("epilogue", "cublas", "cublas")
    monkeypatch.setattr(fused, "mlp_dispatch_table", functools.cache(lambda: tuple(entries)))
    assert fused.choose_mlp_paths("auto", torch.device("cuda"), torch.float16, 768, 3072, 256 * 197, traced=True) == ("cublas", "cublas")
    assert fused.choose_mlp_paths("auto", torch.device("cuda"), torch.float16, 768, 3072, 256 * 197) == ("epilogue", "cublas")

    # fc1's third path, cuBLAS without bias + the bias+GELU kernel (a variant of the fc1 row): where it
    # qualifies it wins if faster than the epilogue, in traces too; failing the 2x rule it never does
    def fc1(epilogue, bias_gelu, passes=True, pointer=0.9):
        row = dict(rows[0], speedup=epilogue, pointer_speedup=pointer, bias_gelu_speedup=bias_gelu, bias_gelu_passes_2x_rule=passes)
        entry = next(e for e in gpu_kernels.write_dispatch([row, rows[1]], env, table) if e["m_bucket"] == 65536)
        return entry["fc1"], entry["fc1_traced"], entry["fc1_bias_gelu_speedup"]

    assert fc1(1.2, 1.3) == ("bias_gelu", "bias_gelu", 1.3)
    assert fc1(1.2, 1.1) == ("epilogue", "bias_gelu", 1.1)  # a trace's pointer kernel (0.9x) loses to bias_gelu
    assert fc1(1.0, 1.02) == ("cublas", "cublas", 1.02)  # within noise
    assert fc1(0.8, 1.5, passes=False) == ("cublas", "cublas", 1.5)
    fc2_row = dict(rows[1], bias_gelu_speedup=2.0, bias_gelu_passes_2x_rule=True)  # fc2 has no such path
    assert {e["fc2"] for e in gpu_kernels.write_dispatch([rows[0], fc2_row], env, table)} == {"cublas"}
