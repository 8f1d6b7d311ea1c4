"""`vitfast.optimize` / `restore` on whole models (Triton interpreter on CPU)."""

from __future__ import annotations

import contextlib
import copy
import importlib
import warnings
from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton", reason="Triton is not installed (pip install 'vitfast[triton]')")

import vitfast  # noqa: E402
from conftest import AIMV2, DINOV3, EVA02, randomize, tiny_config, traced_vitfast_ops  # noqa: E402
from vitfast.errors import VitfastWarning  # noqa: E402
from vitfast.fused import FusedBlock, GemmPatchEmbed  # noqa: E402

VARIANTS = {
    "plain": tiny_config(),
    "tanh-no-qkv-bias-no-final-norm": tiny_config(act_layer="gelu_tanh", qkv_bias=False, final_norm=False, embed_dim=48, num_heads=3),
    "distilled": tiny_config(distilled=True),
    "distilled-one-head": tiny_config(distilled=True, dist_head=False),
    "layer-scale-registers-avg": tiny_config(init_values=0.1, reg_tokens=2, class_token=False, global_pool="avg", no_embed_class=True),
    "clip-pre-norm-quick-gelu": tiny_config(pre_norm=True, act_layer="quick_gelu", norm_eps=1e-5),
    "siglip-attention-pool": tiny_config(class_token=False, global_pool="map", act_layer="gelu_tanh"),
    "dinov2-giant-swiglu-classifier": tiny_config(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=3,
                                                  init_values=0.1, reg_tokens=2, no_embed_class=True, global_pool="token_avg"),
    "aimv2-rmsnorm-swiglu-no-bias": tiny_config(**AIMV2),
    "rmsnorm-gelu-no-proj-bias-layer-scale": tiny_config(norm_layer="rmsnorm", proj_bias=False, init_values=0.1, act_layer="gelu_tanh"),
    "swiglu-packed-no-bias": tiny_config(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=3, proj_bias=False),
    "dinov3-rope-registers-layer-scale": tiny_config(**DINOV3),
    "dinov3-swiglu-rope-avg-pool": tiny_config(**DINOV3 | dict(mlp_layer="swiglu", act_layer="silu", mlp_ratio=2.5, class_token=False,
                                                               global_pool="avg", reg_tokens=1)),
    "eva02-axial-rope-swiglu-mlp-norm": tiny_config(**EVA02),
    "eva02-clip-packed-attn-norm-odd-grid": tiny_config(**EVA02 | dict(img_size=(40, 24), embed_dim=48, num_heads=4, global_pool="token",
                                                                        mlp_layer="swiglu_packed", mlp_ratio=16 / 3, scale_attn_norm=True)),
    "beit3-inner-norms-gelu": tiny_config(scale_attn_norm=True, scale_mlp_norm=True, global_pool="avg", norm_eps=1e-5, init_values=0.1),
    "unpooled-per-token-head-registers": tiny_config(global_pool="", reg_tokens=2),
    # the first map is taken between fused blocks, which hand on (x, next norm1(x)); the norm is the final one
    "feature-maps-normed-registers": tiny_config(depth=3, features_only=True, out_indices=(0, 1), feature_norm=True, reg_tokens=2),
    "hybrid": vitfast.get_config("vit_small_r26_s32_224", img_size=32, depth=1, embed_dim=64, num_heads=2, num_classes=5),
}


def optimize_and_compare(cfg, device, **optimize_kwargs):
    """A random model of `cfg`, optimized in place; checks the parameters are shared (not copied)
    and the logits and top-1 match the reference. -> (model, x, reference logits)."""
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = torch.randn(3, 3, *cfg.img_hw, device=device)
    params_before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    with torch.no_grad():
        ref = model(x)
        vitfast.optimize(model, **optimize_kwargs)
        assert any(isinstance(b, FusedBlock) for b in model.blocks)
        assert {k: v.data_ptr() for k, v in model.state_dict().items()} == params_before  # shared, not copied
        out = model(x)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert torch.equal(out.argmax(-1), ref.argmax(-1))
    return model, x, ref


# every token of each map, the prefix tokens first: sliced from the (x, norm1(x)) the fused blocks hand on
EVERY_TOKEN = tiny_config(depth=3, features_only=True, out_indices=(0, 2), output_fmt="NLC", feature_prefix_tokens=True, reg_tokens=1)


@pytest.mark.parametrize("name", [*VARIANTS, "feature-maps-every-token"])
def test_optimized_logits_match_reference(device, name):
    model, x, ref = optimize_and_compare(VARIANTS.get(name, EVERY_TOKEN), device)
    with torch.no_grad():
        vitfast.restore(model)
        assert not any(isinstance(b, FusedBlock) for b in model.blocks)
        assert torch.equal(model(x), ref)  # restore is bit-identical


