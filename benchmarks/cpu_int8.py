"""CPU comparison for issue #4: ViT-S/16 at batch 8, PyTorch eager fp32 vs ONNX Runtime fp32 vs
ONNX Runtime int8 (the TensorRT-style symmetric QDQ graph, and the CPU form with uint8 activations).

    python benchmarks/cpu_int8.py --out benchmarks/results/cpu-int8-<sha>.json

Random weights and random calibration images: the speed does not depend on the values, and the
accuracy of int8 is measured elsewhere (tests/test_export_real_data.py). perf_counter_ns around
each call, after warm-up, inputs rotated among 4 buffers, median of `--repeats` runs; each backend
is timed twice so the spread between the two medians shows the noise.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import vitfast
from vitfast.bench.measure import git_state
from vitfast.export import quantize_int8, to_onnx
from vitfast.info import collect


def median_ms(fn, inputs: list[torch.Tensor], repeats: int) -> float:
    for x in inputs[:2]:
        fn(x)  # warm-up: allocator, ORT arena, oneDNN primitives
    times = []
    for i in range(repeats):
        start = time.perf_counter_ns()
        fn(inputs[i % len(inputs)])
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = vitfast.create_model(args.model)
    inputs = [torch.randn(args.batch, 3, *model.config.img_hw) for _ in range(4)]
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = to_onnx(model, Path(tmp) / "fp32.onnx", batch=(1, args.batch, 64))
        calib = torch.randn(64, 3, *model.config.img_hw)
        int8 = {t: quantize_int8(fp32, Path(tmp) / f"int8-{t}.onnx", calib, samples=64, target=t, progress=False) for t in ("tensorrt", "cpu")}
        backends = {"pytorch eager fp32": vitfast.runtime.TorchEngine(model, device="cpu"),
                    "onnxruntime fp32": vitfast.runtime.OnnxEngine(fp32, threads=args.threads),
                    "onnxruntime int8 (TensorRT-style QDQ)": vitfast.runtime.OnnxEngine(int8["tensorrt"], threads=args.threads),
                    "onnxruntime int8 (CPU form, uint8 activations)": vitfast.runtime.OnnxEngine(int8["cpu"], threads=args.threads)}  # fmt: skip
        rows = []
        for name, engine in backends.items():
            first, second = (median_ms(engine, inputs, args.repeats) for _ in range(2))
            ms = min(first, second)
            rows.append({"backend": name, "median_ms": ms, "images_per_s": args.batch / ms * 1e3,
                         "repeat_spread": abs(first - second) / ms})  # fmt: skip
            print(f"{name:<48} {ms:8.1f} ms  {args.batch / ms * 1e3:7.1f} img/s  (spread {rows[-1]['repeat_spread']:.1%})", flush=True)
    base = rows[1]["median_ms"]
    for row in rows:
        row["speedup_vs_ort_fp32"] = base / row["median_ms"]
    env = collect() | {"cpu": platform.processor() or platform.machine(), "threads": args.threads, "git_sha": git_state()["sha"],
                       "command": " ".join([Path(sys.executable).name] + sys.argv)}  # fmt: skip
    Path(args.out).write_text(json.dumps({"model": args.model, "batch": args.batch, "rows": rows, "environment": env}, indent=1))


if __name__ == "__main__":
    main()
