"""`vitfast.inspect` and `vitfast inspect`: rollout, attention distance and position-embedding
similarity against independent numpy computations, fixed-size PNGs, errors, every model kind."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitfast
from vitfast import inspect as vi
from vitfast.cli import main

from conftest import randomize, tiny_config

VITFAST = Path(sys.executable).parent / "vitfast"
PNG_SIZES = {"rollout": (800, 400), "heads": (800, 800), "pos_embed": (800, 800), "attention_distance": (640, 480)}


# ---------------------------------------------------------------------------- helpers
def identity_attention(depth: int, batch: int, heads: int, tokens: int) -> list[torch.Tensor]:
    return [torch.eye(tokens).expand(batch, heads, tokens, tokens).clone() for _ in range(depth)]


def random_attention(depth: int, batch: int, heads: int, tokens: int) -> list[torch.Tensor]:
    return [torch.randn(batch, heads, tokens, tokens).mul(3).softmax(-1) for _ in range(depth)]


def numpy_rollout(attentions: list[torch.Tensor]) -> np.ndarray:
    """Abnar & Zuidema, written out: start from I, left-multiply each layer's residual-mixed attention."""
    T = attentions[0].shape[-1]
    joint = np.eye(T)
    for attn in attentions:
        a = attn.double().numpy().mean(axis=1)
        a = 0.5 * a + 0.5 * np.eye(T)
        a = a / a.sum(axis=-1, keepdims=True)
        joint = np.einsum("bij,bjk->bik", a, np.broadcast_to(joint, a.shape))
    return joint


def centre_distances(grid: tuple[int, int], patch: int) -> np.ndarray:
    """[N, N] pixel distances between patch centres, by explicit loops over all pairs."""
    gh, gw = grid
    centres = [((r + 0.5) * patch, (c + 0.5) * patch) for r in range(gh) for c in range(gw)]
    return np.array([[math.dist(a, b) for b in centres] for a in centres])


def save(model, tmp_path: Path, name: str = "m.safetensors") -> Path:
    return vitfast.save_checkpoint(model, tmp_path / name)


def digit_like_image(path: Path, size: tuple[int, int] = (40, 40)) -> Path:
    arr = np.zeros((size[1], size[0], 3), np.uint8)
    arr[8:32, 17:23] = 255  # a bright vertical stroke
    Image.fromarray(arr).save(path)
    return path


# ---------------------------------------------------------------------------- rollout
@pytest.mark.parametrize("prefix", [1, 2, 5])
def test_rollout_of_identity_attention_from_the_class_token_never_reaches_patches(prefix):
    N = 16
    attns = identity_attention(3, 2, 4, prefix + N)
    joint = vi.rollout_matrix(attns)
    assert torch.equal(joint, torch.eye(prefix + N).expand(2, -1, -1))
    roll = vi.attention_rollout(attns, prefix)
    assert roll.shape == (2, N) and torch.all(roll == 0)  # uniform: every patch gets the same (nothing)


@pytest.mark.parametrize("prefix", [0, 4])
def test_rollout_of_identity_attention_from_the_patch_mean_is_exactly_uniform(prefix):
    N = 16
    roll = vi.attention_rollout(identity_attention(3, 2, 4, prefix + N), prefix, class_token=False)
    assert roll.shape == (2, N)
    torch.testing.assert_close(roll, torch.full((2, N), 1 / N, dtype=torch.float64), rtol=0, atol=1e-15)