def test_fused_path_really_runs_the_kernels(device, monkeypatch):
    from vitfast.kernels import attention

    calls = []
    real = attention.attention_launch
    monkeypatch.setattr(attention, "attention_launch", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = vitfast.optimize(vitfast.create_model(tiny_config()).to(device))
    with torch.no_grad():
        model.forward_features(torch.randn(1, 3, 32, 32, device=device))
        assert len(calls) == tiny_config().depth
        model(torch.randn(1, 3, 32, 32, device=device))  # head_only: the last block's one query row runs on SDPA
    assert len(calls) == 2 * tiny_config().depth - 1


@pytest.mark.parametrize("overrides", [
    {},  # ViT-style 16 x 16 patches (tiny_config: 32 px, patch 8)
    dict(img_size=(40, 24), in_chans=2, patch_size=8),  # non-square, 2 channels
    dict(img_size=28, patch_size=14, embed_dim=48, num_heads=3),  # EVA / DINOv2 14 px patches
    dict(dynamic_img_size=True),  # another whole-patch size at run time
    AIMV2,  # no conv bias, a norm after the embedding
])  # fmt: skip
def test_patch_embedding_runs_as_one_gemm(device, overrides):
    """optimize() swaps the stride = kernel convolution for a GEMM over the unfolded patches (cuDNN's
    convolution plus layout changes took 8% of ViT-B/16's forward on an H100): the same tokens as the
    convolution in float64, the same state_dict, restored by restore()."""
    from vitfast.fused import GemmPatchEmbed
    from vitfast.layers import PatchEmbed

    cfg = tiny_config(**overrides)
    model = randomize(vitfast.create_model(cfg)).double().to(device)
    h, w = (48, 40) if overrides.get("dynamic_img_size") else cfg.img_hw
    x = torch.randn(3, cfg.in_chans, h, w, device=device, dtype=torch.float64)
    keys = list(model.state_dict())
    with torch.no_grad():
        ref = model.patch_embed(x)
        vitfast.optimize(model)
        assert isinstance(model.patch_embed, GemmPatchEmbed) and list(model.state_dict()) == keys
        torch.testing.assert_close(model.patch_embed(x), ref, atol=1e-12, rtol=1e-12)
        with pytest.raises(vitfast.InputError, match="input channels"):
            model.patch_embed(torch.randn(1, cfg.in_chans + 1, h, w, device=device, dtype=torch.float64))
        vitfast.restore(model)
    assert type(model.patch_embed) is PatchEmbed and torch.equal(model.patch_embed(x), ref)


def test_eager_forward_calls_the_launchers_without_the_op_dispatcher(device):
    """Eager mode skips the torch op dispatcher (its host time per call set the batch-1 latency on an
    H100); a dispatch mode (here FlopCounterMode) and traces still see the `vitfast::` ops, with the
    same result."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    model = vitfast.optimize(randomize(vitfast.create_model(tiny_config(init_values=0.1))).to(device), mlp="cublas")
    x = torch.randn(2, 3, 32, 32, device=device)

    def vitfast_ops_seen(run) -> tuple[set[str], torch.Tensor]:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            out = run()
        return {e.name for e in prof.events() if e.name.startswith("vitfast::")}, out

    eager_ops, out = vitfast_ops_seen(lambda: model(x))
    assert eager_ops == set()

    def in_mode():
        with FlopCounterMode(display=False):
            return model(x)

    mode_ops, out_mode = vitfast_ops_seen(in_mode)
    assert {"vitfast::fused_attention", "vitfast::add_layernorm"} <= mode_ops
    torch.testing.assert_close(out, out_mode, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["plain", "tanh-no-qkv-bias-no-final-norm", "layer-scale-registers-avg", "clip-pre-norm-quick-gelu"])
def test_epilogue_mlp_path_matches_reference(device, name, monkeypatch):
    """mlp="epilogue": fc1 + bias + GELU as a Triton GEMM epilogue; proj and fc2 + bias
    (+ LayerScale) + residual + the next LayerNorm as one Triton GEMM (the last fc2: + residual
    only). Same logits and top-1 as the reference, restore bit-identical. The cuBLAS path runs fc1
    with its bias and PyTorch's GELU, except QuickGELU (the bias + GELU kernel)."""
    from vitfast.kernels import bias_gelu, linear_epilogue, linear_layernorm

    calls = {"epilogue": 0, "linear_layernorm": 0, "bias_gelu": 0}

    def counted(module, name, key):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, **k: calls.__setitem__(key, calls[key] + 1) or real(*a, **k))

    counted(linear_epilogue, "linear_epilogue_launch", "epilogue")
    counted(linear_layernorm, "linear_residual_layernorm_launch", "linear_layernorm")
    counted(bias_gelu, "bias_gelu_launch", "bias_gelu")
    cfg = VARIANTS[name]
    model, x, ref = optimize_and_compare(cfg, device, mlp="epilogue")
    depth = cfg.depth
    with torch.no_grad():
        assert calls == {"epilogue": depth + 1, "linear_layernorm": 2 * depth - 1, "bias_gelu": 0}
        vitfast.optimize(model, mlp="cublas")  # switching an optimized model's path
        torch.testing.assert_close(model(x), ref, atol=1e-4, rtol=1e-4)
        assert calls == {"epilogue": depth + 1, "linear_layernorm": 2 * depth - 1, "bias_gelu": depth if cfg.act_layer == "quick_gelu" else 0}
        vitfast.restore(model)
        assert torch.equal(model(x), ref)  # restore is bit-identical


@pytest.mark.parametrize("name", ["plain", "tanh-no-qkv-bias-no-final-norm", "clip-pre-norm-quick-gelu"])
def test_measured_bias_gelu_path_runs_fc1_without_bias_then_the_kernel(device, name, monkeypatch):
    """A table entry with fc1 "bias_gelu": cuBLAS without the bias, then the bias + GELU kernel, once per block, same
    logits. GELU's tanh form keeps its one cuBLASLt GEMM (no kernel), and a forced mlp="cublas" PyTorch's GELU."""
    from vitfast.kernels import bias_gelu

    launches = []
    real = bias_gelu.bias_gelu_launch
    monkeypatch.setattr(bias_gelu, "bias_gelu_launch", lambda *a, **k: launches.append(a[3] if len(a) > 3 else k.get("approximate", "none")) or real(*a, **k))
    cfg = VARIANTS[name]
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = torch.randn(3, 3, *cfg.img_hw, device=device)
    with torch.no_grad():
        ref = model(x)
        vitfast.optimize(model)
        for block in model.blocks:
            block.measured = {torch.float32: ((256, "bias_gelu", "cublas", "bias_gelu", "cublas"),)}
        torch.testing.assert_close(model(x), ref, atol=1e-4, rtol=1e-4)
        form = {"gelu": "none", "gelu_tanh": None, "quick_gelu": "sigmoid"}[cfg.act_layer]
        assert launches == ([form] * cfg.depth if form else [])
        if name == "plain":  # traces take the entry's fc1_traced: the op, with no graph break
            assert "vitfast.bias_gelu.default" in traced_vitfast_ops(model, x, ref, device)
        launches.clear()
        vitfast.optimize(model, mlp="cublas")
        model(x)
        assert launches == (["sigmoid"] * cfg.depth if form == "sigmoid" else [])


def test_auto_mlp_path_is_cublas_until_measured(device, monkeypatch):
    """"auto" runs cuBLAS + the standalone kernel where no GPU of this compute capability measured the shape (off CUDA too)."""
    from vitfast import fused

    model = vitfast.optimize(vitfast.create_model(tiny_config()).to(device))
    assert all(b.mlp_path == "auto" for b in model.blocks)
    assert fused.choose_mlp_paths("auto", torch.device(device), torch.float16, 768, 3072, 256 * 197) == ("cublas", "cublas")
    # with measurements: same compute capability, dtype, C and hidden; nearest M bucket (log scale)
    table = [
        dict(compute_capability="9.0", dtype="float16", C=768, hidden=3072, m_bucket=256, fc1="cublas", fc2="cublas"),
        dict(compute_capability="9.0", dtype="float16", C=768, hidden=3072, m_bucket=65536, fc1="epilogue", fc2="cublas"),
    ]
    monkeypatch.setattr(fused, "mlp_dispatch_table", lambda: tuple(table))
    monkeypatch.setattr(fused, "_capability", lambda device: "9.0")
    cuda = torch.device("cuda")  # only a key here: nothing touches CUDA
    assert fused.choose_mlp_paths("auto", cuda, torch.float16, 768, 3072, 64 * 197) == ("epilogue", "cublas")  # 16384 -> 65536
    assert fused.choose_mlp_paths("auto", cuda, torch.float16, 768, 3072, 197) == ("cublas", "cublas")
    assert fused.choose_mlp_paths("auto", cuda, torch.bfloat16, 768, 3072, 64 * 197) == ("cublas", "cublas")  # not measured
    assert fused.choose_mlp_paths("auto", cuda, torch.float16, 384, 1536, 64 * 197) == ("cublas", "cublas")
    assert fused.choose_mlp_paths("epilogue", cuda, torch.float16, 384, 1536, 1) == ("epilogue", "epilogue")


