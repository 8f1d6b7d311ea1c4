"""Host time of one forward, the part of batch-1 latency a fast GPU cannot hide, measured on the CPU.

    python benchmarks/host_overhead.py [--model vit_base_patch16_224] [--repeats 200]

The model keeps its depth and structure but shrinks to a width of 64 and 2 tokens on the CPU, so
arithmetic is a few microseconds per op, and every Triton launch is a no-op: what is timed is the
Python and dispatcher work per forward (PyTorch's CPU ops stand in for its CUDA launches): the reference model in
eager mode (PyTorch's own kernels: SDPA, LayerNorm, GELU, Linear) and `vitfast.optimize` on each
MLP path, with its ops called through the torch op dispatcher (as before this script existed)
and straight (`vitfast.fused.kernel_ops`, the eager default). On a GPU, batch-1 latency is at
least this host time; the H100 run of 2026-11-26 measured optimize() at batch 1 slower than eager
(ViT-B/16 fp16: 6.2 ms vs 2.8 ms), which this script traced to host time. Medians of `--repeats`
forwards after 10 untimed ones; one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from unittest import mock

os.environ.pop("TRITON_INTERPRET", None)  # the compiled launch path, whose run() is then stubbed out

import torch
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

import vitfast
from vitfast.kernels import precompile


@contextlib.contextmanager
def launches_stubbed():
    """Triton launches do nothing and the launchers take CPU tensors (as they take CUDA ones)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch("vitfast.optimize._check_backend", lambda *a: None))
        stack.enter_context(mock.patch.object(JITFunction, "run", lambda *a, **k: None))
        stack.enter_context(mock.patch.object(Autotuner, "run", lambda *a, **k: None))
        for module in precompile.KERNEL_MODULES:
            stack.enter_context(mock.patch.object(module, "runs_reference", lambda t: False))
            stack.enter_context(mock.patch.object(module, "check_device", lambda *t: None))
        yield


def median_ms(model, x, repeats: int) -> float:
    times = []
    with torch.no_grad():
        for i in range(10 + repeats):
            start = time.perf_counter()
            model(x)
            if i >= 10:
                times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    # the stubbed launches leave their outputs uninitialised: denormals there would slow the CPU GEMMs that read them
    # (3x per call on this VM), which a GPU does not
    torch.set_flush_denormal(True)
    cfg = vitfast.get_config(args.model)
    cfg = vitfast.get_config(args.model, embed_dim=64, num_heads=1, img_size=cfg.patch_size)
    x = torch.randn(1, cfg.in_chans, *cfg.img_hw)
    model = vitfast.create_model(cfg).eval()
    rows = [("eager (reference model, PyTorch kernels)", median_ms(model, x, args.repeats))]
    with launches_stubbed():
        for mlp in ("auto", "epilogue"):
            fused = vitfast.optimize(vitfast.create_model(cfg).eval(), mlp=mlp)
            with mock.patch("vitfast.fused.kernel_ops", lambda x: torch.ops.vitfast):
                rows.append((f"optimize(mlp={mlp}), ops through the dispatcher", median_ms(fused, x, args.repeats)))
            rows.append((f"optimize(mlp={mlp}), ops called straight", median_ms(fused, x, args.repeats)))
    print(f"{args.model} (depth {cfg.depth}, width 64, 2 tokens) batch 1, host ms per forward (CPU, launches stubbed; torch {torch.__version__}):")
    for label, ms in rows:
        print(f"  {label:<52} {ms:7.2f}")


if __name__ == "__main__":
    main()
