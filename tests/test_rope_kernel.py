"""kernels/rope.py: the rotary position embedding of q and k in the packed qkv, in both layouts
(DINOv3's rotate-half, EVA-02 / timm's interleaved), against a float64 reference with the 2x rule
(the kernel's error at most twice plain PyTorch's at the same precision, plus a small atol; see
tests/test_kernels.py). Outputs are poisoned with NaN before every launch; v and the prefix tokens'
q and k must come out bit for bit. The rotate-half reference is checked against transformers' own
`apply_rotary_pos_emb`; the interleaved one, and the kernel, against each pair (x[2j], x[2j + 1])
turned as a complex number in float64.

On CPU the kernel runs under TRITON_INTERPRET=1, which truncates fp32->bf16 casts, so bf16 is
checked on the GPU only (the `dtype` fixture of tests/test_kernels.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'vitfast[triton]')")
import test_kernels  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_kernel_limits import far_apart  # noqa: E402
from conftest import traced_vitfast_ops  # noqa: E402
from test_kernels import check_2x, poisoned  # noqa: E402

from vitfast.errors import InputError  # noqa: E402
from vitfast.kernels import attention  # noqa: E402,F401  (registers fused_attention for the tracing test)
from vitfast.kernels import rope  # noqa: E402

dtype = test_kernels.dtype  # the fp32 / fp16 / bf16 fixture (bf16 skipped under the interpreter, with the reason)
BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


@pytest.fixture(params=[False, True], ids=["half", "interleaved"])
def interleaved(request) -> bool:
    """The layout: DINOv3's rotate-half, or EVA-02 / timm's interleaved pairs."""
    return request.param


def tables(Np: int, D: int, dtype: torch.dtype, device, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [Np, D] of random angles, in dtype: a rotation of each pair of the layout, as RoPE's tables
    are ([a0, a1, ..., a0, a1, ...] for rotate-half's (d, d + D/2) pairs, [a0, a0, a1, a1, ...] interleaved)."""
    angles = 4 * torch.randn(Np, D // 2, device=device)
    angles = angles.repeat_interleave(2, dim=1) if interleaved else angles.repeat(1, 2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def assert_copied(out: torch.Tensor, qkv: torch.Tensor, Np: int) -> None:
    """v, and q and k of the tokens before the last Np, bit for bit."""
    prefix = qkv.shape[1] - Np
    for o, x in ((out[:, :, 2], qkv[:, :, 2]), (out[:, :prefix, :2], qkv[:, :prefix, :2])):
        assert torch.equal(o.view(BITS[o.dtype]), x.view(BITS[x.dtype])), "v or a prefix token's q / k changed"


def run_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype, interleaved: bool = False) -> torch.Tensor:
    out = poisoned(qkv.shape, dtype, qkv.device)
    assert rope.rope_qkv_launch(qkv, cos, sin, out, interleaved) is out
    exact = rope.rope_reference(qkv.double(), cos.double(), sin.double(), interleaved)  # same rounded inputs, exact arithmetic
    check_2x(out, rope.rope_reference(qkv, cos, sin, interleaved), exact, dtype)
    assert_copied(out, qkv, cos.shape[0])
    return out


@pytest.mark.parametrize("tables_dtype", ["fp32", "qkv"])
@pytest.mark.parametrize("B, N, Np, H, D", [
    (2, 21, 16, 3, 64),  # class + 4 register tokens
    (1, 17, 16, 6, 2),  # class token only; head_dim 2
    (2, 9, 9, 12, 80),  # no prefix tokens; head_dim 80 (a masked tile)
    (1, 6, 5, 3, 128),
    (3, 1, 1, 2, 64),  # one token
    (1, 13, 8, 20, 64),  # DINOv3's 20 heads
    (2, 5, 0, 3, 8),  # no patch tokens: a copy
    (1, 201, 196, 12, 64),  # DINOv3 ViT-B/16 at 224 px: 1 + 4 + 196 tokens
])  # fmt: skip
def test_rope_odd_shapes(device, dtype, interleaved, B, N, Np, H, D, tables_dtype):
    cos, sin = tables(Np, D, torch.float32 if tables_dtype == "fp32" else dtype, device, interleaved)
    run_rope(torch.randn(B, N, 3, H, D, device=device).to(dtype), cos, sin, dtype, interleaved)


def test_rope_reads_strided_qkv_and_tables(device, dtype, interleaved):
    """qkv as the Linear output sliced along batch, tokens and columns, or with the head dim strided
    (heads innermost); cos / sin transposed (copied first)."""
    B, N, Np, H, D = 2, 12, 9, 3, 48
    full = torch.randn(2 * B, N + 3, 3 * H * D + 16, device=device).to(dtype)
    sliced = full[::2, 3:, 8 : 8 + 3 * H * D].unflatten(-1, (3, H, D))
    heads_inner = torch.randn(B, N, 3, D, H, device=device).to(dtype).transpose(-1, -2)
    cos, sin = tables(Np, D, dtype, device, interleaved)
    for qkv in (sliced, heads_inner):
        assert not qkv.is_contiguous()
        run_rope(qkv, cos, sin, dtype, interleaved)
    run_rope(sliced, cos.t().contiguous().t(), sin.t().contiguous().t(), dtype, interleaved)


def test_rope_copies_v_and_prefix_tokens_bit_for_bit(device, dtype, interleaved):
    """-0, infinities, NaN and subnormals in v and the prefix tokens' q / k come out unchanged (a
    multiply by 1 and add of 0 would turn -0 into +0 and inf * 0 into NaN)."""
    B, N, Np, H, D = 2, 7, 4, 3, 16
    special = torch.tensor([-0.0, 0.0, float("inf"), float("-inf"), float("nan"), torch.finfo(dtype).tiny / 4, -1.5])
    qkv = torch.randn(B, N, 3, H, D, device=device).to(dtype)
    qkv[:, :, 2] = special[torch.randint(len(special), (B, N, H, D))].to(device=device, dtype=dtype)
    qkv[:, : N - Np, :2] = special[torch.randint(len(special), (B, N - Np, 2, H, D))].to(device=device, dtype=dtype)
    cos, sin = tables(Np, D, torch.float32, device, interleaved)
    out = poisoned(qkv.shape, dtype, device)
    rope.rope_qkv_launch(qkv, cos, sin, out, interleaved)
    assert_copied(out, qkv, Np)
    exact = rope.rope_reference(qkv.double(), cos.double(), sin.double(), interleaved)
    patches = slice(N - Np, None)
    check_2x(out[:, patches, :2], rope.rope_reference(qkv, cos, sin, interleaved)[:, patches, :2], exact[:, patches, :2], dtype)


@pytest.mark.parametrize("tables_dtype", ["fp32", "qkv"])
def test_rope_rounds_once(device, dtype, interleaved, tables_dtype):
    """Computed in fp32 and rounded once: in fp16 / bf16 the rotated q and k are the exact result
    rounded to the dtype, but for the rare element that fp32's own error tips over a rounding
    boundary (0.02 % here). Rounding the products on the way (as plain PyTorch in fp16 does with
    DINOv3's fp16 cos / sin), or fp32 cos / sin to the dtype first, misses a third of them or more;
    the 2x rule's atol would not see it."""
    if dtype == torch.float32:
        pytest.skip("fp32 is the kernel's compute precision: there is no second rounding to catch")
    B, N, Np, H, D = 2, 40, 36, 4, 64
    qkv = torch.randn(B, N, 3, H, D, device=device).to(dtype)
    cos, sin = tables(Np, D, torch.float32 if tables_dtype == "fp32" else dtype, device, interleaved)
    out = poisoned(qkv.shape, dtype, device)
    rope.rope_qkv_launch(qkv, cos, sin, out, interleaved)
    once = rope.rope_reference(qkv.double(), cos.double(), sin.double(), interleaved).to(dtype)
    patches = slice(N - Np, None)
    assert (out[:, patches, :2] != once[:, patches, :2]).double().mean().item() < 0.01


def test_rope_op_matches_launcher(device, interleaved):
    qkv = torch.randn(2, 11, 3, 4, 32, device=device)
    cos, sin = tables(10, 32, torch.float32, device, interleaved)
    out = poisoned(qkv.shape, torch.float32, device)
    result = rope.rope_qkv(qkv, cos, sin, interleaved)
    assert torch.equal(result, rope.rope_qkv_launch(qkv, cos, sin, out, interleaved))
    assert result.is_contiguous() and result.data_ptr() != qkv.data_ptr()
    if not interleaved:  # the three-argument call (DINOv3's) keeps the rotate-half layout
        assert torch.equal(rope.rope_qkv(qkv, cos, sin), result)


@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 2), N=st.integers(1, 40), prefix=st.integers(0, 5), H=st.integers(1, 5), half=st.integers(1, 70),
       interleaved=st.booleans())  # fmt: skip
