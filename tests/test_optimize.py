"""`vitfast.optimize` / `restore` on whole models (Triton interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'vitfast[triton]')")

import vitfast  # noqa: E402
from conftest import randomize, tiny_config  # noqa: E402
from vitfast.fused import FusedBlock  # noqa: E402

VARIANTS = {
    "plain": tiny_config(),
    "tanh-no-qkv-bias": tiny_config(act_layer="gelu_tanh", qkv_bias=False, embed_dim=48, num_heads=3),
    "distilled": tiny_config(distilled=True),
    "layer-scale-registers-avg": tiny_config(init_values=0.1, reg_tokens=2, class_token=False, global_pool="avg", no_embed_class=True),
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


@pytest.mark.parametrize("name", list(VARIANTS))
def test_optimized_logits_match_reference(device, name):
    model, x, ref = optimize_and_compare(VARIANTS[name], device)
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
        model(torch.randn(1, 3, 32, 32, device=device))
    assert len(calls) == tiny_config().depth


@pytest.mark.parametrize("name", ["plain", "tanh-no-qkv-bias", "layer-scale-registers-avg"])
def test_epilogue_mlp_path_matches_reference(device, name, monkeypatch):
    """mlp="epilogue": fc1 + bias + GELU and fc2 + bias (+ LayerScale) + residual as Triton GEMM
    epilogues; same logits and top-1 as the reference, restore bit-identical."""
    from vitfast.kernels import bias_gelu, linear_epilogue

    calls = {"epilogue": 0, "bias_gelu": 0}
    real_epilogue, real_bias_gelu = linear_epilogue.linear_epilogue_launch, bias_gelu.bias_gelu_launch
    monkeypatch.setattr(linear_epilogue, "linear_epilogue_launch", lambda *a, **k: calls.__setitem__("epilogue", calls["epilogue"] + 1) or real_epilogue(*a, **k))
    monkeypatch.setattr(bias_gelu, "bias_gelu_launch", lambda *a, **k: calls.__setitem__("bias_gelu", calls["bias_gelu"] + 1) or real_bias_gelu(*a, **k))
    cfg = VARIANTS[name]
    model, x, ref = optimize_and_compare(cfg, device, mlp="epilogue")
    with torch.no_grad():
        assert calls == {"epilogue": 2 * cfg.depth, "bias_gelu": 0}  # fc1 and fc2 in every block
        vitfast.optimize(model, mlp="cublas")  # switching an optimized model's path
        torch.testing.assert_close(model(x), ref, atol=1e-4, rtol=1e-4)
        assert calls == {"epilogue": 2 * cfg.depth, "bias_gelu": cfg.depth}
        vitfast.restore(model)
        assert torch.equal(model(x), ref)  # restore is bit-identical


def test_auto_mlp_path_is_cublas_until_measured(device, monkeypatch):
    """The default: no committed GPU measurement, so "auto" runs cuBLAS + the standalone kernel."""
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
    monkeypatch.setattr(fused, "_lookup", fused._lookup.__wrapped__)  # no cache across monkeypatched tables
    cuda = torch.device("cuda")  # only a key here: nothing touches CUDA
    assert fused.choose_mlp_paths("auto", cuda, torch.float16, 768, 3072, 64 * 197) == ("epilogue", "cublas")  # 16384 -> 65536
    assert fused.choose_mlp_paths("auto", cuda, torch.float16, 768, 3072, 197) == ("cublas", "cublas")
    assert fused.choose_mlp_paths("auto", cuda, torch.bfloat16, 768, 3072, 64 * 197) == ("cublas", "cublas")  # not measured
    assert fused.choose_mlp_paths("auto", cuda, torch.float16, 384, 1536, 64 * 197) == ("cublas", "cublas")
    assert fused.choose_mlp_paths("epilogue", cuda, torch.float16, 384, 1536, 1) == ("epilogue", "epilogue")


def test_committed_mlp_dispatch_table_is_well_formed():
    from vitfast import fused

    fused.mlp_dispatch_table.cache_clear()
    for entry in fused.mlp_dispatch_table():
        assert {"compute_capability", "dtype", "C", "hidden", "m_bucket", "fc1", "fc2"} <= entry.keys()
        assert entry["fc1"] in ("cublas", "epilogue") and entry["fc2"] in ("cublas", "epilogue")
        assert entry["m_bucket"] == fused.m_bucket(entry["m_bucket"])


def test_unknown_mlp_path_is_a_clear_error():
    with pytest.raises(vitfast.VitfastError, match="mlp must be one of auto, cublas, epilogue"):
        vitfast.optimize(vitfast.create_model(tiny_config()), mlp="fast")


def test_attention_maps_and_training_fall_back_to_reference(device):
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


def test_custom_injected_layers_are_left_alone(device):
    class MyAttention(vitfast.layers.Attention):
        pass

    model = vitfast.VisionTransformer(tiny_config(), attn_layer=MyAttention).eval().to(device)
    vitfast.optimize(model)
    assert not any(isinstance(b, FusedBlock) for b in model.blocks)


def test_no_gpu_and_no_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(vitfast.VitfastError, match="needs a CUDA GPU.*TRITON_INTERPRET=1"):
        vitfast.optimize(vitfast.create_model(tiny_config()))


def test_cuda_graphs_need_a_gpu_model():
    with pytest.raises(vitfast.VitfastError, match="cuda_graphs=True needs the model on a CUDA GPU"):
        vitfast.optimize(vitfast.create_model(tiny_config()), cuda_graphs=True)


def test_optimize_refuses_other_modules():
    with pytest.raises(vitfast.VitfastError, match="takes a vitfast VisionTransformer"):
        vitfast.optimize(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------------------- GPU only
def _require_cuda(device):
    if device != "cuda":
        pytest.skip("needs a CUDA GPU (run with VITFAST_TEST_DEVICE=cuda)")


@pytest.mark.gpu
@pytest.mark.parametrize("mlp", ["auto", "epilogue"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_low_precision_model_parity(device, dtype, mlp):
    """The optimized model in fp16/bf16 errs at most 2x the eager model in the same dtype vs fp32."""
    _require_cuda(device)
    cfg = vitfast.get_config("vit_small_patch16_224", num_classes=100)
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = torch.randn(8, 3, 224, 224, device=device)
    with torch.no_grad():
        exact = model(x).double()
        model.to(dtype)
        eager_err = (model(x.to(dtype)).double() - exact).abs().max().item()
        fused_err = (vitfast.optimize(model, mlp=mlp)(x.to(dtype)).double() - exact).abs().max().item()
    assert fused_err <= 2 * eager_err + (1e-2 if dtype == torch.float16 else 5e-2)


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
