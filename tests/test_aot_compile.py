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
    assert kernels == {"_attention_fwd_kernel", "_add_layernorm_kernel", "_bias_gelu_kernel", "_bias_swiglu_kernel",
                       "_linear_epilogue_kernel", "_linear_epilogue_tma_kernel", "_linear_residual_layernorm_kernel",
                       "_linear_residual_layernorm_tma_kernel", "_rope_qkv_kernel"}

    def coverage(kernel: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(dtypes, targets) a kernel is compiled for: the TMA GEMMs fp16 / bf16 on sm_90a only."""
        if kernel.endswith("_tma_kernel"):
            return ("fp16", "bf16"), ("sm_90a",)
        return ("fp16", "bf16", "fp32"), TARGETS

    assert seen == {(k, d, t) for k in kernels for d in coverage(k)[0] for t in coverage(k)[1]}


def test_both_rope_layouts_compile_for_every_dtype_and_target(report):
    """The interleaved layout (EVA-02, timm) is its own specialisation of the RoPE kernel (a constexpr):
    compiled, like DINOv3's rotate-half one, for each dtype and target. The layout is read off the
    recorded launch, not its name."""
    from vitfast.kernels import aot

    layout = {launch.name: aot.record(launch).kwargs["INTERLEAVED"] for launch in aot.LAUNCHES if launch.name.startswith("rope_qkv")}
    seen = {(layout[r["launch"]], r["launch"].split()[-1], r["target"]) for r in report["rows"] if r["launch"] in layout and "shared" in r}
    assert seen == {(i, d, t) for i in (False, True) for d in ("fp16", "bf16", "fp32") for t in TARGETS}


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
    for module, (configs, estimate), launch, args, targets in (
        (att, ("_configs", "shared_memory_bytes"), f"attention B2 N256 H8 D128 {dtype}", {"QKV": t, "BLOCK_D": 128}, TARGETS),
        (le, ("_configs", "shared_memory_bytes"), f"linear fc1+gelu 1576x768->3072 {dtype}", {"X": t}, TARGETS),
        (le, ("_tma_configs", "tma_shared_memory_bytes"), f"linear tma fc1+gelu 1576x768->3072 {dtype}", {"X": t, "RESIDUAL": 0}, ["sm_90a"]),
        (lln, ("_configs", "shared_memory_bytes"), f"linear_layernorm proj 1576x768->768 {dtype}", {"X": t}, TARGETS),
        (lln, ("_tma_configs", "tma_shared_memory_bytes"), f"linear_layernorm tma proj 1576x768->768 {dtype}", {"X": t}, ["sm_90a"]),
    ):
        monkeypatch.setattr(module, "INTERPRET", False)
        for target in targets:
            kept = _common.configs_within(getattr(module, configs)(), getattr(module, estimate), args, aot.TARGETS[target])
            compiled = {r["config"] for r in report["rows"] if r["launch"] == launch and r["target"] == target and "shared" in r}
            assert kept and {_common.describe_config(c) for c in kept} == compiled, (launch, target)


def test_every_kept_config_compiles_for_every_kernel_dtype_and_target(report, monkeypatch):
    """README's claim counted: for each autotuned kernel x dtype x target, every config its prune keeps at some
    launch (the GPU config lists, pruned here by the prune's rule `kept_configs`) compiled with at least one launch.
    When each sampled launch compiled one config by rotation alone, 60 of 327 never did, among them all the whole-head
    attention tiles on sm_89 (kept there at head_dim 32 only)."""
    from vitfast.kernels import _common, aot
    from vitfast.kernels import attention as att
    from vitfast.kernels import linear_epilogue as le
    from vitfast.kernels import linear_layernorm as lln

    config_lists = {"_attention_fwd_kernel": (att, "_configs"), "_linear_epilogue_kernel": (le, "_configs"),
                    "_linear_epilogue_tma_kernel": (le, "_tma_configs"), "_linear_residual_layernorm_kernel": (lln, "_configs"),
                    "_linear_residual_layernorm_tma_kernel": (lln, "_tma_configs")}  # fmt: skip
    kept = set()
    for launch in aot.LAUNCHES:
        rec = aot.record(launch)
        if rec.jit.__name__ not in config_lists:
            continue
        module, configs = config_lists[rec.jit.__name__]
        with monkeypatch.context() as patch:
            patch.setattr(module, "INTERPRET", False)
            gpu = getattr(module, configs)()
        for target in TARGETS:
            if aot.TARGETS[target][0] >= launch.min_capability:
                for c in _common.kept_configs(gpu, rec.kernel.shared_memory_estimate, rec.named_args(), aot.TARGETS[target]):
                    kept.add((rec.jit.__name__, launch.dtype, target, _common.describe_config(c)))
    compiled = {(r["kernel"], r["launch"].split()[-1], r["target"], r["config"]) for r in report["rows"] if "shared" in r}
    assert ("_attention_fwd_kernel", "fp16", "sm_89", "BLOCK_M=64,BLOCK_N=256,TAIL=0,WHOLE=True,w4,s1") in kept
    assert not kept - compiled, sorted(kept - compiled)


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


def test_fp16_and_bf16_dots_run_on_the_tensor_cores(report):
    """Attention and GEMM tiles in fp16/bf16 compile to the tensor cores: on sm_90a Hopper's wgmma
    (the HGMMA path; Ampere's mma.sync runs an H100 far below its peak) wherever the tile has 64
    rows, and each ViT-size launch (compiled with every config) has such configs; mma.sync on sm_80/89."""
    from vitfast.kernels import aot

    half = [r for r in report["rows"] if r["kernel"] in aot.DOT_KERNELS and "shared" in r and r["launch"].split()[-1] != "fp32"]
    assert all(r["mma"] == r["mma_expected"] for r in half)
    assert all(r["mma"] == "mma.sync" for r in half if r["target"] != "sm_90a")
    every = {launch.name for launch in aot.LAUNCHES if launch.all_configs}
    hopper = {r["launch"] for r in half if r["target"] == "sm_90a" and r["launch"] in every}
    assert hopper and hopper == {r["launch"] for r in half if r["target"] == "sm_90a" and r["launch"] in every and r["mma"] == "wgmma"}


def test_the_matrix_instruction_is_read_off_the_ptx():
    from vitfast.kernels import aot

    assert aot.matrix_instruction("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%r1}") == "wgmma"
    assert aot.matrix_instruction("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1}") == "mma.sync"
    assert aot.matrix_instruction("fma.rn.f32 %f1, %f2, %f3, %f4;") == "none"
    assert aot.expected_matrix_instruction("_attention_fwd_kernel", "bf16", "sm_90a", 64) == "wgmma"
    assert aot.expected_matrix_instruction("_linear_residual_layernorm_kernel", "fp16", "sm_90a", 32) == "mma.sync"
    assert aot.expected_matrix_instruction("_attention_fwd_kernel", "fp32", "sm_90a", 64) is None
    assert aot.expected_matrix_instruction("_add_layernorm_kernel", "fp16", "sm_80", 0) is None
    rows = [{"launch": "attention B1 N7 H1 D64 fp16", "config": "w4,s2", "target": "sm_90a", "kernel": "_attention_fwd_kernel",
             "shared": 1, "limit": 2, "estimate": 1, "mma": "mma.sync", "mma_expected": "wgmma"}]  # fmt: skip
    assert aot.problems(rows, []) == ["attention B1 N7 H1 D64 fp16 [w4,s2] on sm_90a: compiles its dot to mma.sync, not wgmma"]
    # fp64 arithmetic is counted, conversions and parameter loads are not
    assert aot.f64_arithmetic("ld.param.f64 %fd1, [p];\ncvt.rn.f32.f64 %f1, %fd1;\nmul.rn.f32 %f2, %f1, %f3;") == 0
    assert aot.f64_arithmetic("add.rn.f64 %fd2, %fd1, %fd3;\nrsqrt.approx.ftz.f64 %fd4, %fd2;\nfma.rn.f64 %fd5, %fd4, %fd4, %fd1;") == 3
    rows = [{"launch": "add_layernorm 7x37 fp16", "config": "w4,s3", "target": "sm_90a", "kernel": "_add_layernorm_kernel", "shared": 1,
             "limit": 2, "estimate": 1, "mma": "none", "mma_expected": None, "scalars": "fp64", "f64_ops": 18}]  # fmt: skip
    assert aot.problems(rows, []) == ["add_layernorm 7x37 fp16 [w4,s3] on sm_90a: 18 fp64 instructions with its float arguments typed fp64 "
                                      "(as Inductor passes them): cast them to fp32 in the kernel"]  # fmt: skip


def test_two_programs_per_sm_stay_resident_together(report):
    """The Hopper GEMM's PER_SM=2 configs (one program's epilogue overlapping the other's main loop) are
    compiled at ViT-B's fc1 and fit two to an SM (the report's problems would name them otherwise); the
    check itself refuses a pair over the shared memory or the register file."""
    from vitfast.kernels import aot

    pairs = [r for r in report["rows"] if r.get("per_sm") == 2 and "shared" in r]
    assert {r["launch"] for r in pairs} >= {"linear tma fc1+gelu 1576x768->3072 fp16"}
    assert all(aot.fits_per_sm(r) and r["regs"] for r in pairs)
    row = {"per_sm": 2, "target": "sm_90a", "shared": 114712, "regs": 101, "warps": 8}
    assert aot.fits_per_sm(row)
    assert not aot.fits_per_sm(row | {"shared": 116000})  # 2 x (116000 + 1 KB reserved) > 228 KB
    assert not aot.fits_per_sm(row | {"regs": 129})  # 2 x 136 x 32 x 8 > 64K registers
    assert not aot.fits_per_sm(row | {"target": "sm_89"})
    problem = aot.problems([row | {"launch": "l", "config": "c", "limit": 232448, "estimate": None, "mma_expected": None, "regs": 200}], [])
    assert problem == ["l [c] on sm_90a: 2 programs per SM do not fit one SM (114712 B shared, 200 registers x 8 warps each)"]


def test_float_arguments_typed_fp64_as_inductor_passes_them(report):
    """torch.compile over optimize() hands each Python float (softmax scale, LayerNorm eps) to the
    kernels as fp64; found on an H100, where the attention kernel then failed to compile (its
    running max turned fp64 inside the loop). Each such kernel compiles that way too, without
    fp64 arithmetic."""
    typed = {r["kernel"]: r for r in report["rows"] if r["scalars"] == "fp64"}
    assert set(typed) == {"_attention_fwd_kernel", "_add_layernorm_kernel", "_linear_residual_layernorm_kernel",
                          "_linear_residual_layernorm_tma_kernel"}  # (traces launch the pointer kernel; checked all the same)
    for kernel, row in typed.items():
        assert "error" not in row, f"{kernel}: {row.get('error')}"
        assert row["f64_ops"] == 0, f"{kernel}: {row['f64_ops']} fp64 instructions"


def test_16bit_gelu_compiles_to_one_rcp_and_one_ex2_per_element(tmp_path):
    """benchmarks/gelu_sass.py (sm_90a SASS): erf's GELU for a 16-bit output is the erfc form, its reciprocal and exp2
    one MUFU instruction each per element (the reciprocal the inline PTX `rcp.approx.ftz`, which the interpreter
    never runs), in fewer instructions than libdevice's erf, which fp32 outputs keep (one MUFU, its exp2)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    out = tmp_path / "sass.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gelu_sass.py"), "--arch", "90", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    erf = {r["fast"]: r for r in json.loads(out.read_text()) if r["form"] == "none"}
    per_thread = 2048 // (32 * 4)  # gelu_sass.py's BLOCK over its 4 warps
    assert (erf[True]["mufu"], erf[False]["mufu"]) == (2 * per_thread, per_thread)
    # (libdevice's erf and tl.math.exp2 use ex2.approx.ftz themselves: the reciprocal tells the two paths apart)
    assert "rcp.approx.ftz.f32" in erf[True]["approx_ptx"] and "rcp.approx.ftz.f32" not in erf[False]["approx_ptx"]
    assert erf[True]["per_element"] < erf[False]["per_element"]


def test_recorded_elementwise_launches_take_the_gpu_tiles(monkeypatch):
    """`recording(cpu=True)` lets CPU tensors through the launchers; it used to do so by switching on the interpreter
    flag, which also picks the interpreter's 16 x 64 tiles, so bias+GELU and bias+SwiGLU were compiled with tiles no GPU
    launch uses. Recorded in a process without the interpreter, each launch has the tiles a GPU launch computes."""
    from vitfast.kernels import _common, aot

    monkeypatch.setattr(_common, "INTERPRET", False)  # as in the AOT check's own process
    launches = [launch for launch in aot.LAUNCHES if launch.name.startswith(("bias_gelu", "bias_swiglu"))]
    assert launches
    for launch in launches:
        recorded = aot.record(launch)
        rows, width = (recorded.named_args()[k] for k in ("M", "C" if "BLOCK_C" in recorded.kwargs else "H"))
        block_m, block_n, _ = _common.elementwise_tiles(rows, width)
        assert (block_m, block_n) == (8, min(_common.next_pow2(width), 256)), launch.name
        assert (recorded.kwargs["BLOCK_M"], recorded.kwargs.get("BLOCK_C", recorded.kwargs.get("BLOCK_H"))) == (block_m, block_n), launch.name
