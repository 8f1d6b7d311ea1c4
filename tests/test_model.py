"""The reference model against an independent functional re-implementation (float64), plus
shapes, attention maps, pooling variants and input errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import vitfast
from conftest import AIMV2, randomize, tiny_config
from vitfast import InputError


def functional_vit(sd: dict, cfg: vitfast.ViTConfig, x: torch.Tensor) -> tuple[torch.Tensor, list]:
    """The ViT forward written out from the paper with raw tensor ops on a state dict."""

    def ln(v, name):
        if cfg.norm_layer == "rmsnorm":  # no centring, no bias
            return v / torch.sqrt((v**2).mean(-1, keepdim=True) + cfg.norm_eps) * sd[name + ".weight"]
        mu = v.mean(-1, keepdim=True)
        var = ((v - mu) ** 2).mean(-1, keepdim=True)
        return (v - mu) / torch.sqrt(var + cfg.norm_eps) * sd[name + ".weight"] + sd[name + ".bias"]

    def silu(v):
        return v / (1 + torch.exp(-v))

    p = cfg.patch_size
    B = x.shape[0]
    gh, gw = x.shape[2] // p, x.shape[3] // p
    # patchify by reshaping (not a conv) so the check is independent of PatchEmbed
    patches = x.reshape(B, cfg.in_chans, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, -1)
    w = sd["patch_embed.proj.weight"].reshape(cfg.embed_dim, -1)
    t = patches @ w.T + sd.get("patch_embed.proj.bias", 0)  # no bias in CLIP towers
    if "patch_embed.norm.weight" in sd:  # AIMv2: normalised patch tokens
        t = ln(t, "patch_embed.norm")
    prefix = [sd[k].expand(B, -1, -1) for k in ("cls_token", "dist_token", "reg_token") if k in sd]
    if "pos_embed" not in sd:  # DINOv3: rotary positions only
        t = torch.cat(prefix + [t], 1)
    elif cfg.no_embed_class:
        t = torch.cat(prefix + [t + sd["pos_embed"]], 1)
    else:
        t = torch.cat(prefix + [t], 1) + sd["pos_embed"]
    H, D = cfg.num_heads, cfg.head_dim
    attns = []

    def rope(v):
        """2-D rotary embedding as complex rotations of one channel pair per frequency j, turned by coord / theta^(4j/D),
        y's coordinate for j < D/4, then x's (x's first for rope_grid_indexing "xy"). DINOv3: channels d and d + D/2 are one
        complex number, coord its patch centre in [-1, 1] times 2 pi. Axial (EVA-02): channels 2j and 2j + 1, coord its
        patch index plus rope_grid_offset, scaled to rope_ref_grid when given."""
        if cfg.rope is None:
            return v
        if cfg.rope == "dinov3":
            ys, xs = (((torch.arange(n, dtype=v.dtype) + 0.5) / n) * 2 - 1 for n in (gh, gw))
        else:
            ys, xs = ((torch.arange(n, dtype=v.dtype) + cfg.rope_grid_offset) * (r / n) for n, r in zip((gh, gw), cfg.rope_ref_grid or (gh, gw)))
        yy, xx = ys[:, None].expand(gh, gw).flatten(), xs[None, :].expand(gh, gw).flatten()
        freq = cfg.rope_base ** (-4 * torch.arange(D // 4, dtype=v.dtype) / D)
        first, second = (xx, yy) if cfg.rope_grid_indexing == "xy" else (yy, xx)
        angle = torch.cat([first[:, None] * freq, second[:, None] * freq], 1) * (2 * math.pi if cfg.rope == "dinov3" else 1)
        turn = torch.polar(torch.ones(gh * gw, D // 2, dtype=v.dtype), angle)
        n0 = v.shape[2] - gh * gw
        if cfg.rope == "dinov3":
            z = torch.complex(v[:, :, n0:, : D // 2], v[:, :, n0:, D // 2 :]) * turn
            return torch.cat([v[:, :, :n0], torch.cat([z.real, z.imag], -1)], 2)
        z = torch.complex(v[:, :, n0:, 0::2], v[:, :, n0:, 1::2]) * turn
        return torch.cat([v[:, :, :n0], torch.stack([z.real, z.imag], -1).flatten(-2)], 2)

    def gelu(v):
        if cfg.act_layer == "quick_gelu":
            return v / (1 + torch.exp(-1.702 * v))
        if cfg.act_layer == "gelu_tanh":
            return 0.5 * v * (1 + torch.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
        return 0.5 * v * (1 + torch.erf(v / math.sqrt(2)))

    if "norm_pre.weight" in sd:
        t = ln(t, "norm_pre")
    for i in range(cfg.depth):
        b = f"blocks.{i}."
        h = ln(t, b + "norm1")
        qkv = h @ sd[b + "attn.qkv.weight"].T + sd.get(b + "attn.qkv.bias", 0)
        q, k, v = (qkv[..., j * cfg.embed_dim : (j + 1) * cfg.embed_dim].reshape(B, -1, H, D).transpose(1, 2) for j in range(3))
        a = torch.softmax(rope(q) @ rope(k).transpose(-1, -2) / math.sqrt(D), -1)
        attns.append(a)
        o = (a @ v).transpose(1, 2).reshape(B, -1, cfg.embed_dim)
        if cfg.scale_attn_norm:  # EVA-02 CLIP, BEiT-3: the heads' output normalised before the projection
            o = ln(o, b + "attn.norm")
        o = o @ sd[b + "attn.proj.weight"].T + sd.get(b + "attn.proj.bias", 0)
        t = t + o * sd.get(b + "ls1.gamma", 1)
        h = ln(t, b + "norm2")
        if cfg.mlp_layer == "swiglu":  # gate and value Linears apart
            h = silu(h @ sd[b + "mlp.fc1_g.weight"].T + sd.get(b + "mlp.fc1_g.bias", 0)) * (
                h @ sd[b + "mlp.fc1_x.weight"].T + sd.get(b + "mlp.fc1_x.bias", 0))  # fmt: skip
        else:
            h = h @ sd[b + "mlp.fc1.weight"].T + sd.get(b + "mlp.fc1.bias", 0)
        if cfg.mlp_layer == "swiglu_packed":  # first half gates the second through SiLU
            h = silu(h[..., : h.shape[-1] // 2]) * h[..., h.shape[-1] // 2 :]
        elif cfg.mlp_layer == "mlp":
            h = gelu(h)
        if cfg.scale_mlp_norm:  # EVA-02 B/L, BEiT-3: the hidden activations normalised before fc2
            h = ln(h, b + "mlp.norm")
        t = t + (h @ sd[b + "mlp.fc2.weight"].T + sd.get(b + "mlp.fc2.bias", 0)) * sd.get(b + "ls2.gamma", 1)
    if "norm.weight" in sd:
        t = ln(t, "norm")
    if cfg.distilled and cfg.dist_head:
        head = lambda v, n: v @ sd[n + ".weight"].T + sd[n + ".bias"]  # noqa: E731
        return (head(t[:, 0], "head") + head(t[:, 1], "head_dist")) / 2, attns
    if cfg.global_pool == "map":  # one learned query attends over the patch tokens (all, for PE), then a residual MLP
        lin = lambda v, n: v @ sd[f"attn_pool.{n}.weight"].T + sd[f"attn_pool.{n}.bias"]  # noqa: E731
        Hp = cfg.attn_pool_num_heads or H
        Dp = cfg.embed_dim // Hp
        q = lin(sd["attn_pool.latent"], "q").reshape(1, Hp, 1, Dp)
        kv = lin(t if cfg.pool_include_prefix else t[:, cfg.num_prefix_tokens :], "kv")
        k, v = (kv[..., j * cfg.embed_dim : (j + 1) * cfg.embed_dim].reshape(B, -1, Hp, Dp).transpose(1, 2) for j in range(2))
        pooled = lin((torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(Dp), -1) @ v).reshape(B, -1), "proj")
        hidden = gelu(lin(ln(pooled, "attn_pool.norm"), "mlp.fc1"))
        pooled = pooled + lin(hidden, "mlp.fc2")
    elif cfg.global_pool == "avg":
        pooled = t[:, cfg.num_prefix_tokens :].mean(1)
    elif cfg.global_pool == "token_avg":  # DINOv2's linear classifier: class token beside the patch mean
        pooled = torch.cat([t[:, 0], t[:, cfg.num_prefix_tokens :].mean(1)], -1)
    elif cfg.global_pool == "":  # unpooled: whatever follows runs on every token
        pooled = t
    else:
        pooled = t[:, 0]
    if "fc_norm.weight" in sd:
        pooled = ln(pooled, "fc_norm")
    if "pre_logits.fc.weight" in sd:
        pooled = torch.tanh(pooled @ sd["pre_logits.fc.weight"].T + sd["pre_logits.fc.bias"])
    return (pooled @ sd["head.weight"].T + sd["head.bias"] if "head.weight" in sd else pooled), attns


VARIANTS = {
    "plain": tiny_config(),
    "no-qkv-bias-tanh-gelu": tiny_config(qkv_bias=False, act_layer="gelu_tanh", norm_eps=1e-12),
    "avg-pool-fc-norm": tiny_config(class_token=False, global_pool="avg"),
    "avg-pool-with-cls": tiny_config(global_pool="avg", fc_norm=False),
    "distilled": tiny_config(distilled=True),
    "distilled-one-head": tiny_config(distilled=True, dist_head=False),  # transformers' DeiTForImageClassification
    "deit3-layer-scale": tiny_config(init_values=0.1, no_embed_class=True),
    "registers": tiny_config(reg_tokens=3, class_token=False, global_pool="avg", no_embed_class=True),
    "registers-with-cls": tiny_config(reg_tokens=2),
    "pre-logits": tiny_config(representation_size=48),
    "clip-pre-norm-quick-gelu": tiny_config(pre_norm=True, act_layer="quick_gelu", norm_eps=1e-5),
    "siglip-map-pool": tiny_config(class_token=False, global_pool="map", act_layer="gelu_tanh"),
    "map-pool-skips-prefix-tokens": tiny_config(global_pool="map", reg_tokens=2, mlp_ratio=3.7362),
    "dinov2-classifier-token-avg": tiny_config(global_pool="token_avg", reg_tokens=2, init_values=0.5, no_embed_class=True),
    "token-avg-pre-logits": tiny_config(global_pool="token_avg", representation_size=40),
    "dinov2-giant-swiglu": tiny_config(mlp_layer="swiglu_packed", act_layer="silu", mlp_ratio=3, init_values=0.5),
    "radio-no-final-norm": tiny_config(final_norm=False, reg_tokens=3, no_embed_class=True, init_values=0.5),
    "no-final-norm-avg": tiny_config(final_norm=False, class_token=False, global_pool="avg"),
    "aimv2-rmsnorm-swiglu-no-bias": tiny_config(**AIMV2),
    "aimv2-cls-token-classifier": tiny_config(**AIMV2 | dict(class_token=True, global_pool="token", num_classes=7, mlp_ratio=2.75)),
    "rmsnorm-gelu-fc-norm": tiny_config(norm_layer="rmsnorm", class_token=False, global_pool="avg", reg_tokens=1, init_values=0.5),
    "swiglu-with-biases-layernorm": tiny_config(mlp_layer="swiglu", act_layer="silu", mlp_ratio=2.5, embed_norm=True),
    "dinov3-rope-registers": tiny_config(abs_pos_embed=False, rope="dinov3", reg_tokens=4, init_values=0.5, norm_eps=1e-5, qkv_bias=True),
    "dinov3-swiglu-theta": tiny_config(abs_pos_embed=False, rope="dinov3", rope_theta=7.5, reg_tokens=1, init_values=0.5,
                                       mlp_layer="swiglu", act_layer="silu", mlp_ratio=2.5),
    "rope-and-learned-positions-odd-grid": tiny_config(rope="dinov3", img_size=(40, 24), embed_dim=48, num_heads=4, class_token=False,
                                                       global_pool="avg"),
    "eva02-axial-rope-swiglu-mlp-norm": tiny_config(rope="axial", rope_ref_grid=(3, 5), global_pool="avg", mlp_layer="swiglu", act_layer="silu",
                                                    mlp_ratio=8 / 3, scale_mlp_norm=True),
    "eva02-clip-odd-grid-packed-swiglu": tiny_config(rope="axial", img_size=(40, 24), embed_dim=48, num_heads=4, mlp_layer="swiglu_packed",
                                                     act_layer="silu", mlp_ratio=16 / 3, scale_attn_norm=True, scale_mlp_norm=True),
    "axial-rope-own-grid-theta-registers": tiny_config(rope="axial", rope_theta=100.0, reg_tokens=2, init_values=0.5, class_token=False,
                                                       global_pool="avg", abs_pos_embed=False),
    "beit3-inner-norms": tiny_config(scale_attn_norm=True, scale_mlp_norm=True, global_pool="avg", norm_eps=1e-5),
    "rope-vit-xy-odd-grid-layer-scale": tiny_config(rope="axial", rope_theta=100.0, rope_grid_indexing="xy", img_size=(40, 24), embed_dim=48,
                                                    num_heads=4, init_values=0.5, abs_pos_embed=False),
    "rope-vit-ape-xy-ref-grid": tiny_config(rope="axial", rope_grid_indexing="xy", rope_ref_grid=(5, 3), init_values=0.5, no_embed_class=True),
    "pe-core-offset-pool-heads-reads-class-token": tiny_config(pre_norm=True, rope="axial", rope_grid_offset=1.0, rope_grid_indexing="xy",
                                                               rope_ref_grid=(6, 5), global_pool="map", pool_include_prefix=True,
                                                               attn_pool_num_heads=2, attn_pool_mlp_ratio=2.0, norm_eps=1e-5),
    "unpooled-tokens-per-token-head": tiny_config(global_pool="", reg_tokens=2),
    "unpooled-features-fc-norm-pre-logits": tiny_config(global_pool="", num_classes=0, fc_norm=True, representation_size=40, class_token=False),
    "unpooled-no-final-norm-rope": tiny_config(global_pool="", num_classes=0, final_norm=False, rope="axial", img_size=(40, 24), embed_dim=48),
    "pe-spatial-offset-layer-scale-no-final-norm": tiny_config(pre_norm=True, rope="axial", rope_grid_offset=1.0, rope_grid_indexing="xy",
                                                               rope_ref_grid=(6, 5), global_pool="avg", fc_norm=False, final_norm=False,
                                                               init_values=0.5, norm_eps=1e-5),
    "odd-sizes": tiny_config(img_size=(40, 24), patch_size=8, embed_dim=36, num_heads=3, mlp_ratio=2.5, in_chans=2),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_functional_reference_in_float64(name):
    cfg = VARIANTS[name]
    model = randomize(vitfast.create_model(cfg)).double()
    x = torch.randn(3, cfg.in_chans, *cfg.img_hw, dtype=torch.float64)
    expected, expected_attn = functional_vit({k: v for k, v in model.state_dict().items()}, cfg, x)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-10, rtol=1e-10)
        tokens, attns = model.forward_features(x, return_attention=True)
    assert len(attns) == cfg.depth
    for got, ref in zip(attns, expected_attn):
        assert got.shape == (3, cfg.num_heads, cfg.seq_len, cfg.seq_len)
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_sdpa_and_math_paths_agree(dtype, atol):
    cfg = tiny_config(img_size=56, patch_size=8)  # 49 patches + cls = 50 tokens
    model = randomize(vitfast.create_model(cfg)).to(dtype)
    x = torch.randn(2, 3, 56, 56, dtype=dtype)
    with torch.no_grad():
        fused = model(x)
        math_path = model.set_fused_attn(False)(x)
    torch.testing.assert_close(fused, math_path, atol=atol, rtol=0)


def test_attention_maps_are_probabilities_and_tokens_unchanged():
    model = randomize(vitfast.create_model(tiny_config()))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        plain = model.forward_features(x)
        tokens, attns = model.forward_features(x, return_attention=True)
    torch.testing.assert_close(tokens, plain, atol=1e-5, rtol=1e-5)  # SDPA vs math path
    for a in attns:
        torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)))
        assert (a >= 0).all()


def test_batch_elements_are_independent():
    model = randomize(vitfast.create_model(tiny_config()))
    x = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        whole = model(x)
        one_by_one = torch.cat([model(x[i : i + 1]) for i in range(5)])
    torch.testing.assert_close(whole, one_by_one, atol=1e-5, rtol=0)


def test_dropout_and_drop_path_only_act_in_training():
    cfg = tiny_config(drop_rate=0.3, attn_drop_rate=0.3, proj_drop_rate=0.3, drop_path_rate=0.5, pos_drop_rate=0.3)
    model = randomize(vitfast.create_model(cfg))
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        a, b = model(x), model(x)
        torch.testing.assert_close(a, b, atol=0, rtol=0)
        model.train()
        assert not torch.allclose(model(x), a)


def test_hybrid_forward_shapes_and_stride():
    cfg = vitfast.get_config("vit_small_r26_s32_224", img_size=64, depth=1, num_classes=3)
    model = vitfast.create_model(cfg)
    with torch.no_grad():
        tokens = model.forward_features(torch.randn(1, 3, 64, 64))
    assert tokens.shape == (1, 1 + 2 * 2, 384)
    assert model.patch_embed.backbone.num_features == 2048


def test_stem_only_hybrid_loads_from_timms_names_and_embeds_as_the_stem_does(tmp_path):
    """timm's R+Ti hybrids (vit_tiny_r_s16_p8_*) have a ResNet-v2 stem and no stages, the stem itself being the backbone
    (patch_embed.backbone.conv/norm): the config is read off such a state dict (stride 4 x 8x8 patches = 32), and the
    patch embedding is the BiT stem, written out here: weight-standardised 7x7/2 conv and 3x3/2 max-pool, both with TF
    'SAME' padding, GroupNorm(32) + ReLU between them, then the 8x8 projection."""
    source = randomize(vitfast.create_model("vit_tiny_r_s16_p8_224", img_size=64, depth=1, num_classes=5))
    sd = source.state_dict()
    assert {k for k in sd if k.startswith("patch_embed.backbone.")} == {f"patch_embed.backbone.{k}" for k in ("conv.weight", "norm.weight", "norm.bias")}
    torch.save(sd, tmp_path / "r_ti.pth")
    with pytest.warns(vitfast.GuessedConfigWarning):
        model = vitfast.load_checkpoint(tmp_path / "r_ti.pth")
    assert (model.config.hybrid_layers, model.config.patch_size, model.config.img_size, model.config.num_heads) == ((), 32, 64, 3)
    x = torch.randn(2, 3, 64, 64)
    w = sd["patch_embed.backbone.conv.weight"]
    w = (w - w.mean((1, 2, 3), keepdim=True)) / torch.sqrt(w.var((1, 2, 3), unbiased=False, keepdim=True) + 1e-8)
    h = F.conv2d(F.pad(x, [2, 3, 2, 3]), w, stride=2)  # SAME for 7/2 on 64 px: 5 pixels, the extra one right/bottom
    h = F.relu(F.group_norm(h, 32, sd["patch_embed.backbone.norm.weight"], sd["patch_embed.backbone.norm.bias"], eps=1e-5))
    h = F.max_pool2d(F.pad(h, [0, 1, 0, 1], value=float("-inf")), 3, 2)  # SAME for 3/2 on 32: 1 pixel
    tokens = F.conv2d(h, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=8).flatten(2).transpose(1, 2)
    with torch.no_grad():
        torch.testing.assert_close(model.patch_embed(x), tokens, atol=1e-5, rtol=0)
        torch.testing.assert_close(model(x), source(x), atol=0, rtol=0)


def test_features_only_model():
    model = vitfast.create_model(tiny_config(num_classes=0))
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 64)


@pytest.mark.parametrize("cfg", [tiny_config(global_pool="", num_classes=0, reg_tokens=2), tiny_config(global_pool="", img_size=(40, 24)),
                                 tiny_config(global_pool="", num_classes=0, class_token=False, representation_size=24)],
                         ids=["features-registers", "per-token-head-rectangular", "pre-logits-no-class-token"])
def test_unpooled_output_is_every_token_and_its_shape_is_output_shape(cfg):
    """global_pool="" returns [B, T, out_features]; without a head, the tokens forward_features gives."""
    model = randomize(vitfast.create_model(cfg)).eval()
    x = torch.randn(2, 3, *cfg.img_hw)
    with torch.no_grad():
        out = model(x)
        assert out.shape == (2, *cfg.output_shape) == (2, cfg.seq_len, cfg.num_classes or cfg.representation_size or 64)
        if not (cfg.num_classes or cfg.representation_size):
            torch.testing.assert_close(out, model.forward_features(x), atol=0, rtol=0)


def test_wrong_channel_count_is_a_clear_error():
    model = vitfast.create_model(tiny_config())
    with pytest.raises(InputError, match="expected 3 input channels, got 1"):
        model(torch.randn(1, 1, 32, 32))


def test_wrong_image_size_says_expected_size_and_img_size_fix():
    model = vitfast.create_model(tiny_config())
    with pytest.raises(InputError, match=r"expected images of 32x32, got 48x48.*img_size=48"):
        model(torch.randn(1, 3, 48, 48))


def test_uint8_and_channels_last_inputs_are_refused_with_the_fix():
    model = vitfast.create_model(tiny_config())
    with pytest.raises(InputError, match="vitfast.preprocess"):
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(InputError, match="got 3 dims"):
        model(torch.randn(3, 32, 32))


def test_layers_are_injected_by_class():
    class CountingAttention(vitfast.layers.Attention):
        calls = 0

        def forward(self, x, return_attention=False):
            CountingAttention.calls += 1
            return super().forward(x, return_attention)

    model = vitfast.VisionTransformer(tiny_config(), attn_layer=CountingAttention).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert CountingAttention.calls == 2
    assert set(model.state_dict()) == set(vitfast.create_model(tiny_config()).state_dict())


def test_gelu_forms_differ_as_expected():
    x = torch.linspace(-4, 4, 101, dtype=torch.float64)
    erf = vitfast.layers.Mlp(1, 1, "gelu").act(x)
    tanh = vitfast.layers.Mlp(1, 1, "gelu_tanh").act(x)
    torch.testing.assert_close(erf, F.gelu(x))
    assert 0 < (erf - tanh).abs().max() < 1e-3
    quick = vitfast.layers.Mlp(1, 1, "quick_gelu").act(x)
    torch.testing.assert_close(quick, x * torch.sigmoid(1.702 * x))
    assert 1e-2 < (erf - quick).abs().max() < 3e-2  # the cruder approximation: a different function


def test_pre_norm_model_has_norm_pre_and_no_patch_bias():
    """CLIP image towers (timm `pre_norm=True`): a LayerNorm before the blocks, and the patch
    projection has no bias, so a timm CLIP state dict has exactly these keys."""
    keys = set(vitfast.create_model(tiny_config(pre_norm=True)).state_dict())
    plain = set(vitfast.create_model(tiny_config()).state_dict())
    assert keys - plain == {"norm_pre.weight", "norm_pre.bias"}
    assert plain - keys == {"patch_embed.proj.bias"}


def test_pixels_past_the_last_whole_patch_are_ignored_as_timm_and_transformers_do():
    """SigLIP so400m/14 at 384 px: 27 x 27 patches cover 378 px; the last 6 rows and columns are
    never read, and the model equals one built at 378 px on the top-left crop."""
    cfg = tiny_config(img_size=(36, 30), patch_size=8)  # 4 x 3 patches of 32 x 24 px
    assert cfg.grid_size == (4, 3) and cfg.seq_len == 13
    model = randomize(vitfast.create_model(cfg))
    cropped = vitfast.create_model(cfg.replace(img_size=(32, 24)))
    cropped.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 36, 30)
    poked = x.clone()
    poked[:, :, 32:] = 1e4
    poked[:, :, :, 24:] = -1e4
    with torch.no_grad():
        out = model(x)
        torch.testing.assert_close(model(poked), out, atol=0, rtol=0)
        torch.testing.assert_close(cropped(x[:, :, :32, :24]), out, atol=1e-6, rtol=0)