def test_traces_take_fc1_as_measured_for_the_kernel_they_launch(monkeypatch):
    """On Hopper an eager epilogue path runs the TMA GEMMs, a torch.compile trace the pointer ones: inside a trace
    a block takes the entry's `fc1_traced` / `fc2_traced`, or its fc1 / fc2 where the entry predates them."""
    model = vitfast.optimize(vitfast.create_model(tiny_config()))
    block = model.blocks[0]
    block.measured = {torch.float16: ((65536, "epilogue", "epilogue", "cublas", "epilogue"),)}
    assert block.mlp_paths(torch.float16, 64 * 197) == ("epilogue", "epilogue")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert block.mlp_paths(torch.float16, 64 * 197) == ("cublas", "epilogue")
    block.measured = {torch.float16: ((65536, "epilogue", "cublas", None, None),)}  # an entry from before the TMA kernels
    assert block.mlp_paths(torch.float16, 64 * 197) == ("epilogue", "cublas")


def test_attention_dispatch_is_the_kernel_until_measured(device, monkeypatch):
    """"auto" runs the Triton kernel where nothing was measured; with measurements, the entry of the same
    compute capability, dtype, N and head_dim whose batch x heads bucket is nearest (log scale)."""
    from vitfast import fused

    model = vitfast.optimize(vitfast.create_model(tiny_config()).to(device))
    assert {b.attention_kernel(torch.float32, 2, 17) for b in model.blocks} == {"vitfast"}
    table = [
        dict(compute_capability="9.0", dtype="float16", N=197, head_dim=64, bh_bucket=16, path="vitfast"),
        dict(compute_capability="9.0", dtype="float16", N=197, head_dim=64, bh_bucket=4096, path="sdpa"),
        dict(compute_capability="9.0", dtype="float16", N=577, head_dim=80, bh_bucket=1024, path="sdpa"),
    ]
    monkeypatch.setattr(fused, "attention_dispatch_table", lambda: tuple(table))
    monkeypatch.setattr(fused, "_capability", lambda device: "9.0")
    choices = fused.measured_attention(torch.device("cuda"), 64)  # only a key here: nothing touches CUDA
    assert set(choices) == {torch.float16} and fused.measured_attention(torch.device("cpu"), 64) == {}
    assert fused.nearest_attention_path(choices[torch.float16], 197, 256 * 12) == "sdpa"  # 4096
    assert fused.nearest_attention_path(choices[torch.float16], 197, 12) == "vitfast"  # 16
    assert fused.nearest_attention_path(choices[torch.float16], 257, 256 * 12) == "vitfast"  # N not measured
    assert fused.nearest_attention_path(fused.measured_attention(torch.device("cuda"), 80)[torch.float16], 577, 8) == "sdpa"


@pytest.mark.parametrize("config", [tiny_config(init_values=0.1), tiny_config(**DINOV3)], ids=["layer-scale", "dinov3-rope"])
def test_sdpa_attention_path_matches_reference(device, config):
    """attention="sdpa": PyTorch's SDPA on the packed qkv's views (after the RoPE kernel where there is one) instead
    of the Triton kernel, the rest fused as before; same logits, one graph."""
    model = randomize(vitfast.create_model(config)).to(device)
    x = torch.randn(2, 3, *config.img_hw, device=device)
    with torch.no_grad():
        ref = model(x)
        vitfast.optimize(model, attention="sdpa")
        per_block = launches_per_block(model, x)
        ops = traced_vitfast_ops(model, x, ref, device)  # also checks the logits (eager, compiled, exported)
    assert all(any("scaled_dot_product" in op for op in block) for block in per_block), per_block[1]
    assert not any("fused_attention" in op for block in per_block for op in block)
    assert "vitfast.fused_attention.default" not in ops and ("vitfast.add_layernorm.default" in ops)
    vitfast.optimize(model)  # back to "auto": the kernel off a measured GPU
    assert {b.attention_path for b in model.blocks} == {"auto"}


class LaunchCounter(TorchDispatchMode):
    """Counts the ops that launch work (one kernel each on CUDA; `addmm` with a 1-D bias is one
    cuBLASLt call with the bias epilogue): every dispatched op except views and allocations."""

    NOT_LAUNCHES = {"aten._unsafe_view.default", "aten.empty.memory_format", "aten.empty_strided.default"}

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and str(func) not in self.NOT_LAUNCHES:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def launches_per_block(model, x) -> list[list[str]]:
    """The launching ops of each block in one forward (each block's forward wrapped in a counter; not hooks, which
    would make a fused block hand on x alone)."""
    per_block = []
    for block in model.blocks:
        def counted(*args, _forward=block.forward, **kwargs):
            with LaunchCounter() as counter:
                out = _forward(*args, **kwargs)
            per_block.append(counter.ops)
            return out

        block.forward = counted  # an instance attribute: nn.Module.__call__ runs it
    try:
        with torch.no_grad():
            model(x)
    finally:
        for block in model.blocks:
            del block.forward
    return per_block


@pytest.mark.parametrize("mlp, act, approximate_gelu, most", [
    ("epilogue", "gelu", False, 5), ("cublas", "gelu", False, 8), ("cublas", "gelu_tanh", False, 7), ("cublas", "gelu", True, 7),
])  # fmt: skip
def test_launches_per_block(device, mlp, act, approximate_gelu, most):
    """Reference block with LayerScale: 12 launches (LN, qkv, SDPA, proj, *gamma, +, LN, fc1, GELU,
    fc2, *gamma, +). Optimized: LayerScale and the residual adds live in the epilogues and each
    block's last add is fused with the next block's LayerNorm, so only block 0 runs a LayerNorm of
    its own: epilogue path 5 (qkv, attention, proj+LN, fc1+GELU, fc2+LN), cuBLAS path 8 (qkv,
    attention, proj, add+LN, fc1, GELU, fc2, add+LN), 7 with GELU's tanh form, which cuBLASLt
    applies in fc1's epilogue (on CPU the count is of `linear_gelu_tanh`'s two ops less one: see below)."""
    model = randomize(vitfast.create_model(tiny_config(depth=3, init_values=0.1, act_layer=act))).to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    assert [len(ops) for ops in launches_per_block(model, x)] == [12, 12, 12]
    vitfast.optimize(model, mlp=mlp, approximate_gelu=approximate_gelu)
    if most == 7 and device != "cuda":  # off CUDA linear_gelu_tanh is addmm + gelu (the CPU addmm_activation is erf)
        most += 1
    counts = [len(ops) for ops in launches_per_block(model, x)]
    # block 0 runs its own norm1; the last block has no next LayerNorm, so on the cuBLAS path its
    # residual add is PyTorch's (x + gamma * y: 2 ops)
    assert counts[0] == most + 1 and counts[1] == most and counts[2] <= most + 1, counts


