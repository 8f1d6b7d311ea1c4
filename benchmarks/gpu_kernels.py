"""GPU measurements for issue #3, in one run: ceilings, kernel parity, kernel speed, end to end.

    python3 benchmarks/gpu_kernels.py --out benchmarks/results/kernels-<gpu>-<sha>.json [--write-dispatch]

1. Ceilings: device-to-device copy bandwidth (bytes read + written) and fp16/bf16 matmul TFLOP/s.
2. Parity: each kernel in fp16/bf16 against an fp32 reference, next to PyTorch's own error at the
   same precision (the 2x rule), and the optimized ViT-B/16 (mlp auto and epilogue) against the fp32 model.
3. Attention TFLOP/s at N=197/577, D=64, B*H=256*12 vs SDPA (flash) fed from the same packed
   qkv (its permute is a view; the output transpose back to [B, N, H*D] is a copy, timed with it).
4. add+LayerNorm GB/s at D=768/1024 vs PyTorch (x + y, then F.layer_norm), as % of copy bandwidth.
5. MLP GEMMs, fp16/bf16, ViT-S/B/L widths (C -> 4C), M = batch * 197 for batch 1, 8, 64, 256:
   fc1 + bias + GELU as cuBLAS `F.linear` (no bias) + the standalone bias_gelu kernel vs the
   Triton GEMM with the epilogue; fc2 + bias + residual as cuBLAS `F.linear` (bias) + `x + y`
   vs the Triton GEMM with the epilogue. TFLOP/s, which is faster, parity of both vs fp32.
   `--write-dispatch` merges the winners into kernels/mlp_dispatch.json, which
   `optimize(model, mlp="auto")` reads (epilogue only where it was >= min_speedup faster and
   passed the 2x rule; entries of other GPUs and shapes are kept).
6. ViT-B/16 fp16 images/s at batch 1, 64, 256: eager (SDPA), torch.compile(max-autotune),
   optimize(), optimize(cuda_graphs=True), optimize(mlp="epilogue").
Timings: triton.testing.do_bench (CUDA events, warm-up, median), inputs rotated among buffers.
`--sections` runs a subset (e.g. `--sections mlp` to refresh the dispatch table alone).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import vitfast
from vitfast.kernels import add_layernorm as aln
from vitfast.kernels import attention as att
from vitfast import fused
from vitfast.kernels import bias_gelu as bg
from vitfast.kernels import linear_epilogue as le

DISPATCH_TABLE = Path(__file__).resolve().parents[1] / "kernels" / "mlp_dispatch.json"
MLP_SHAPES = {"vit_small": (384, 1536), "vit_base": (768, 3072), "vit_large": (1024, 4096)}  # C -> hidden
MLP_BATCHES = (1, 8, 64, 256)  # x 197 tokens (224 px, patch 16, class token)
SECTIONS = ("ceilings", "parity", "attention", "add_layernorm", "mlp", "end_to_end")


def median_ms(fn, inputs: list, warmup=100, rep=500) -> float:
    """Median time of fn(*inputs[i]) with i rotating, so repeated runs do not measure the cache."""
    state = {"i": 0}

    def step():
        state["i"] = (state["i"] + 1) % len(inputs)
        fn(*inputs[state["i"]])

    return do_bench(step, warmup=warmup, rep=rep, return_mode="median")


def environment() -> dict:
    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception as exc:  # a missing tool is recorded, not fatal
            return f"unavailable: {exc}"

    props = torch.cuda.get_device_properties(0)
    return {
        "command": " ".join(sys.argv),
        "git_sha": run(["git", "rev-parse", "HEAD"]),
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "driver": run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vitfast": vitfast.__version__,
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def ceilings() -> dict:
    n = 1 << 28  # 512 MiB of fp16: far beyond L2
    bufs = [(torch.randn(n, device="cuda", dtype=torch.float16), torch.empty(n, device="cuda", dtype=torch.float16)) for _ in range(2)]
    copy_ms = median_ms(lambda a, b: b.copy_(a), bufs)
    out = {"copy_GBps": 2 * n * 2 / copy_ms / 1e6}
    for dtype in (torch.float16, torch.bfloat16):
        m = 8192
        mats = [(torch.randn(m, m, device="cuda", dtype=dtype), torch.randn(m, m, device="cuda", dtype=dtype)) for _ in range(2)]
        ms = median_ms(torch.mm, mats, warmup=50, rep=300)
        out[f"matmul_{str(dtype)[6:]}_TFLOPs"] = 2 * m**3 / ms / 1e9
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def parity() -> list[dict]:
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        qkv = torch.randn(8, 197, 3, 12, 64, device="cuda")
        lo = qkv.to(dtype)
        exact = att.attention_reference(lo.float())
        rows.append(dict(op="attention", dtype=str(dtype), kernel=rel_err(att.fused_attention(lo, 0.125), exact),
                         torch=rel_err(att.attention_reference(lo), exact)))  # fmt: skip
        x, y = torch.randn(2, 2, 197, 768, device="cuda", dtype=dtype)
        w, b = torch.randn(768, device="cuda", dtype=dtype), torch.randn(768, device="cuda", dtype=dtype)
        exact = aln.add_layernorm_reference(x.float(), y.float(), w.float(), b.float(), 1e-6)[1]
        rows.append(dict(op="add_layernorm", dtype=str(dtype), kernel=rel_err(aln.add_layernorm(x, y, w, b, 1e-6)[1], exact),
                         torch=rel_err(aln.add_layernorm_reference(x, y, w, b, 1e-6)[1], exact)))  # fmt: skip
        h = 3 * torch.randn(2 * 197, 3072, device="cuda", dtype=dtype)
        exact = bg.bias_gelu_reference(h.float(), b.float().repeat(4), "none")
        rows.append(dict(op="bias_gelu", dtype=str(dtype), kernel=rel_err(bg.bias_gelu(h, b.repeat(4), "none"), exact),
                         torch=rel_err(bg.bias_gelu_reference(h, b.repeat(4), "none"), exact)))  # fmt: skip
        model = vitfast.create_model("vit_base_patch16_224").cuda()
        images = torch.randn(16, 3, 224, 224, device="cuda")
        with torch.no_grad():
            exact = model(images)
            model.to(dtype)
            eager = model(images.to(dtype))
            fused = vitfast.optimize(model)(images.to(dtype))
            fused_epilogue = vitfast.optimize(model, mlp="epilogue")(images.to(dtype))
        rows.append(dict(op="vit_base_patch16_224 logits", dtype=str(dtype), kernel=rel_err(fused, exact), torch=rel_err(eager, exact)))
        rows.append(dict(op="vit_base_patch16_224 logits, mlp=epilogue", dtype=str(dtype), kernel=rel_err(fused_epilogue, exact),
                         torch=rel_err(eager, exact)))  # fmt: skip
    for r in rows:
        r["passes_2x_rule"] = r["kernel"] <= 2 * r["torch"] + 1e-3
    return rows


def attention_speed() -> list[dict]:
    rows = []
    B, H, D = 256, 12, 64
    for N in (197, 577):
        flops = 4 * B * H * N * N * D
        qkvs = [(torch.randn(B, N, 3, H, D, device="cuda", dtype=torch.float16),) for _ in range(3)]

        def sdpa(qkv):
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # views, last stride 1
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(q, k, v)
            return o.transpose(1, 2).reshape(B, N, H * D)  # the copy back to token-major layout

        ours = median_ms(lambda qkv: att.fused_attention(qkv, D**-0.5), qkvs)
        ref = median_ms(sdpa, qkvs)
        rows.append(dict(N=N, D=D, BH=B * H, vitfast_ms=ours, sdpa_ms=ref, vitfast_TFLOPs=flops / ours / 1e9,
                         sdpa_TFLOPs=flops / ref / 1e9, speedup=ref / ours, sdpa_copies="1 (output transpose+reshape)"))  # fmt: skip
    return rows


def layernorm_speed(copy_GBps: float) -> list[dict]:
    rows = []
    M = 256 * 197
    for C in (768, 1024):
        sets = [tuple(torch.randn(M, C, device="cuda", dtype=torch.float16) for _ in range(2)) for _ in range(3)]
        w, b = torch.randn(C, device="cuda", dtype=torch.float16), torch.randn(C, device="cuda", dtype=torch.float16)
        nbytes = 4 * M * C * 2  # read x, y; write x + y, LN(x + y)
        ours = median_ms(lambda x, y: aln.add_layernorm(x, y, w, b, 1e-6), sets)
        ref = median_ms(lambda x, y: F.layer_norm(x + y, (C,), w, b, 1e-6), sets)
        gbps = nbytes / ours / 1e6
        rows.append(dict(C=C, rows=M, vitfast_ms=ours, torch_ms=ref, vitfast_GBps=gbps, torch_GBps=nbytes / ref / 1e6,
                         fraction_of_copy=gbps / copy_GBps))  # fmt: skip
    return rows


def mlp_gemms() -> list[dict]:
    """fc1 + bias + GELU and fc2 + bias + residual: cuBLAS + standalone kernels vs the Triton epilogue GEMM."""
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for model, (C, hidden) in MLP_SHAPES.items():
            w1 = (torch.randn(hidden, C, device="cuda") * C**-0.5).to(dtype)  # nn.Linear layout [out, in]
            w2 = (torch.randn(C, hidden, device="cuda") * hidden**-0.5).to(dtype)
            b1, b2 = torch.randn(hidden, device="cuda", dtype=dtype), torch.randn(C, device="cuda", dtype=dtype)
            for batch in MLP_BATCHES:
                M = batch * 197
                flops = 2 * M * C * hidden
                common = dict(model=model, dtype=str(dtype).removeprefix("torch."), C=C, hidden=hidden, batch=batch, M=M,
                              m_bucket=fused.m_bucket(M))  # fmt: skip
                # fc1: h [M, C] -> gelu(h W1^T + b1) [M, hidden]
                hs = [(torch.randn(M, C, device="cuda", dtype=dtype),) for _ in range(3)]
                cublas = lambda h: bg.bias_gelu(F.linear(h, w1), b1, "none")  # noqa: E731
                epilogue = lambda h: le.linear_bias_gelu(h, w1, b1, "none")  # noqa: E731
                plain = lambda h: le.linear_epilogue_reference(h, w1, b1, "none")  # noqa: E731
                exact = le.linear_epilogue_reference(hs[0][0].float(), w1.float(), b1.float(), "none")
                rows.append(mlp_row("fc1+bias+gelu", common, flops, cublas, epilogue, plain, hs, exact))
                # fc2: m [M, hidden], x [M, C] -> x + (m W2^T + b2) [M, C]
                ms = [(torch.randn(M, hidden, device="cuda", dtype=dtype), torch.randn(M, C, device="cuda", dtype=dtype)) for _ in range(3)]
                cublas = lambda m, x: x + F.linear(m, w2, b2)  # noqa: E731  (also plain PyTorch)
                epilogue = lambda m, x: le.linear_bias_residual(m, w2, b2, x, None)  # noqa: E731
                m0, x0 = ms[0]
                exact = le.linear_epilogue_reference(m0.float(), w2.float(), b2.float(), residual=x0.float())
                rows.append(mlp_row("fc2+bias+residual", common, flops, cublas, epilogue, cublas, ms, exact))
                del hs, ms, exact
                r1, r2 = rows[-2], rows[-1]
                print(f"  {model:<10} {common['dtype']:<9} batch {batch:>3}  fc1 {r1['cublas_TFLOPs']:6.1f} vs {r1['epilogue_TFLOPs']:6.1f} TFLOP/s"
                      f" -> {r1['faster']:<8}  fc2 {r2['cublas_TFLOPs']:6.1f} vs {r2['epilogue_TFLOPs']:6.1f} -> {r2['faster']}", flush=True)  # fmt: skip
    return rows


def mlp_row(op: str, common: dict, flops: int, cublas, epilogue, plain, inputs: list, exact: torch.Tensor) -> dict:
    """Both paths timed on the same rotating inputs; errors relative to the fp32 result, next to
    plain PyTorch's (F.linear, then F.gelu / the add, in the same dtype) for the 2x rule as in parity()."""
    cublas_ms, epilogue_ms = median_ms(cublas, inputs), median_ms(epilogue, inputs)
    torch_err = rel_err(plain(*inputs[0]), exact)
    cublas_err, epilogue_err = rel_err(cublas(*inputs[0]), exact), rel_err(epilogue(*inputs[0]), exact)
    return dict(op=op, **common, cublas_ms=cublas_ms, epilogue_ms=epilogue_ms,
                cublas_TFLOPs=flops / cublas_ms / 1e9, epilogue_TFLOPs=flops / epilogue_ms / 1e9,
                speedup=cublas_ms / epilogue_ms, faster="epilogue" if epilogue_ms < cublas_ms else "cublas",
                torch_rel_err=torch_err, cublas_rel_err=cublas_err, epilogue_rel_err=epilogue_err,
                passes_2x_rule=epilogue_err <= 2 * torch_err + 1e-3)  # fmt: skip


