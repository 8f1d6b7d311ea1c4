"""End-to-end pytest-benchmark suite: one forward pass per backend, built the way `vitfast bench` builds it.

    pytest benchmarks/ --benchmark-only                            # CPU: a tiny ViT, fp32
    VITFAST_TEST_DEVICE=cuda pytest benchmarks/ --benchmark-only   # GPU: ViT-B/16, fp16, batch 64

`make test` runs it once with --benchmark-disable, so a broken backend shows up there. Backends
this machine cannot run are skipped with `vitfast.bench`'s reason. TensorRT engines come from
VITFAST_BENCH_ENGINES (comma-separated paths built with `vitfast export --format trt`).
"""

from __future__ import annotations

import os

# As tests/conftest.py: kernels run under Triton's CPU interpreter unless GPU runs are asked for.
# It lives here, not in a benchmarks/conftest.py, because a second top-level `conftest` module
# would shadow tests/conftest.py (whose helpers the tests import) in `pytest tests benchmarks`.
if os.environ.get("VITFAST_TEST_DEVICE", "cpu") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from vitfast import ViTConfig, get_config
from vitfast.bench.backends import BackendOptions, build_runner, detect_platform, prepare, skip_reason
from vitfast.bench.measure import random_inputs

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1"
if ON_GPU:
    CONFIG, PRECISION, BATCH = get_config("vit_base_patch16_224"), "fp16", 64
else:  # small enough that the whole suite runs in seconds, odd enough to catch shape bugs
    CONFIG, PRECISION, BATCH = ViTConfig(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=7, name="tiny"), "fp32", 3
CASES = [(b, PRECISION) for b in ("eager", "eager-math", "compile", "vitfast", "vitfast-graphs", "onnxruntime", "tensorrt")]
CASES.append(("onnxruntime", "int8"))


@pytest.fixture(scope="module")
def options(tmp_path_factory) -> BackendOptions:
    engines = [p for p in os.environ.get("VITFAST_BENCH_ENGINES", "").split(",") if p]
    return BackendOptions(work_dir=tmp_path_factory.mktemp("bench-artifacts"), engines=engines, calib_samples=4)


@pytest.mark.parametrize("backend,precision", CASES, ids=[f"{b}-{p}" for b, p in CASES])
def test_forward(benchmark, backend, precision, options):
    platform = detect_platform([backend])
    reason = skip_reason(backend, precision, platform, options, CONFIG)
    if reason:
        pytest.skip(reason)
    artifact, _ = prepare(backend, precision, CONFIG, options)
    runner = build_runner(backend, precision, CONFIG, platform, options, artifact)
    inputs = random_inputs(BATCH, CONFIG, runner.input_dtype, runner.device, 4)
    if runner.prepare:  # an engine's input checks and casts, once per buffer, as `vitfast bench` keeps them out of the timings
        inputs = [runner.prepare(x) for x in inputs]
    runner.call(inputs[0])  # compilation, autotuning, graph capture: outside the timings
    state = {"i": 0}

    def step():
        state["i"] += 1
        out = runner.call(inputs[state["i"] % len(inputs)])
        if runner.device.type == "cuda":  # time finished work, not queued launches
            torch.cuda.synchronize()
        return out

    logits = benchmark(step)
    assert logits.shape == (BATCH, CONFIG.num_classes)
    assert torch.isfinite(logits.float()).all()
    benchmark.extra_info |= {"model": CONFIG.name, "batch": BATCH, "precision": precision, "runs_on": runner.runs_on}
    if benchmark.stats:  # None under --benchmark-disable
        benchmark.extra_info["images_per_s"] = BATCH / benchmark.stats.stats.median