@pytest.mark.parametrize("mlp, most", [("epilogue", 7), ("cublas", 9)])
def test_aimv2_launches_per_block(device, mlp, most):
    """AIMv2's block: the RMSNorm forms of the same kernels, gate and value GEMMs apart then one SwiGLU kernel:
    epilogue path 7 (qkv, attention, proj+RMSNorm, gate, value, SwiGLU, fc2+RMSNorm), cuBLAS path 9 (qkv,
    attention, proj, add+RMSNorm, gate, value, SwiGLU, fc2, add+RMSNorm); no torch norm but block 0's own."""
    model = randomize(vitfast.create_model(tiny_config(depth=3, **AIMV2))).to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    vitfast.optimize(model, mlp=mlp)
    per_block = launches_per_block(model, x)
    assert [len(ops) for ops in per_block][:2] == [most + 1, most], per_block
    assert not any("rms_norm" in op or "layer_norm" in op for op in per_block[1])


@pytest.mark.parametrize("mlp, most", [("epilogue", 6), ("cublas", 9)])
def test_dinov3_launches_per_block(device, mlp, most):
    """DINOv3's block: one more kernel than ViT's, the rotary embedding between the qkv GEMM and the attention
    (it writes the rotated qkv the attention reads); its tables are computed once per forward, outside the blocks."""
    model = randomize(vitfast.create_model(tiny_config(depth=3, **DINOV3))).to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    vitfast.optimize(model, mlp=mlp)
    per_block = launches_per_block(model, x)
    assert [len(ops) for ops in per_block][:2] == [most + 1, most], per_block
    assert sum("rope_qkv" in op for op in per_block[1]) == 1


@pytest.mark.parametrize("mlp, most", [("epilogue", 9), ("cublas", 11)])
def test_eva02_clip_launches_per_block(device, mlp, most):
    """EVA-02 CLIP's block (packed SwiGLU): qkv, rotation (the same kernel as DINOv3's, interleaved), attention, proj,
    (add+LN), fc1 (cuBLAS), bias+SwiGLU, fc2, (add+LN): 7 on the epilogue path, 9 on cuBLAS, plus one LayerNorm kernel
    for each norm inside a branch (before the attention's output projection, before fc2); no torch norm."""
    model = randomize(vitfast.create_model(tiny_config(depth=3, **EVA02 | dict(mlp_layer="swiglu_packed", mlp_ratio=6,
                                                                                 scale_attn_norm=True)))).to(device)  # fmt: skip
    x = torch.randn(2, 3, 32, 32, device=device)
    vitfast.optimize(model, mlp=mlp)
    per_block = launches_per_block(model, x)
    assert [len(ops) for ops in per_block][:2] == [most + 1, most], per_block
    assert sum("rope_qkv" in op for op in per_block[1]) == 1 and sum(op == "vitfast.layernorm.default" for op in per_block[1]) == 2, per_block[1]
    assert not any("layer_norm" in op for op in per_block[1])


def tanh_gelu_copy(model):
    """A copy of the reference model with GELU's tanh form in every MLP: what approximate_gelu must compute."""
    copied = copy.deepcopy(model)
    for block in copied.blocks:
        block.mlp.act = torch.nn.GELU(approximate="tanh")
    return copied


@pytest.mark.parametrize("mlp", ["cublas", "epilogue"])
def test_approximate_gelu_runs_the_tanh_form(device, mlp):
    """optimize(approximate_gelu=True) on an erf-GELU model computes the same model with GELU's tanh form
    (checked against the reference with nn.GELU('tanh') swapped in), which really differs from the erf
    model; optimizing again without it goes back to the erf form, and restore() to the reference."""
    cfg = tiny_config(init_values=0.1)
    model = randomize(vitfast.create_model(cfg)).to(device)
    tanh_model = tanh_gelu_copy(model)
    x = 3 * torch.randn(3, 3, *cfg.img_hw, device=device)  # wide activations: where the two forms differ most
    with torch.no_grad():
        erf_ref, tanh_ref = model(x), tanh_model(x)
        assert (erf_ref - tanh_ref).abs().max() > 1e-5  # the check below can tell the forms apart
        vitfast.optimize(model, mlp=mlp, approximate_gelu=True)
        assert {b.gelu_form for b in model.blocks} == {"tanh"}
        torch.testing.assert_close(model(x), tanh_ref, atol=1e-5, rtol=1e-5)
        vitfast.optimize(model, mlp=mlp)
        torch.testing.assert_close(model(x), erf_ref, atol=1e-5, rtol=1e-5)
        assert torch.equal(vitfast.restore(model)(x), erf_ref)


def test_gelu_tanh_takes_cublaslt_over_the_tables_epilogue(device, monkeypatch):
    """GELU's tanh form (approximate_gelu, SigLIP) under mlp="auto" runs fc1 as `linear_gelu_tanh` (cuBLASLt's GELU
    epilogue on CUDA) even where the table says "epilogue" for fc1: that choice timed the erf form, and on the H100
    cuBLASLt's tanh epilogue beat the Triton GEMM at every shape. A forced mlp="epilogue" still gets the Triton GEMM.
    The same logits every way."""
    from vitfast import fused

    calls = []
    real = fused.linear_gelu_tanh
    monkeypatch.setattr(fused, "linear_gelu_tanh", lambda *a: calls.append(a[0].shape) or real(*a))
    cfg = tiny_config(init_values=0.1)
    model = randomize(vitfast.create_model(cfg)).to(device)
    tanh_model = tanh_gelu_copy(model)
    x = 3 * torch.randn(3, 3, *cfg.img_hw, device=device)
    with torch.no_grad():
        ref = tanh_model(x)
        vitfast.optimize(model, approximate_gelu=True, head_only=False)
        for block in model.blocks:
            block.measured = {torch.float32: ((256, "epilogue", "cublas", "epilogue", "cublas"),)}
        torch.testing.assert_close(model(x), ref, atol=1e-5, rtol=1e-5)
        assert len(calls) == cfg.depth
        assert not any("linear_bias_gelu" in op for op in launches_per_block(model, x)[1])
        calls.clear()
        vitfast.optimize(model, mlp="epilogue", approximate_gelu=True, head_only=False)
        torch.testing.assert_close(model(x), ref, atol=1e-5, rtol=1e-5)
        assert not calls and any("linear_bias_gelu" in op for op in launches_per_block(model, x)[1])


