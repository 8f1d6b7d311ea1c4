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


@pytest.mark.parametrize("name", list(VARIANTS))
def test_optimized_logits_match_reference(device, name):
    cfg = VARIANTS[name]
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = torch.randn(3, 3, *cfg.img_hw, device=device)
    params_before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    with torch.no_grad():
        ref = model(x)
        vitfast.optimize(model)
        assert any(isinstance(b, FusedBlock) for b in model.blocks)
        assert {k: v.data_ptr() for k, v in model.state_dict().items()} == params_before  # shared, not copied
        out = model(x)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        assert torch.equal(out.argmax(-1), ref.argmax(-1))
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
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_low_precision_model_parity(device, dtype):
    """The optimized model in fp16/bf16 errs at most 2x the eager model in the same dtype vs fp32."""
    _require_cuda(device)
    cfg = vitfast.get_config("vit_small_patch16_224", num_classes=100)
    model = randomize(vitfast.create_model(cfg)).to(device)
    x = torch.randn(8, 3, 224, 224, device=device)
    with torch.no_grad():
        exact = model(x).double()
        model.to(dtype)
        eager_err = (model(x.to(dtype)).double() - exact).abs().max().item()
        fused_err = (vitfast.optimize(model)(x.to(dtype)).double() - exact).abs().max().item()
    assert fused_err <= 2 * eager_err + (1e-2 if dtype == torch.float16 else 5e-2)


@pytest.mark.gpu
def test_gpu_cuda_graphs_and_torch_compile(device):
    _require_cuda(device)
    model = randomize(vitfast.create_model(tiny_config())).to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    with torch.no_grad():
        ref, ref2 = model(x), model(2 * x)
        vitfast.optimize(model, cuda_graphs=True)
        torch.testing.assert_close(model(x), ref, atol=1e-4, rtol=1e-4)  # first call captures
        torch.testing.assert_close(model(2 * x), ref2, atol=1e-4, rtol=1e-4)  # replay with new data
        vitfast.restore(model)
        compiled = torch.compile(vitfast.optimize(model))
        torch.testing.assert_close(compiled(x), ref, atol=1e-4, rtol=1e-4)