def write_dispatch(rows: list[dict], env: dict, path: Path = DISPATCH_TABLE) -> list[dict]:
    """Merge this run's winners into the dispatch table (atomically); returns the new entries."""
    table = json.loads(path.read_text())
    min_speedup = table["min_speedup"]

    def choice(row: dict) -> str:
        return "epilogue" if row["speedup"] >= min_speedup and row["passes_2x_rule"] else "cublas"

    by_shape: dict[tuple, dict] = {}
    for row in rows:
        key = (row["dtype"], row["C"], row["hidden"], row["m_bucket"])
        by_shape.setdefault(key, {})[row["op"].split("+")[0]] = row
    new = []
    for (dtype, C, hidden, bucket), ops in sorted(by_shape.items()):
        fc1, fc2 = ops["fc1"], ops["fc2"]
        new.append(dict(compute_capability=env["compute_capability"], gpu=env["gpu"], dtype=dtype, C=C, hidden=hidden,
                        m_bucket=bucket, fc1=choice(fc1), fc2=choice(fc2), fc1_speedup=round(fc1["speedup"], 3),
                        fc2_speedup=round(fc2["speedup"], 3), git_sha=env["git_sha"], command=env["command"]))  # fmt: skip
    replaced = {(e["compute_capability"], e["dtype"], e["C"], e["hidden"], e["m_bucket"]) for e in new}
    kept = [e for e in table["entries"] if (e["compute_capability"], e["dtype"], e["C"], e["hidden"], e["m_bucket"]) not in replaced]
    table["entries"] = sorted(kept + new, key=lambda e: (e["compute_capability"], e["dtype"], e["C"], e["m_bucket"]))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    os.replace(tmp, path)
    fused.mlp_dispatch_table.cache_clear()  # optimize(mlp="auto") in this process sees the new table
    return new