def test_linear_gelu_tanh_is_the_tanh_form_on_every_device(device):
    """torch._addmm_activation's GELU is the tanh form on CUDA and the erf form on CPU: the helper must be
    the tanh form on both, with and without a bias, for any leading dims."""
    from vitfast.fused import linear_gelu_tanh

    h, w, b = torch.randn(2, 5, 16, device=device), torch.randn(24, 16, device=device), torch.randn(24, device=device)
    for bias in (b, None):
        ref = torch.nn.functional.gelu(torch.nn.functional.linear(h.double(), w.double(), None if bias is None else bias.double()),
                                       approximate="tanh")  # fmt: skip
        torch.testing.assert_close(linear_gelu_tanh(h, w, bias).double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mlp", ["cublas", "epilogue"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_whole_model_parity_2x_rule(device, name, mlp):
    """Logits of the optimized fp32 model against the float64 reference model: at most 2x the error
    of the eager fp32 model plus 1e-4 (DESIGN.md's rule); restore() is bit-identical to before."""
    cfg = VARIANTS[name]
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = torch.randn(3, 3, *cfg.img_hw, device=device)
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.double())
        eager = model(x)
        fused = vitfast.optimize(model, mlp=mlp)(x)
        restored = vitfast.restore(model)(x)
    eager_err = (eager.double() - exact).abs().max().item()
    fused_err = (fused.double() - exact).abs().max().item()
    assert fused_err <= 2 * eager_err + 1e-4, f"optimized error {fused_err:.3g} vs eager {eager_err:.3g}"
    assert torch.equal(restored, eager)


@pytest.mark.parametrize("mlp", ["cublas", "epilogue"])
@pytest.mark.parametrize("extra", [{}, AIMV2, DINOV3, EVA02 | dict(scale_attn_norm=True), dict(features_only=True, out_indices=(0, 2))],
                         ids=["layernorm-gelu", "aimv2", "dinov3", "eva02", "feature-maps"])
def test_optimized_model_traces_as_one_graph(device, mlp, extra):
    """torch._dynamo.explain: one graph, no break; torch.compile(fullgraph=True) and torch.export
    run and match, the graph holding the vitfast ops. On CPU the traced ops take their reference
    math (kernels/_common.py `runs_reference`: the interpreter cannot read fake tensors), so this
    checks tracing and the ops' schemas and shapes; the kernels themselves run eagerly in the other
    tests, and compiled on a GPU in test_gpu_cuda_graphs_and_torch_compile. The CPU compile uses
    the aot_eager backend (Dynamo + AOT functionalization, where the ops are decomposed) to spare
    CI the C++ build of Inductor."""
    cfg = tiny_config(depth=3, **{"init_values": 0.1} | extra)
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    with torch.no_grad():
        ref = model(x)
        vitfast.optimize(model, mlp=mlp)
        ops = traced_vitfast_ops(model, x, ref, device)
    assert "vitfast.fused_attention.default" in ops
    assert extra is not AIMV2 or {"vitfast.swiglu.default", "vitfast.rmsnorm.default"} <= ops
    assert not extra.get("rope") or "vitfast.rope_qkv.default" in ops
    assert not extra.get("scale_attn_norm") or "vitfast.layernorm.default" in ops


def test_committed_mlp_dispatch_table_is_well_formed():
    from vitfast import fused

    fused.mlp_dispatch_table.cache_clear()
    for entry in fused.mlp_dispatch_table():
        assert {"compute_capability", "dtype", "C", "hidden", "m_bucket", "fc1", "fc2"} <= entry.keys()
        assert entry["fc1"] in ("cublas", "epilogue", "bias_gelu") and entry["fc2"] in ("cublas", "epilogue")
        assert entry.get("fc1_traced") in (None, "cublas", "epilogue", "bias_gelu") and entry.get("fc2_traced") in (None, "cublas", "epilogue")
        assert entry["m_bucket"] == fused.m_bucket(entry["m_bucket"])


def test_unknown_mlp_path_is_a_clear_error():
    with pytest.raises(vitfast.VitfastError, match="mlp must be one of auto, cublas, epilogue"):
        vitfast.optimize(vitfast.create_model(tiny_config()), mlp="fast")
    with pytest.raises(vitfast.VitfastError, match="attention must be one of auto, vitfast, sdpa"):
        vitfast.optimize(vitfast.create_model(tiny_config()), attention="flash")


def test_committed_attention_dispatch_table_is_well_formed():
    from vitfast import fused

    fused.attention_dispatch_table.cache_clear()
    for entry in fused.attention_dispatch_table():
        assert {"compute_capability", "dtype", "N", "head_dim", "bh_bucket", "path", "git_sha"} <= entry.keys()
        assert entry["path"] in ("vitfast", "sdpa") and entry["bh_bucket"] == fused.next_pow2(entry["bh_bucket"])


def test_attention_maps_and_training_fall_back_to_reference(device, monkeypatch):
    # the GEMM patch embedding sums in another order: the blocks alone here
    monkeypatch.setattr(importlib.import_module("vitfast.optimize"), "can_gemm_embed", lambda embed: False)
    model = randomize(vitfast.create_model(tiny_config())).to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    with torch.no_grad():
        _, ref_attn = model.forward_features(x, return_attention=True)
        vitfast.optimize(model)
        _, attn = model.forward_features(x, return_attention=True)
    for a, r in zip(attn, ref_attn):
        assert torch.equal(a, r)
    model.train()
    assert all(b.training and b.reference.training for b in model.blocks)
    model.eval()
    assert not any(b.reference.training for b in model.blocks)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_head_only_runs_the_last_block_on_the_rows_the_head_reads(device, name):
    """Class-token pooling (DeiT distilled: class and distillation tokens): model(x) runs the last block on those
    rows alone, with the same logits (optimize_and_compare checks them against the reference); on CPU the FLOPs
    saved are the last block's projection and MLP over the other rows (FlopCounterMode counts neither CPU SDPA
    nor our attention; on CUDA it counts SDPA's, and not cuBLASLt's GELU epilogue); forward_features still
    returns every token. Any other head (mean or attention pooling, none, feature maps) keeps the full forward."""
    from torch.utils.flop_counter import FlopCounterMode

    from vitfast.model import HEAD_ROWS

    cfg = VARIANTS[name]
    model, x, ref = optimize_and_compare(cfg, device)
    rows = None if cfg.features_only else 2 if cfg.distilled and cfg.dist_head else 1 if cfg.global_pool == "token" else None
    assert vars(model).get(HEAD_ROWS) == rows
    if rows is None:
        return
    with torch.no_grad():
        features = model.forward_features(x)
        with FlopCounterMode(display=False) as head_only:
            model(x)
        vitfast.optimize(model, head_only=False)
        assert HEAD_ROWS not in vars(model)
        with FlopCounterMode(display=False) as every_row:
            out = model(x)
        assert torch.equal(model.forward_features(x), features)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    if device == "cuda":
        return
    B, T, C = features.shape
    last = model.blocks[-1]
    weights = sum(m.in_features * m.out_features for n, m in last.named_modules() if isinstance(m, torch.nn.Linear) and n != "attn.qkv")
    assert every_row.get_total_flops() - head_only.get_total_flops() == 2 * B * (T - rows) * weights


