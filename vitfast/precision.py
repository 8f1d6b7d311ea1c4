"""One definition of "precision": the names, which part of vitfast runs which, torch dtypes, parity limits.

    fp32  float32 everywhere (the reference)
    fp16  float16 weights and activations (LayerNorm statistics and softmax sums in fp32)
    bf16  bfloat16, PyTorch backends only (no bf16 ONNX export)
    int8  Q/DQ int8 matmuls (ONNX from `quantize_int8`, TensorRT from that ONNX)
    fp8   Q/DQ fp8 matmuls: another tool's ONNX (ONNX Runtime runs it), TensorRT engines from it on GPUs of
          compute capability >= 8.9
    int4  4-bit (or narrower) weights: ONNX from other tools only (ONNX Runtime's MatMulNBits / MatMulBnb4, the
          Hub's `model_q4.onnx` / `model_q4f16.onnx` / `model_bnb4.onnx`, int4 Q/DQ), read from the graph

Precisions stay plain strings, so sidecars, JSON and CSV rows keep the names above.
"""

from __future__ import annotations

import torch

from .errors import ArtifactError

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8", "int4")  # every precision an artifact or sidecar may record

# What each part of vitfast accepts, in the order help texts list them.
TORCH = ("fp32", "fp16", "bf16")  # TorchEngine and bench's eager/compile/vitfast backends
ONNX = ("fp32", "fp16")  # to_onnx; int8 ONNX comes from quantize_int8
EXPORT = ("fp32", "fp16", "int8", "fp8")  # `vitfast export --precision` (onnx, trt, triton-repo; fp8: --onnx of a Q/DQ graph)
TENSORRT = ("fp32", "fp16", "int8", "fp8")  # build_engine (fp8: a Q/DQ fp8 ONNX from another tool)
BENCH = ("fp32", "fp16", "bf16", "int8")  # `vitfast bench --precision`
QUANTIZED = ("int8", "fp8")  # need a Q/DQ graph

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# Limits on the relative max error (max |out - ref| / max |ref|) and the worst per-image cosine. int4's are a
# judgement a step looser than int8's (4-bit weights are 16x coarser than 8-bit ones). Measured against fp32, weights
# only in 4 bits (MatMulNBits block 32 with fp32 or fp16 activations, int4 Q/DQ block 32, MatMulBnb4 NF4 block 64):
# cosine 0.992-0.996 and max_rel_err 0.057-0.084 on 397 held-out images for a 4-block ViT trained on scikit-learn's
# digits; 0.984-0.992 and 0.12-0.15 for the tests' random-weight transformers ViT.
TOLERANCES = {
    "fp32": {"max_rel_err": 1e-4, "cosine": 0.99999},
    "fp16": {"max_rel_err": 2e-2, "cosine": 0.999},
    "bf16": {"max_rel_err": 5e-2, "cosine": 0.995},
    "int8": {"max_rel_err": 0.25, "cosine": 0.97},
    "fp8": {"max_rel_err": 0.25, "cosine": 0.97},
    "int4": {"max_rel_err": 0.3, "cosine": 0.95},
}


def require(precision: str, allowed: tuple[str, ...], what: str, hint: str = "") -> str:
    """`precision` if `what` (e.g. "TensorRT") runs it, else `ArtifactError` naming the ones it runs."""
    if precision not in allowed:
        raise ArtifactError(f"{what} precision must be one of {', '.join(allowed)}{hint}, got {precision!r}")
    return precision


def from_dtype(dtype: torch.dtype) -> str:
    """The precision a PyTorch model in `dtype` runs at."""
    for precision, torch_dtype in TORCH_DTYPES.items():
        if torch_dtype == dtype:
            return precision
    raise ArtifactError(f"no vitfast precision runs in {dtype}; use torch.float32, float16 or bfloat16")