def end_to_end() -> list[dict]:
    rows = []
    for batch in (1, 64, 256):
        images = [(torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16),) for _ in range(3)]
        for backend in ("eager", "compile-max-autotune", "vitfast", "vitfast-graphs", "vitfast-mlp-epilogue"):
            model = vitfast.create_model("vit_base_patch16_224").cuda().half()
            if backend == "compile-max-autotune":
                model = torch.compile(model, mode="max-autotune")
            elif backend.startswith("vitfast"):
                mlp = "epilogue" if backend == "vitfast-mlp-epilogue" else "auto"
                vitfast.optimize(model, cuda_graphs=backend == "vitfast-graphs", mlp=mlp)
            with torch.no_grad():
                ms = median_ms(model, images, warmup=500, rep=2000)
                again = median_ms(model, images, warmup=100, rep=1000)  # the same backend twice: the noise
            rows.append(dict(model="vit_base_patch16_224", dtype="fp16", batch=batch, backend=backend, ms=ms,
                             images_per_s=batch / ms * 1e3, repeat_spread=abs(again - ms) / ms))  # fmt: skip
            print(f"  batch {batch:>3} {backend:<22} {ms:8.3f} ms  {batch / ms * 1e3:9.1f} img/s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for every number and the environment")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--write-dispatch", action="store_true", help="merge the MLP winners into kernels/mlp_dispatch.json")
    args = parser.parse_args()
    sections = args.sections.split(",")
    if unknown := set(sections) - set(SECTIONS):
        sys.exit(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    if args.write_dispatch and "mlp" not in sections:
        sys.exit("--write-dispatch needs the mlp section")
    if not torch.cuda.is_available():
        sys.exit("this script needs a CUDA GPU")
    result = {"environment": environment()}
    if "ceilings" in sections or "add_layernorm" in sections:
        result["ceilings"] = ceilings()
        print("ceilings", json.dumps(result["ceilings"]), flush=True)
    if "parity" in sections:
        result["parity"] = parity()
    if "attention" in sections:
        result["attention"] = attention_speed()
    if "add_layernorm" in sections:
        result["add_layernorm"] = layernorm_speed(result["ceilings"]["copy_GBps"])
    if "mlp" in sections:
        print("mlp (cuBLAS + standalone vs Triton epilogue GEMM)", flush=True)
        result["mlp"] = mlp_gemms()
        if args.write_dispatch:
            result["mlp_dispatch"] = write_dispatch(result["mlp"], result["environment"])
            print(f"wrote {len(result['mlp_dispatch'])} entries to {DISPATCH_TABLE}", flush=True)
    if "end_to_end" in sections:
        result["end_to_end"] = end_to_end()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for section in ("parity", "attention", "add_layernorm", "mlp", "mlp_dispatch"):
        if section in result:
            print(section)
            for row in result[section]:
                print("  " + json.dumps(row))


if __name__ == "__main__":
    main()