def test_head_only_follows_optimize_restore_hooks_pickling_and_cuda_graphs(device):
    """The row count lives on the model (its class's forward reads it): restore() and head_only=False clear it, a
    forward hook on the last block or the final norm gets every token, the model pickles, and graphs captured
    with the other forward are dropped to be captured again."""
    import io

    from vitfast.model import HEAD_ROWS

    optimize_module = importlib.import_module("vitfast.optimize")
    model = randomize(vitfast.create_model(tiny_config())).to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    with torch.no_grad():
        ref = model(x)
        vitfast.optimize(model)
        assert vars(model)[HEAD_ROWS] == 1
        every_token = model.forward_features(x).shape
        seen = []
        handle = model.blocks[-1].register_forward_hook(lambda module, args, out: seen.append(out.shape))
        torch.testing.assert_close(model(x), ref, atol=1e-4, rtol=1e-4)
        handle.remove()
        assert seen == [every_token]  # a hook on the last block: the full forward, every token
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert vars(loaded)[HEAD_ROWS] == 1
        torch.testing.assert_close(loaded(x), ref, atol=1e-4, rtol=1e-4)
    graphed = optimize_module.CudaGraphForward(model.forward)  # as cuda_graphs=True wraps it on a GPU
    model.forward = graphed
    setattr(model, optimize_module._GRAPHED, graphed)
    graphed.graphs[("shape",)] = "a graph captured with head_only"
    vitfast.optimize(model, head_only=False)
    assert HEAD_ROWS not in vars(model) and graphed.graphs == {}
    vitfast.restore(model)
    assert "forward" not in vars(model) and HEAD_ROWS not in vars(model)
    vitfast.optimize(model)
    vitfast.restore(model)
    assert HEAD_ROWS not in vars(model)


class FakeCudaGraph:
    """torch.cuda.CUDAGraph's CPU stand-in for `mock_graph_api`: a graph holds the GPU work launched while it
    was captured, so it notes how many Triton kernels really ran then (`kernel_runs`, counted by the test)."""

    kernel_runs = [0]  # every kernel run so far, shared with the counting wrap_triton

    def __init__(self):
        self.kernels = None

    def replay(self):
        if not self.kernels:
            raise AssertionError("replayed a graph captured without its Triton kernels: its outputs are garbage")


def mock_graph_api(monkeypatch):
    """torch.cuda's graph API replaced by CPU stand-ins (as a GPU-less CudaGraphForward needs them), every kernel
    launch counted in `FakeCudaGraph.kernel_runs`."""
    from vitfast.kernels.precompile import KERNEL_MODULES

    @contextlib.contextmanager
    def capture(graph, pool=None, stream=None):
        before = FakeCudaGraph.kernel_runs[0]
        yield
        graph.kernels = FakeCudaGraph.kernel_runs[0] - before

    class Counting:  # what a launcher's wrap_triton(kernel, like) gives: kernel[grid](...), counted
        def __init__(self, kernel, like):
            self.kernel = kernel

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                FakeCudaGraph.kernel_runs[0] += 1
                return self.kernel[grid](*args, **kwargs)

            return run

    for module in KERNEL_MODULES:
        monkeypatch.setattr(module, "wrap_triton", Counting)
    for name, value in dict(device=lambda d: contextlib.nullcontext(), Stream=lambda d=None: mock.Mock(),
                            stream=lambda s: contextlib.nullcontext(), current_stream=lambda d=None: mock.Mock(),
                            graph_pool_handle=object, CUDAGraph=FakeCudaGraph, graph=capture).items():  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, value)


def test_precompiles_recording_captures_no_cuda_graph(device, monkeypatch):
    """precompile(lambda: model(x)) on a CUDA-graphed model: inside its `recording` no kernel runs, so the graph
    forward runs the plain forward once (the same launches recorded as without graphs) and keeps no graph; the
    first real call captures one with the kernels in it, which replays."""
    from vitfast.kernels.precompile import recording

    if device == "cuda":
        pytest.skip("mocks torch.cuda's graph API on CPU (on a GPU, test_gpu_cuda_graphs_and_torch_compile captures for real)")
    optimize_module = importlib.import_module("vitfast.optimize")
    model = vitfast.optimize(randomize(vitfast.create_model(tiny_config())))
    x = torch.randn(1, 3, 32, 32)
    mock_graph_api(monkeypatch)
    with torch.no_grad():
        with recording(cpu=True) as plain:
            model(x)
        graphed = optimize_module.CudaGraphForward(model.forward)  # as cuda_graphs=True wraps it on a GPU
        model.forward = graphed
        with recording(cpu=True) as calls:
            model(x)
        assert [c.jit.__name__ for c in calls] == [c.jit.__name__ for c in plain] != []
        assert graphed.graphs == {}
        model(x)
        model(2 * x)  # replays
    (graph,) = [replay.__self__ for replay, _, _ in graphed.graphs.values()]
    assert graph.kernels > 0


@pytest.mark.parametrize("cfg", [tiny_config(img_size=(37, 30)), tiny_config(**EVA02 | dict(img_size=(37, 30)))], ids=["plain", "eva02-rope"])
def test_an_image_of_part_patches_loses_its_remainder_as_the_reference_conv_does(device, cfg):
    """An img_size that is not whole patches (DINOv2's 14 px patches at 384 px): the conv drops the rows and columns past
    the last whole patch, and so does the GEMM patch embedding. A dynamic-size model refuses such images in both."""
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = torch.randn(2, 3, 37, 30, device=device)
    with torch.no_grad():
        ref = model(x)
        vitfast.optimize(model)
        assert isinstance(model.patch_embed, GemmPatchEmbed) and all(isinstance(b, FusedBlock) for b in model.blocks)
        torch.testing.assert_close(model(x), ref, atol=1e-4, rtol=1e-4)
    dynamic = vitfast.create_model(tiny_config(img_size=(37, 30), dynamic_img_size=True)).to(device)
    for _ in range(2):
        with pytest.raises(vitfast.InputError, match="not whole 8x8 patches.*crop or resize to e.g. 32x24"):
            dynamic(x)
        vitfast.optimize(dynamic)


def test_custom_injected_layers_are_left_alone_and_optimize_says_so(device):
    class MyAttention(vitfast.layers.Attention):
        pass

    model = vitfast.VisionTransformer(tiny_config(), attn_layer=MyAttention).eval().to(device)
    with pytest.warns(VitfastWarning, match=r"fused 0 of 2 blocks: block\(s\) 0, 1 hold layers the kernels do not compute \(MyAttention\)"):
        vitfast.optimize(model)
    assert not any(isinstance(b, FusedBlock) for b in model.blocks)
    model = vitfast.create_model(tiny_config(depth=3)).to(device)
    model.blocks[1].mlp.fc1 = LoRALinear(model.blocks[1].mlp.fc1)
    with pytest.warns(VitfastWarning, match=r"fused 2 of 3 blocks: block\(s\) 1 .*\(LoRALinear\)"):
        vitfast.optimize(model)
    assert [isinstance(b, FusedBlock) for b in model.blocks] == [True, False, True]


@pytest.mark.parametrize("name", [*VARIANTS, "feature-maps-every-token"])
def test_every_block_of_vitfasts_own_models_is_fused_without_a_warning(device, name):
    model = vitfast.create_model(VARIANTS.get(name, EVERY_TOKEN)).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VitfastWarning)
        vitfast.optimize(model)
    assert all(isinstance(b, FusedBlock) for b in model.blocks)