def test_rope_property(B, N, prefix, H, half, interleaved):
    import os

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    Np = max(N - prefix, 0)
    cos, sin = tables(Np, 2 * half, torch.float32, device, interleaved)
    run_rope(torch.randn(B, N, 3, H, 2 * half, device=device), cos, sin, torch.float32, interleaved)


# ---------------------------------------------------------------------------- the interleaved layout (EVA-02, timm)
def complex_rotation(qkv: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """timm's interleaved RoPE as what it means, in float64: in each head, pair j of q and k of the
    last Np tokens, x[2j] + i x[2j + 1], times exp(i angles[t, j]); v and the prefix tokens as they are."""
    N, Np, D = qkv.shape[1], angles.shape[0], qkv.shape[-1]
    out = qkv.double().clone()
    pairs = torch.view_as_complex(out[:, N - Np :, :2].unflatten(-1, (D // 2, 2)).contiguous())
    turned = pairs * torch.polar(torch.ones_like(angles), angles)[:, None, None, :]  # [Np, 1, 1, D/2] over q / k and heads
    out[:, N - Np :, :2] = torch.view_as_real(turned).flatten(-2)
    return out


@pytest.mark.parametrize("B, N, Np, H, D", [(2, 197, 196, 12, 64), (3, 13, 9, 3, 72), (1, 6, 6, 2, 2)])
def test_rope_interleaved_turns_each_pair_as_a_complex_number(device, dtype, B, N, Np, H, D):
    """The kernel and the reference in the interleaved layout against the complex rotation of each
    (x[2j], x[2j + 1]) pair by its angle: the reference (float64 tables) to float64 precision, the
    kernel (fp32 tables, as EVA-02's) by the 2x rule."""
    angles = 4 * torch.randn(Np, D // 2, device=device, dtype=torch.float64)
    columns = angles.repeat_interleave(2, dim=1)  # timm's per-pair values repeated: [a0, a0, a1, a1, ...]
    qkv = torch.randn(B, N, 3, H, D, device=device).to(dtype)
    exact = complex_rotation(qkv, angles)
    torch.testing.assert_close(rope.rope_reference(qkv.double(), columns.cos(), columns.sin(), interleaved=True), exact, rtol=0, atol=1e-12)
    cos, sin = columns.cos().float(), columns.sin().float()
    out = poisoned(qkv.shape, dtype, device)
    rope.rope_qkv_launch(qkv, cos, sin, out, interleaved=True)
    check_2x(out, rope.rope_reference(qkv, cos, sin, interleaved=True), exact, dtype)
    assert_copied(out, qkv, Np)


def test_rope_layout_flag_is_honoured(device, dtype):
    """The same qkv and tables give different q, k in the two layouts (through the launcher and the
    op), and each matches its own reference: the flag is not ignored on either path."""
    B, N, Np, H, D = 2, 9, 8, 3, 16
    qkv = torch.randn(B, N, 3, H, D, device=device).to(dtype)
    cos, sin = tables(Np, D, torch.float32, device)
    patches = slice(N - Np, None)
    outs = {}
    for interleaved in (False, True):
        outs[interleaved] = run_rope(qkv, cos, sin, dtype, interleaved)
        assert torch.equal(rope.rope_qkv(qkv, cos, sin, interleaved), outs[interleaved])
    assert (outs[True][:, patches, :2].float() - outs[False][:, patches, :2].float()).abs().amax() > 0.5


# ---------------------------------------------------------------------------- transformers' DINOv3
def dinov3_modeling():
    return pytest.importorskip("transformers.models.dinov3_vit.modeling_dinov3_vit",
                               reason="this transformers has no DINOv3 (transformers.models.dinov3_vit)")  # fmt: skip


def dinov3_tables(H: int, D: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [196, D] as DINOv3's own RoPE module makes them at 224 px (patch 16), in dtype."""
    modeling = dinov3_modeling()
    config = modeling.DINOv3ViTConfig(hidden_size=H * D, num_attention_heads=H, patch_size=16, image_size=224)
    return modeling.DINOv3ViTRopePositionEmbedding(config)(torch.zeros(1, 3, 224, 224, dtype=dtype))


@pytest.mark.parametrize("reference_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_rope_reference_is_transformers_apply_rotary_pos_emb(reference_dtype):
    """On q, k as [B, H, N, D] views, with DINOv3's own cos / sin (1 class + 4 register tokens):
    the same numbers, bit for bit, in each dtype."""
    modeling = dinov3_modeling()
    H, D = 6, 64
    cos, sin = dinov3_tables(H, D, reference_dtype)
    qkv = torch.randn(2, 1 + 4 + cos.shape[0], 3, H, D).to(reference_dtype)
    q, k = modeling.apply_rotary_pos_emb(qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2), cos, sin)
    out = rope.rope_reference(qkv, cos, sin)
    assert torch.equal(out[:, :, 0].transpose(1, 2), q) and torch.equal(out[:, :, 1].transpose(1, 2), k)
    assert torch.equal(out[:, :, 2], qkv[:, :, 2])


def test_rope_kernel_on_dinov3_tables(device, dtype):
    """The kernel with DINOv3's cos / sin against transformers' function (the 2x rule, transformers
    being plain PyTorch at qkv's precision), ViT-B's 12 heads."""
    modeling = dinov3_modeling()
    H, D = 12, 64
    cos, sin = (t.to(device) for t in dinov3_tables(H, D, dtype))
    qkv = torch.randn(1, 1 + 4 + cos.shape[0], 3, H, D, device=device).to(dtype)
    q, k = modeling.apply_rotary_pos_emb(qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2), cos, sin)
    out = rope.rope_qkv(qkv, cos, sin)
    exact = rope.rope_reference(qkv.double(), cos.double(), sin.double())
    check_2x(out[:, :, :2], torch.stack((q, k), 1).permute(0, 3, 1, 2, 4), exact[:, :, :2], dtype)
    assert_copied(out, qkv, cos.shape[0])


# ---------------------------------------------------------------------------- errors and limits
def test_rope_rejects_bad_input(device):
    qkv, cos = torch.randn(1, 4, 3, 2, 8, device=device), torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match=r"qkv of shape \[B, N, 3, H, D\], got \(1, 4, 48\)"):
        rope.rope_qkv(qkv.flatten(2), cos, cos)
    for interleaved in (False, True):
        with pytest.raises(ValueError, match=r"head_dim must be even, got 7 \(qkv \(1, 4, 3, 2, 7\)\)"):
            rope.rope_qkv(qkv[..., :7], cos[:, :7], cos[:, :7], interleaved)
    shape_error = r"cos and sin must both be \[Np, 8\] with Np <= N = 4 for qkv \(1, 4, 3, 2, 8\), got cos \({}\) and sin \({}\)"
    for c, s in ((torch.randn(5, 8), torch.randn(5, 8)), (torch.randn(4, 6), torch.randn(4, 6)), (cos.cpu(), torch.randn(3, 8)),
                 (torch.randn(32), torch.randn(32))):  # fmt: skip
        shapes = [", ".join(map(str, t.shape)) + ("," if t.ndim == 1 else "") for t in (c, s)]
        with pytest.raises(ValueError, match=shape_error.format(*shapes)):
            rope.rope_qkv(qkv, c.to(device), s.to(device))
    with pytest.raises(ValueError, match="cos and sin must both be torch.float32 or qkv's torch.float16, got torch.float64"):
        rope.rope_qkv(qkv.half(), cos.double(), cos.double())
    with pytest.raises(ValueError, match="supports fp16/bf16/fp32 qkv, got torch.float64"):
        rope.rope_qkv_launch(qkv.double(), cos, cos, torch.empty_like(qkv).double())
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.float32 tensor of shape \(1, 4, 3, 2, 8\)"):
        rope.rope_qkv_launch(qkv, cos, cos, torch.empty(8, 2, 3, 4, 1, device=device).permute(4, 3, 2, 1, 0))


def test_rope_batch_offsets_past_2_31(device):
    """Images 2^31 - 1 elements apart (image 2 at 2^32 - 2): the row offsets are 64-bit."""
    qkv = far_apart((3, 7, 3, 2, 16), device)
    cos, sin = tables(5, 16, torch.float32, device)
    run_rope(qkv, cos, sin, torch.float16)


def test_rope_in_row_offsets_that_stay_32_bit_are_guarded():
    """One token's q / k / v stay in 32-bit offsets: a layout past that is refused (meta tensors: nothing allocated)."""
    qkv = torch.empty(1, 4, 3, 2, 16, device="meta").as_strided((1, 4, 3, 2, 16), (10, 2**30, 2**30, 16, 1))
    cos = torch.empty(4, 16, device="meta")
    with pytest.raises(InputError, match=r"one token's qkv \(3, 2, 16\) spans 2\^31 elements"):
        rope.rope_qkv_launch(qkv, cos, cos, torch.empty(1, 4, 3, 2, 16, device="meta"))


# ---------------------------------------------------------------------------- tracing
def test_rope_then_attention_trace_as_one_graph(device, interleaved):
    """What a RoPE block runs between its qkv GEMM and its projection: rope_qkv then fused_attention,
    one graph with no break; torch.compile(fullgraph=True) and torch.export match eager. On CPU the
    traced ops take their reference math (fake tensors), eager runs the kernels."""
    B, N, Np, H, D = 2, 13, 8, 3, 32
    cos, sin = tables(Np, D, torch.float32, device, interleaved)
    ops = torch.ops.vitfast

    def block(qkv):
        return ops.fused_attention(ops.rope_qkv(qkv, cos, sin, interleaved), D**-0.5)

    qkv = torch.randn(B, N, 3 * H * D, device=device).unflatten(-1, (3, H, D))
    assert traced_vitfast_ops(block, qkv, block(qkv), device) == {"vitfast.rope_qkv.default", "vitfast.fused_attention.default"}
