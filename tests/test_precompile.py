"""kernels/precompile.py: the launches of an optimized ViT forward are recorded (not run), then
every kernel x config its autotuners would try is compiled in a thread pool through Triton's own
warm-up path, so that the real launches find them compiled.

Runs in a subprocess without TRITON_INTERPRET (the interpreter replaces the compiler) and with
Triton's driver answering as an H100 (sm_90a): the same compiles a GPU would make, nothing
launched. The check that matters: afterwards, each launch's warm-up with its real tensors for each
config (what the autotuner's first benchmark of it binds) compiles nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install 'vitfast[triton]')")

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from unittest import mock

    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    fake = mock.MagicMock()  # an H100 as far as the compiler asks: device 0, sm_90a
    fake.get_current_device.return_value = 0
    fake.get_current_stream.return_value = 0
    fake.get_current_target.return_value = GPUTarget("cuda", 90, 32)
    driver.set_active(fake)

    import vitfast
    from vitfast.kernels import aot, precompile

    aimv2 = sys.argv[1] == "aimv2"  # RMSNorm, linears without bias, gate and value GEMMs apart
    fields = dict(class_token=False, global_pool="avg", fc_norm=False, qkv_bias=False, proj_bias=False, norm_layer="rmsnorm",
                  embed_norm=True, mlp_layer="swiglu", act_layer="silu", mlp_ratio=2.75, num_classes=0) if aimv2 else {}  # fmt: skip
    cfg = vitfast.ViTConfig(**dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=5) | fields)
    model = vitfast.create_model(cfg).half().eval()
    with mock.patch("vitfast.optimize._check_backend"):  # CPU tensors; recording(cpu=True) routes them to the launchers
        vitfast.optimize(model, mlp="epilogue" if aimv2 else sys.argv[1])
    x = torch.randn(3, 3, 32, 32).half()

    def forward():
        with torch.no_grad():
            model(x)

    with precompile.recording(cpu=True) as launches:
        forward()
    budget = aot.TARGETS["sm_90a"]
    stats = precompile.compile_recorded(launches, budget, threads=2)
    with mock.patch.object(precompile, "_standin", lambda v: v), precompile.recording(cpu=True) as real:
        forward()  # the same launches with their real tensors, as a GPU launch binds them
    assert all(isinstance(a, precompile.Pointer) for launch in launches for a in launch.args if hasattr(a, "data_ptr"))

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again")

    again = 0
    for launch in real:
        launch.jit.device_caches[0][0]  # the binder for device 0 exists; its compile is now refused
        launch.jit.compile = no_compile
        for config in launch.configs(budget):
            launch.jit.warmup(*launch.args, grid=(1,), **launch.launch_kwargs, **config.all_kwargs())
            again += 1
    kernels = sorted({launch.jit.__name__ for launch in real})
    print(json.dumps(stats | {"rechecked": again, "kernels": kernels}))
    """
)


def run(mlp: str, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path / "triton-cache"), "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, mlp], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mlp, kernels, launches", [
    ("epilogue", ["_attention_fwd_kernel", "_linear_epilogue_kernel", "_linear_residual_layernorm_kernel", "_add_layernorm_kernel"], 2 * 4 + 1 - 1),
    ("cublas", ["_attention_fwd_kernel", "_add_layernorm_kernel"], 2 * 3 - 1 + 1 - 1),
    ("aimv2", ["_attention_fwd_kernel", "_bias_swiglu_kernel", "_add_layernorm_kernel", "_linear_residual_layernorm_kernel",
               "_linear_epilogue_kernel"], 2 * 4 + 1),
])  # fmt: skip
def test_a_forward_is_compiled_ahead_for_every_config(tmp_path, mlp, kernels, launches):
    """Per block: attention + proj + fc1 + fc2 (epilogue), or attention + add+LN + add+LN (cublas: fc1
    with its bias, then PyTorch's GELU; the last block ends with a plain residual add instead); plus the first block's
    LayerNorm; less the last block's attention, whose one class-token query runs on SDPA (optimize's head_only).
    "aimv2" (epilogue path, average pooling: every token): the same in RMSNorm form and without biases, the SwiGLU
    kernel in fc1's place. Every config compiles once; none compiles again."""
    stats = run(mlp, tmp_path)
    assert stats["launches"] == launches and sorted(stats["kernels"]) == sorted(kernels)
    assert 0 < stats["compiled"] <= stats["jobs"] <= stats["rechecked"]  # repeated blocks share their kernels
    assert (tmp_path / "triton-cache").is_dir() and any((tmp_path / "triton-cache").iterdir())  # also on disk


def test_without_launches_nothing_compiles():
    from vitfast.kernels import precompile

    assert precompile.precompile(lambda: None) == {"launches": 0, "compiled": 0}