def test_no_gpu_and_no_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(vitfast.VitfastError, match="needs a CUDA GPU.*TRITON_INTERPRET=1"):
        vitfast.optimize(vitfast.create_model(tiny_config()))



def test_torch_without_triton_op_is_a_clear_error(monkeypatch):
    """torch < 2.6 has no torch.library.triton_op: one line naming the version, not an ImportError from the kernels."""
    monkeypatch.delattr(torch.library, "triton_op", raising=False)  # absent already on such a torch
    with pytest.raises(vitfast.VitfastError, match=r"needs torch 2\.6 or newer.*this is torch"):
        vitfast.optimize(vitfast.create_model(tiny_config()))

def test_cuda_graphs_need_a_gpu_model(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a CPU model may be optimized; on a GPU machine it would be told to move
    with pytest.raises(vitfast.VitfastError, match="cuda_graphs needs the model on a CUDA GPU"):
        vitfast.optimize(vitfast.create_model(tiny_config()), cuda_graphs=True)


def test_optimize_refuses_other_modules():
    """Another ViT's blocks (timm's VisionTransformer keeps them in an nn.Sequential too) are not vitfast's: refused, where
    it once returned the model with nothing fused and no word."""

    class TimmLike(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.Sequential(torch.nn.TransformerEncoderLayer(64, 4, 256, batch_first=True))

    for model in (torch.nn.Linear(2, 2), TimmLike()):
        with pytest.raises(vitfast.VitfastError, match=f"takes a vitfast VisionTransformer, got {type(model).__name__}: "
                                                       "load timm or Hugging Face weights with vitfast.load_checkpoint"):  # fmt: skip
            vitfast.optimize(model)


# ---------------------------------------------------------------------------- GPU only
def _require_cuda(device):
    if device != "cuda":
        pytest.skip("needs a CUDA GPU (run with VITFAST_TEST_DEVICE=cuda)")


@pytest.mark.gpu
@pytest.mark.parametrize("mlp", ["auto", "epilogue", "bias_gelu"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["vit_small_patch16_224", "aimv2_large_patch14_224", "vit_base_patch16_dinov3", "eva02_base_patch14_448"])
def test_gpu_low_precision_model_parity(device, dtype, mlp, name):
    """The optimized model in fp16/bf16 errs at most 2x the eager model in the same dtype vs fp32. "bias_gelu":
    fc1's table-only path (cuBLAS without the bias, then the bias+GELU kernel's erfc form), as an entry would pick it."""
    _require_cuda(device)
    cfg = vitfast.get_config(name, num_classes=100, depth=min(vitfast.get_config(name).depth, 12))
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = torch.randn(8, 3, *cfg.img_hw, device=device)
    with torch.no_grad():
        exact = model(x).double()
        model.to(dtype)
        eager_err = (model(x.to(dtype)).double() - exact).abs().max().item()
        vitfast.optimize(model, mlp="auto" if mlp == "bias_gelu" else mlp)
        if mlp == "bias_gelu":
            for block in model.blocks:
                block.measured = {dtype: ((256, "bias_gelu", "cublas", "bias_gelu", "cublas"),)}
        fused_err = (model(x.to(dtype)).double() - exact).abs().max().item()
    assert fused_err <= 2 * eager_err + (1e-2 if dtype == torch.float16 else 5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["vit_base_patch16_224", "vit_large_patch16_224"])
def test_gpu_approximate_gelu_parity(device, dtype, name):
    """GELU's tanh form in fc1's cuBLASLt epilogue (optimize(approximate_gelu=True)) on an erf-GELU ViT: its
    fp16/bf16 logits err at most 2x the eager erf model's in the same dtype, both against the fp32 erf model.
    Wide inputs (3x randn) put activations where the forms differ most."""
    _require_cuda(device)
    cfg = vitfast.get_config(name, num_classes=100)
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = 3 * torch.randn(8, 3, *cfg.img_hw, device=device)
    with torch.no_grad():
        exact = model(x).double()
        model.to(dtype)
        eager_err = (model(x.to(dtype)).double() - exact).abs().max().item()
        fused_err = (vitfast.optimize(model, mlp="cublas", approximate_gelu=True)(x.to(dtype)).double() - exact).abs().max().item()
    assert fused_err <= 2 * eager_err + (1e-2 if dtype == torch.float16 else 5e-2), (fused_err, eager_err)


@pytest.mark.gpu
@pytest.mark.parametrize("mlp", ["auto", "epilogue"])
def test_gpu_cuda_graphs_and_torch_compile(device, mlp):
    _require_cuda(device)
    model = randomize(vitfast.create_model(tiny_config())).to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    with torch.no_grad():
        ref, ref2 = model(x), model(2 * x)
        vitfast.optimize(model, cuda_graphs=True, mlp=mlp)
        torch.testing.assert_close(model(x), ref, atol=1e-4, rtol=1e-4)  # first call captures
        torch.testing.assert_close(model(2 * x), ref2, atol=1e-4, rtol=1e-4)  # replay with new data
        vitfast.restore(model)
        compiled = torch.compile(vitfast.optimize(model, mlp=mlp))
        torch.testing.assert_close(compiled(x), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_gpu_tma_gemm_in_cuda_graphs(device):
    """On Hopper the epilogue path's fc1 (and the last block's fc2) run the persistent TMA GEMM, whose launch
    allocates its descriptors' scratch memory: it must launch (read off the recorded launches), and a CUDA
    graph of the fp16 forward, captured and replayed on new data, must give what the eager forward gives."""
    from vitfast.kernels.precompile import recording

    _require_cuda(device)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the TMA GEMM needs compute capability 9.0 (Hopper) or newer")
    model = randomize(vitfast.create_model(tiny_config())).to(device).half()
    x = torch.randn(2, 3, 32, 32, device=device, dtype=torch.float16)
    with torch.no_grad():
        vitfast.optimize(model, mlp="epilogue")
        with recording() as calls:
            model(x)
        assert "_linear_epilogue_tma_kernel" in {c.jit.__name__ for c in calls}
        eager, eager2 = model(x), model(2 * x)
        vitfast.restore(model)
        vitfast.optimize(model, mlp="epilogue", cuda_graphs=True)
        torch.testing.assert_close(model(x), eager, atol=1e-3, rtol=1e-3)  # first call captures
        torch.testing.assert_close(model(2 * x), eager2, atol=1e-3, rtol=1e-3)  # replay with new data


# ---------------------------------------------------------------------------- calls the kernels cannot serve
def kernel_launches(model, x) -> int:
    """The vitfast ops one forward of `model` runs (0 when every block took the reference math)."""
    with LaunchCounter() as counter, torch.no_grad():
        model(x)
    return sum(op.startswith("vitfast.") for op in counter.ops)  # str() of torch.ops.vitfast.<name>.default


def test_autograd_through_an_optimized_model_gives_the_reference_gradients(device):
    """The kernels have no backward: with autograd on, an optimized model in eval mode runs the reference math (and
    says so once), so every parameter and the input get the gradients of the unoptimized model."""
    cfg = tiny_config(init_values=0.1, reg_tokens=1)
    reference = randomize(vitfast.create_model(cfg)).to(device).eval()
    model = vitfast.optimize(copy.deepcopy(reference), mlp="cublas")
    x = torch.randn(2, 3, *cfg.img_hw, device=device)
    grads = []
    for m in (reference, model):
        xg = x.clone().requires_grad_(True)
        m.zero_grad(set_to_none=True)
        m(xg).square().sum().backward()
        grads.append({"input": xg.grad, **{k: p.grad for k, p in m.named_parameters()}})
    with pytest.warns(VitfastWarning, match="autograd on"):
        model(x)
    assert all(g is not None for g in grads[1].values()), [k for k, g in grads[1].items() if g is None]
    for k, g in grads[0].items():
        torch.testing.assert_close(grads[1][k], g, atol=1e-5, rtol=1e-4, msg=k)
    assert kernel_launches(model, x) > 0  # under no_grad the kernels run again


def test_hooks_on_an_optimized_blocks_layers_fire_and_block_hooks_see_tensors(device):
    """A forward hook on a layer inside a fused block (attention rollout, activation statistics) or on the patch
    convolution fires as in the reference model, with the same values; a hook on a block gets a tensor, never the
    (x, next norm1(x)) pair."""
    cfg = tiny_config(depth=3)
    reference = randomize(vitfast.create_model(cfg)).to(device).eval()
    model = vitfast.optimize(copy.deepcopy(reference), mlp="cublas")
    x = torch.randn(2, 3, *cfg.img_hw, device=device)
    seen = {}
    for tag, m in (("ref", reference), ("opt", model)):
        m.blocks[1].mlp.fc1.register_forward_hook(lambda mod, args, out, tag=tag: seen.setdefault((tag, "fc1"), out))
        m.blocks[0].register_forward_hook(lambda mod, args, out, tag=tag: seen.setdefault((tag, "block0"), out))
        m.patch_embed.proj.register_forward_hook(lambda mod, args, out, tag=tag: seen.setdefault((tag, "patches"), out))
        with torch.no_grad():
            seen[(tag, "logits")] = m(x)
    assert isinstance(seen[("opt", "block0")], torch.Tensor)
    for what in ("fc1", "block0", "patches", "logits"):
        torch.testing.assert_close(seen[("opt", what)], seen[("ref", what)], atol=1e-4, rtol=1e-4, msg=what)


class LoRALinear(torch.nn.Linear):
    """An nn.Linear subclass with a low-rank adapter added to its output, as PEFT and loralib insert them."""

    def __init__(self, linear: torch.nn.Linear, rank: int = 2):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.load_state_dict(linear.state_dict())
        self.down = torch.nn.Parameter(torch.randn(rank, linear.in_features) * 0.3)
        self.up = torch.nn.Parameter(torch.randn(linear.out_features, rank) * 0.3)

    def forward(self, x):
        return super().forward(x) + x @ self.down.t() @ self.up.t()


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("change", ["lora-qkv", "lora-fc1", "relu-mlp", "gelu-swiglu"])
def test_layers_the_kernels_do_not_compute_are_never_read_past(device, change, when):
    """A layer the fused forward would read the weights of instead of calling (an adapter on a Linear, another
    activation) keeps the block on the reference math, whether it was there before optimize() or put in after;
    restore() keeps the layer."""
    cfg = tiny_config(depth=2, **(dict(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=3) if change == "gelu-swiglu" else {}))
    model = randomize(vitfast.create_model(cfg)).to(device).eval()
    x = torch.randn(2, 3, *cfg.img_hw, device=device)

    def apply(m):
        block = m.blocks[0]
        if change.startswith("lora"):
            owner, name = (block.attn, "qkv") if change == "lora-qkv" else (block.mlp, "fc1")
            setattr(owner, name, LoRALinear(getattr(owner, name)).to(device))
        else:
            block.mlp.act = torch.nn.ReLU() if change == "relu-mlp" else torch.nn.GELU()

    if when == "before":
        apply(model)
    with torch.no_grad():
        if when == "before":
            expected = model(x)
        vitfast.optimize(model, mlp="epilogue")
        if when == "after":
            apply(model)
            expected = vitfast.restore(copy.deepcopy(model))(x)
        torch.testing.assert_close(model(x), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mlp", ["auto", "epilogue"])
@pytest.mark.parametrize("name", ["plain", "aimv2-rmsnorm-swiglu-no-bias", "dinov3-rope-registers-layer-scale"])
def test_an_fp32_model_under_autocast_follows_it(device, name, mlp):
    """torch.autocast(float16) casts F.linear's operands, which the Triton GEMMs (one dtype each) cannot follow: the MLP
    and projections take the cuBLAS path there, whatever `mlp` says, where mlp="epilogue" once failed the GEMM launcher's
    dtype check. Same output dtype as the reference under autocast, and the 2x rule against the float64 model."""
    cfg = VARIANTS[name]
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = torch.randn(2, 3, *cfg.img_hw, device=device)
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(x.double())
        with torch.autocast(device, dtype=torch.float16):
            ref = model(x)
            out = vitfast.optimize(model, mlp=mlp)(x)
    assert out.dtype == ref.dtype
    assert (out.double() - exact).abs().max() <= 2 * (ref.double() - exact).abs().max() + 1e-2


def test_float64_runs_the_reference_math_and_says_so(device):
    cfg = tiny_config()
    model = randomize(vitfast.create_model(cfg)).to(device).eval().double()
    x = torch.randn(2, 3, *cfg.img_hw, device=device, dtype=torch.float64)
    with torch.no_grad():
        expected = model(x)
        vitfast.optimize(model)
        with pytest.warns(VitfastWarning, match="float64"):
            torch.testing.assert_close(model(x), expected, atol=0, rtol=0)


def test_bf16_on_cpu_under_the_interpreter_matches_the_bf16_model():
    """The Triton interpreter gets bf16 wrong (tl.dot, casts): a bf16 model on CPU takes the ops' reference math."""
    cfg = tiny_config(init_values=0.1)
    model = randomize(vitfast.create_model(cfg)).eval().to(torch.bfloat16)
    x = torch.randn(2, 3, *cfg.img_hw, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x).float()
        got = vitfast.optimize(model)(x).float()
    torch.testing.assert_close(got, expected, atol=0.05, rtol=0.05)


def test_a_fullgraph_compile_with_autograd_on_traces_the_reference_math(device):
    """torch.compile(optimize(m), fullgraph=True) called with grad enabled compiles the reference math (no warning
    inside the trace, which would break the graph) and gives the reference model's gradients."""
    cfg = tiny_config()
    reference = randomize(vitfast.create_model(cfg)).to(device).eval()
    model = vitfast.optimize(copy.deepcopy(reference))
    x = torch.randn(2, 3, *cfg.img_hw, device=device)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled(x).sum().backward()
    reference(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