def test_rollout_matches_an_independent_product_from_first_to_last_layer():
    attns = random_attention(3, 2, 3, 7)
    expected = numpy_rollout(attns)
    np.testing.assert_allclose(vi.rollout_matrix(attns).numpy(), expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(vi.attention_rollout(attns, 2).numpy(), expected[:, 0, 2:], rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        vi.attention_rollout(attns, 2, class_token=False).numpy(), expected[:, 2:, 2:].mean(axis=1), rtol=0, atol=1e-12
    )
    # The layer order matters (the matrices do not commute), so this test catches a reversed product.
    assert not np.allclose(numpy_rollout(attns[::-1]), expected, atol=1e-3)


def test_head_attention_is_the_last_layers_source_row_per_head():
    attns = random_attention(2, 2, 3, 6)
    np.testing.assert_array_equal(vi.head_attention(attns, 2).numpy(), attns[-1][:, :, 0, 2:].double().numpy())
    np.testing.assert_allclose(
        vi.head_attention(attns, 2, class_token=False).numpy(), attns[-1][:, :, 2:, 2:].double().mean(2).numpy(), atol=1e-7
    )
    distilled = attns[-1].double().numpy()
    np.testing.assert_allclose(vi.head_attention(attns, 2, distilled=True).numpy(), (distilled[:, :, 0, 2:] + distilled[:, :, 1, 2:]) / 2,
                               rtol=0, atol=1e-15)  # fmt: skip


@pytest.mark.parametrize("cfg_kwargs", [dict(), dict(class_token=False, global_pool="avg")], ids=["class-token", "avg"])
def test_model_forced_to_identity_attention_gives_a_uniform_rollout(cfg_kwargs):
    model = randomize(vitfast.create_model(tiny_config(**cfg_kwargs)))
    # Replace every layer's attention probabilities by the identity as the model returns them.
    for block in model.blocks:
        block.attn.register_forward_hook(lambda mod, inp, out: (out[0], torch.eye(out[1].shape[-1]).expand_as(out[1])))
    result = vi.inspect_model(model, torch.randn(2, 3, 32, 32))
    roll = result.rollout
    assert roll.shape == (2, 4, 4)
    assert torch.all(roll == roll.flatten()[0])
    expected = 0.0 if model.config.class_token else 1 / 16
    torch.testing.assert_close(roll, torch.full_like(roll, expected), rtol=0, atol=1e-15)


def test_inspection_runs_in_eval_mode_and_restores_training_mode():
    model = randomize(vitfast.create_model(tiny_config(proj_drop_rate=0.5, drop_path_rate=0.5)))
    x = torch.randn(2, 3, 32, 32)
    expected = vi.inspect_model(model, x)
    model.train()
    got = vi.inspect_model(model, x)  # dropout and drop-path would change every layer after the first
    assert model.training
    torch.testing.assert_close(got.rollout, expected.rollout, rtol=0, atol=0)
    torch.testing.assert_close(got.attention_distance, expected.attention_distance, rtol=0, atol=0)


# ---------------------------------------------------------------------------- attention distance
def test_attention_to_self_only_has_distance_zero():
    cfg = tiny_config(distilled=True)
    attns = identity_attention(2, 3, 4, cfg.seq_len)
    dist = vi.mean_attention_distance(attns, cfg)
    assert dist.shape == (2, 4) and torch.all(dist == 0)


@pytest.mark.parametrize("img_size", [32, (32, 48)], ids=["square", "4x6 grid"])
def test_uniform_attention_over_patches_has_the_analytic_mean_distance_of_the_grid(img_size):
    cfg = tiny_config(img_size=img_size, class_token=False, global_pool="avg")
    N = cfg.num_patches
    expected = centre_distances(cfg.grid_size, cfg.patch_size).mean()
    attns = [torch.full((2, 4, N, N), 1 / N) for _ in range(3)]
    np.testing.assert_allclose(vi.mean_attention_distance(attns, cfg).numpy(), np.full((3, 4), expected), rtol=1e-6)
    assert vi.uniform_attention_distance(cfg) == pytest.approx(expected, rel=1e-12)  # the plot's reference line


def test_attention_on_prefix_tokens_adds_no_distance_unless_renormalised():
    cfg = tiny_config(reg_tokens=3, no_embed_class=True)  # 4 prefix tokens
    T, N = cfg.seq_len, cfg.num_patches
    expected = centre_distances(cfg.grid_size, cfg.patch_size).mean()
    attns = [torch.full((1, 2, T, T), 1 / T)]
    np.testing.assert_allclose(vi.mean_attention_distance(attns, cfg).numpy(), [[expected * N / T] * 2], rtol=1e-6)
    np.testing.assert_allclose(vi.mean_attention_distance(attns, cfg, renormalize=True).numpy(), [[expected] * 2], rtol=1e-6)


def test_attention_to_one_patch_gives_the_mean_distance_to_it_in_pixels():
    cfg = tiny_config(img_size=(32, 48))  # grid 4x6, patch 8
    T, P = cfg.seq_len, cfg.num_prefix_tokens
    target = 1 * 6 + 4  # row 1, column 4
    attn = torch.zeros(1, 1, T, T)
    attn[..., target + P] = 1.0
    expected = np.mean([math.dist(((r + 0.5) * 8, (c + 0.5) * 8), (1.5 * 8, 4.5 * 8)) for r in range(4) for c in range(6)])
    assert vi.mean_attention_distance([attn], cfg).item() == pytest.approx(expected, rel=1e-12)


def test_attention_that_does_not_fit_the_config_is_refused():
    with pytest.raises(vitfast.InputError, match="does not fit the config"):
        vi.mean_attention_distance(identity_attention(1, 1, 1, 10), tiny_config())


# ---------------------------------------------------------------------------- position embeddings
@pytest.mark.parametrize(
    "cfg_kwargs", [dict(), dict(distilled=True), dict(reg_tokens=2, no_embed_class=True)], ids=["vit", "deit", "reg"]
)
def test_pos_embed_similarity_is_the_cosine_of_the_patch_rows(cfg_kwargs):
    model = randomize(vitfast.create_model(tiny_config(**cfg_kwargs)), scale=1.0)
    sim = vi.pos_embed_similarity(model)
    N = model.config.num_patches
    assert sim.shape == (N, N)
    assert torch.all(sim.diagonal() == 1.0) and torch.equal(sim, sim.T)
    pos = model.pos_embed.detach().double().numpy()[0]
    pos = pos if model.config.no_embed_class else pos[model.config.num_prefix_tokens :]
    unit = pos / np.linalg.norm(pos, axis=1, keepdims=True)
    np.testing.assert_allclose(sim.numpy(), unit @ unit.T, rtol=0, atol=1e-12)


def test_pos_embed_similarity_lies_on_the_grid_the_table_is_stored_at(tmp_path):
    # An HF DINOv2's table is stored at 37x37 and resized to the image's grid: here 6x5 stored, 4x4 seen.
    model = randomize(vitfast.create_model(tiny_config(dynamic_img_size=True, pos_embed_grid=(6, 5))), scale=1.0)
    result = vi.inspect_model(model, torch.randn(1, 3, 32, 32))
    pos = model.pos_embed.detach().double().numpy()[0, 1:]
    unit = pos / np.linalg.norm(pos, axis=1, keepdims=True)
    np.testing.assert_allclose(result.pos_similarity.numpy(), unit @ unit.T, rtol=0, atol=1e-12)
    assert result.rollout.shape == (1, 4, 4) and result.to_dict()["pos_grid"] == [6, 5]
    assert set(vi.save_figures(result, tmp_path / "figs")) == set(PNG_SIZES)


def test_pos_embed_similarity_shows_rows_and_columns_of_a_row_column_code():
    model = vitfast.create_model(tiny_config(embed_dim=8, num_heads=2))  # 4x4 grid; embedding = [onehot(row), onehot(col)]
    with torch.no_grad():
        model.pos_embed.zero_()
        for r in range(4):
            for c in range(4):
                model.pos_embed[0, 1 + r * 4 + c, r] = 1.0
                model.pos_embed[0, 1 + r * 4 + c, 4 + c] = 1.0
    sim = vi.pos_embed_similarity(model).numpy()
    for i in range(16):
        for j in range(16):
            same = (i // 4 == j // 4) + (i % 4 == j % 4)
            assert sim[i, j] == pytest.approx(same / 2, abs=1e-12)


# ---------------------------------------------------------------------------- figures
def test_saved_pngs_open_with_pillow_at_fixed_sizes_and_are_not_overwritten(tmp_path):
    model = randomize(vitfast.create_model(tiny_config()))
    result = vi.inspect_model(model, torch.randn(2, 3, 32, 32))
    out = tmp_path / "new" / "dir"
    paths = vi.save_figures(result, out)
    assert set(paths) == set(PNG_SIZES)
    for name, path in paths.items():
        with Image.open(path) as img:
            assert img.format == "PNG" and img.size == PNG_SIZES[name], name
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.png" for n in PNG_SIZES)  # no temp files left
    with pytest.raises(vitfast.VitfastError, match="--force"):
        vi.save_figures(result, out)
    vi.save_figures(result, out, index=1, overwrite=True)


def test_force_removes_the_pos_embed_figure_of_an_earlier_model_that_this_one_does_not_make(tmp_path):
    out = tmp_path / "figs"
    vi.save_figures(vi.inspect_model(randomize(vitfast.create_model(tiny_config())), torch.randn(1, 3, 32, 32)), out)
    unrelated = out / "notes.png"
    unrelated.write_bytes(b"mine")
    no_pos = vi.inspect_model(randomize(vitfast.create_model(tiny_config(abs_pos_embed=False))), torch.randn(1, 3, 32, 32))
    (out / "heads.png").unlink()
    with pytest.raises(vitfast.VitfastError, match="already holds rollout.png, pos_embed.png, attention_distance.png; pass --force"):
        vi.save_figures(no_pos, out)
    assert set(vi.save_figures(no_pos, out, overwrite=True)) == set(PNG_SIZES) - {"pos_embed"}
    assert sorted(p.name for p in out.iterdir()) == ["attention_distance.png", "heads.png", "notes.png", "rollout.png"]
    assert unrelated.read_bytes() == b"mine"  # not a figure name of vitfast's


def test_cli_refuses_existing_pngs_before_it_loads_the_model(tmp_path, capsys):
    img = digit_like_image(tmp_path / "seven.jpg")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "pos_embed.png").write_bytes(b"old")
    assert main(["inspect", "--checkpoint", str(tmp_path / "missing.safetensors"), "--image", str(img), "--out", str(tmp_path / "out")]) == 2
    assert "already holds pos_embed.png; pass --force" in capsys.readouterr().err


def test_rollout_overlay_keeps_the_image_the_model_saw(tmp_path):
    cfg = tiny_config(in_chans=1, mean=(0.5,), std=(0.25,))
    images = torch.randn(1, 1, 32, 32)
    result = vi.inspect_model(vitfast.create_model(cfg), images)
    np.testing.assert_allclose(result.pixels[0], (images[0, 0] * 0.25 + 0.5).clamp(0, 1).numpy(), atol=1e-6)
    vi.save_figures(result, tmp_path)  # grey images draw too


def test_maps_lie_on_the_whole_patches_when_trailing_pixels_go_unseen(tmp_path):
    """36x44 px with 8 px patches: the model sees 32x40 (4x5 patches, as SigLIP so400m/14 sees 378 of 384
    px); the pixels shown under the maps are those, not the whole image stretched under the grid."""
    cfg = tiny_config(img_size=(36, 44))
    images = torch.randn(1, 3, 36, 44)
    result = vi.inspect_model(randomize(vitfast.create_model(cfg)), images)
    assert result.pixels.shape == (1, 32, 40, 3) and tuple(result.rollout.shape) == (1, 4, 5)
    np.testing.assert_allclose(result.pixels[0], (images[0, :, :32, :40].permute(1, 2, 0) * 0.5 + 0.5).clamp(0, 1).numpy(), atol=1e-6)
    vi.save_figures(result, tmp_path)


# ---------------------------------------------------------------------------- errors
def test_a_non_image_file_is_a_clear_input_error(tmp_path):
    bad = tmp_path / "notes.png"
    bad.write_text("this is text, not pixels")
    with pytest.raises(vitfast.InputError, match=r"notes\.png is not an image Pillow can read") as info:
        vi.load_image(bad)
    assert "\n" not in str(info.value)
    with pytest.raises(vitfast.InputError, match="image not found"):
        vi.load_image(tmp_path / "missing.png")


def test_a_folder_given_as_the_image_is_named_a_folder_not_missing(tmp_path):
    with pytest.raises(vitfast.errors.InputError, match=f"^{tmp_path} is a folder; inspect looks at one image: give --image a file"):
        vi.load_image(tmp_path)


def test_cli_non_image_exits_2_with_one_stderr_line(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    out = subprocess.run(
        [str(VITFAST), "inspect", "--model", "vit_cifar_patch4_32", "--image", str(bad)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "notes.txt is not an image Pillow can read" in out.stderr
    assert not any(tmp_path.glob("inspect-*"))


def test_missing_matplotlib_points_to_the_plot_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    img = digit_like_image(tmp_path / "d.png")
    ckpt = save(vitfast.create_model(tiny_config()), tmp_path)
    assert main(["inspect", "--checkpoint", str(ckpt), "--image", str(img), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install vitfast[plot]" in err


def test_img_size_builds_the_model_at_that_resolution(tmp_path, capsys):
    """inspect takes export's --img-size: a ViT-Ti/16 at 32 px has a 2x2 patch grid (the flag was refused)."""
    img = digit_like_image(tmp_path / "d.png")
    assert main(["inspect", "--model", "vit_tiny_patch16_224", "--img-size", "32", "--image", str(img), "--out", str(tmp_path / "o"),
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["grid_size"] == [2, 2]


def test_import_vitfast_does_not_import_matplotlib():
    code = "import sys, vitfast, vitfast.inspect, vitfast.cli; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


# ---------------------------------------------------------------------------- end to end
VARIANTS = {
    "deit-distilled": dict(distilled=True),
    "deit-class-head-only": dict(distilled=True, dist_head=False),
    "avg-pool": dict(class_token=False, global_pool="avg"),
    "registers": dict(reg_tokens=4, no_embed_class=True),
    "registers-avg": dict(class_token=False, global_pool="avg", reg_tokens=4, no_embed_class=True),
    "avg-pool-with-cls": dict(global_pool="avg", fc_norm=False),
    "siglip-attention-pool": dict(class_token=False, global_pool="map", reg_tokens=2),
    "dinov2-classifier": dict(global_pool="token_avg", reg_tokens=2),
    "hybrid": dict(hybrid_layers=(1,)),
    "dinov3-rotary": dict(abs_pos_embed=False, rope="dinov3", reg_tokens=4, init_values=0.5),
    "pe-pool-reads-class-token": dict(pre_norm=True, rope="axial", rope_grid_indexing="xy", rope_grid_offset=1.0, rope_ref_grid=(6, 6),
                                      global_pool="map", pool_include_prefix=True, attn_pool_num_heads=2),
}
SOURCES = {"token": "class token", "avg": "mean of patch tokens", "map": "attention-pool query",
           "token_avg": "class token (the head also reads the mean patch token)"}
DISTILLED_SOURCE = "mean of the class and distillation tokens (the logits average their two heads)"


def numpy_pool_attention(sd: dict, tokens: np.ndarray, heads: int) -> np.ndarray:
    """The attention pool's query over the tokens it reads [B, N, C] -> probabilities [B, H, N]."""
    C = tokens.shape[-1]
    w = {k: v.double().numpy() for k, v in sd.items() if k.startswith("attn_pool.")}
    q = (w["attn_pool.latent"][0, 0] @ w["attn_pool.q.weight"].T + w["attn_pool.q.bias"]).reshape(heads, -1)
    k = (tokens @ w["attn_pool.kv.weight"][:C].T + w["attn_pool.kv.bias"][:C]).reshape(*tokens.shape[:2], heads, -1)
    logits = np.einsum("hd,bnhd->bhn", q, k) / math.sqrt(C // heads)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cli_json_end_to_end_for_every_model_kind(variant, tmp_path, capsys):
    model = randomize(vitfast.create_model(tiny_config(**VARIANTS[variant])))
    ckpt = save(model, tmp_path)
    img = digit_like_image(tmp_path / "digit.png")
    out = tmp_path / "figs"
    assert main(["inspect", "--checkpoint", str(ckpt), "--image", str(img), "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout holds exactly one JSON object
    keys = {"model", "image", "source", "grid_size", "patch_size", "num_prefix_tokens", "rollout", "head_attention",
            "pos_embed_similarity", "mean_attention_distance", "files"}  # fmt: skip
    assert keys <= set(report)
    cfg = model.config
    assert report["grid_size"] == [4, 4] and report["num_prefix_tokens"] == cfg.num_prefix_tokens
    drawn_apart = " (its share on the class token not drawn)" if cfg.pool_include_prefix else ""
    both_heads = cfg.distilled and cfg.dist_head  # the logits average the class and distillation tokens' heads
    assert report["source"] == (DISTILLED_SOURCE if both_heads else SOURCES[cfg.global_pool] + drawn_apart)
    learned = cfg.abs_pos_embed  # rotary positions are computed: no similarity, no figure
    heads = cfg.attn_pool_num_heads or cfg.num_heads  # the last layer's, or the attention pool's
    assert np.shape(report["head_attention"]) == (heads, 4, 4)
    assert np.shape(report["pos_embed_similarity"]) == (16, 16) if learned else report["pos_embed_similarity"] is None
    assert set(report["files"]) == set(PNG_SIZES) - (set() if learned else {"pos_embed"})
    assert np.shape(report["mean_attention_distance"]) == (2, 4)
    # The rollout in the report is the independent product for the same image, prefix tokens left out.
    with torch.no_grad():
        tokens, attns = model.forward_features(vitfast.preprocess(Image.open(img), cfg), return_attention=True)
    joint = numpy_rollout(attns)[0]
    P = cfg.num_prefix_tokens
    if cfg.global_pool == "map":  # the pool's query reads the patch tokens (all, for PE): one more (head-averaged) attention row
        read = 0 if cfg.pool_include_prefix else P
        pool = numpy_pool_attention(model.state_dict(), tokens[:, read:].double().numpy(), heads)[0]
        expected = pool.mean(0) @ joint[read:, P:]
        np.testing.assert_allclose(np.reshape(report["head_attention"], (heads, -1)), pool[:, P - read :], atol=2e-6)
    else:
        expected = joint[0, P:] if cfg.global_pool in ("token", "token_avg") else joint[P:, P:].mean(axis=0)
        if both_heads:
            expected = (joint[0, P:] + joint[1, P:]) / 2
    np.testing.assert_allclose(np.ravel(report["rollout"]), expected, atol=2e-6)
    for name, path in report["files"].items():
        with Image.open(path) as png:
            assert png.size == PNG_SIZES[name]


def test_cli_text_output_and_default_out_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    img = digit_like_image(tmp_path / "seven.jpg")
    assert main(["inspect", "--model", "vit_cifar_patch4_32", "--image", str(img)]) == 0
    captured = capsys.readouterr()
    assert "layer  4" in captured.out and "random weights" in captured.err
    assert sorted(p.name for p in (tmp_path / "inspect-seven").iterdir()) == sorted(f"{n}.png" for n in PNG_SIZES)
    assert main(["inspect", "--model", "vit_cifar_patch4_32", "--image", str(img)]) == 2  # exists: needs --force
    assert "--force" in capsys.readouterr().err
    assert main(["inspect", "--model", "vit_cifar_patch4_32", "--image", str(img), "--force"]) == 0
