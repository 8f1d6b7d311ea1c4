"""Ahead-of-time compile of every kernel for sm_80, sm_89 and sm_90a with the ptxas in the triton
wheel (no GPU needed): `python -m vitfast.kernels.aot`, run in a subprocess because the rest of
the suite runs under TRITON_INTERPRET=1, which replaces the compiler.

Fails on a compile error, on a kept config whose compiled shared memory exceeds the target's
limit or the prune's estimate, and on a launch in the supported range with no config that fits.
Results are cached per compiled-kernel hash in .aot-cache/ (git-ignored), so only changed
kernels recompile; the table (registers, spills, shared memory) is in .aot-cache/report.txt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install 'vitfast[triton]')")

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".aot-cache"
TARGETS = ("sm_80", "sm_89", "sm_90a")


@pytest.fixture(scope="module")
def report() -> dict:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip(f"this triton wheel ships no ptxas ({ptxas}); the check needs a Linux x86-64/aarch64 wheel")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's current default, stated (silences its warning)
    CACHE.mkdir(exist_ok=True)
    out = CACHE / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "vitfast.kernels.aot", "--arch", ",".join(TARGETS), "--json", str(out),
         "--cache", str(CACHE), "--jobs", str(min(os.cpu_count() or 1, 4))],
        env=env, capture_output=True, text=True, timeout=1800,  # cold: minutes of ptxas; warm: ~1 min
    )  # fmt: skip
    (CACHE / "report.txt").write_text(proc.stdout + proc.stderr)
    assert out.exists(), f"the AOT check wrote no report:\n{proc.stderr[-3000:]}"
    result = json.loads(out.read_text())
    result["returncode"], result["stderr"] = proc.returncode, proc.stderr
    return result


def test_every_kernel_compiles_within_shared_memory_for_every_target(report):
    assert report["problems"] == [], "\n".join(report["problems"])
    assert report["returncode"] == 0, report["stderr"][-3000:]


def test_every_kernel_dtype_and_target_was_compiled(report):
    seen = {(r["kernel"], r["launch"].split()[-1], r["target"]) for r in report["rows"] if "shared" in r}
    kernels = {r["kernel"] for r in report["rows"]}
    assert kernels == {"_attention_fwd_kernel", "_add_layernorm_kernel", "_bias_gelu_kernel", "_linear_epilogue_kernel",
                       "_linear_residual_layernorm_kernel"}
    missing = {(k, d, t) for k in kernels for d in ("fp16", "bf16", "fp32") for t in TARGETS} - seen
    assert not missing


@pytest.mark.parametrize("dtype", ["fp16"])  # bf16 and fp32 are sampled (see aot.LAUNCHES)
def test_every_autotune_config_that_fits_was_compiled_on_every_target(report, monkeypatch, dtype):
    """The tightest launches (attention at head_dim 128, the GEMMs) compile every config that
    the prune keeps for the target: the GPU config lists, pruned here independently of the tool."""
    import torch

    from vitfast.kernels import _common, aot
    from vitfast.kernels import attention as att
    from vitfast.kernels import linear_epilogue as le
    from vitfast.kernels import linear_layernorm as lln

    t = torch.empty(0, dtype=aot.DTYPES[dtype])
    for module, launch, args in ((att, f"attention B2 N256 H8 D128 {dtype}", {"QKV": t, "BLOCK_D": 128}),
                                 (le, f"linear fc1+gelu 1576x768->3072 {dtype}", {"X": t}),
                                 (lln, f"linear_layernorm proj 1576x768->768 {dtype}", {"X": t})):  # fmt: skip
        monkeypatch.setattr(module, "INTERPRET", False)
        configs = module._configs()
        for target in TARGETS:
            kept = _common.configs_within(configs, module.shared_memory_bytes, args, aot.TARGETS[target])
            compiled = {r["config"] for r in report["rows"] if r["launch"] == launch and r["target"] == target and "shared" in r}
            assert kept and {aot._describe(c) for c in kept} == compiled, (launch, target)


def test_fp32_attention_past_head_dim_128_is_refused_on_99_kb_parts(report):
    """The case the issue names: nothing fits, so the launcher refuses it with a clear error
    (tests/test_kernel_limits.py checks the message) instead of failing inside Triton."""
    unfit = {(u["launch"], u["target"]) for u in report["unfit"]}
    assert ("attention B1 N197 H2 D256 fp32", "sm_89") in unfit
    assert not [u for u in report["unfit"] if u["required"]]


def test_the_estimate_is_a_close_upper_bound(report):
    """The prune's estimate never undercounts (checked per kernel in the problems above) and, at
    ViT sizes (the launches compiled with every config), is not so loose that it drops configs
    that would fit: within 1.5x + 32 KB of the real shared memory (the slack is the layout-change
    scratch that small tiles do not need). Tiny GEMMs (K = 100) pipeline fewer stages than
    num_stages, so their estimate is looser; that only matters near the limit, which they are not."""
    from vitfast.kernels import aot

    full_size = {launch.name for launch in aot.LAUNCHES if launch.all_configs}
    rows = [r for r in report["rows"] if r["launch"] in full_size and r.get("estimate") and "shared" in r]
    assert rows
    for r in rows:
        assert r["estimate"] <= 1.5 * r["shared"] + 32 * 1024, r
