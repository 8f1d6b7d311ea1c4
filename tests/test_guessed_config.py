"""What a checkpoint does not store is guessed loudly, and the user can say what is right:
`overrides=` / `--config FILE.json` / field flags; the guesses go in the sidecar and `check` repeats them."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import vitfast
from vitfast.cli import main
from conftest import randomize

# 4 heads of width 32; the weights alone suggest head_dim 64, i.e. 2 heads (no registered model has this shape)
TRUE = vitfast.ViTConfig(img_size=32, patch_size=8, embed_dim=128, depth=2, num_heads=4, num_classes=5,
                         mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), crop_pct=0.875)  # fmt: skip
FLAGS = ["--num-heads", "4", "--mean", "0.485", "0.456", "0.406", "--std", "0.229", "0.224", "0.225", "--crop-pct", "0.875",
         "--interpolation", "bicubic", "--crop-mode", "center"]  # fmt: skip


@pytest.fixture(scope="module")
def truth(tmp_path_factory):
    torch.manual_seed(0)
    model = vitfast.create_model(TRUE)
    path = tmp_path_factory.mktemp("ckpt") / "model.pth"
    torch.save(model.state_dict(), path)
    return model, path


def test_a_bare_state_dict_warns_about_heads_and_preprocessing(truth):
    model, path = truth
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"num_heads=2 .*mean=\[0.5, 0.5, 0.5\]"):
        guessed = vitfast.load_checkpoint(path)
    assert set(guessed.config_guesses) == {"num_heads", "mean", "std", "crop_pct", "interpolation", "crop_mode"}
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (guessed(x) - model(x)).abs().max() > 1e-3  # the wrong guess changes the answer: why it must be loud
        with warnings.catch_warnings():
            warnings.simplefilter("error", vitfast.GuessedConfigWarning)
            fixed = vitfast.load_checkpoint(path, overrides=dict(num_heads=4, mean=TRUE.mean, std=TRUE.std, crop_pct=0.875,
                                                                 interpolation="bicubic", crop_mode="center"))  # fmt: skip
        torch.testing.assert_close(fixed(x), model(x), rtol=0, atol=0)
    assert fixed.config == TRUE.replace(fc_norm=False) and fixed.config_guesses == {}  # fc_norm read off the weights


def test_cli_export_warns_records_and_check_repeats(truth, tmp_path, capsys):
    _, path = truth
    out = tmp_path / "m.onnx"
    assert main(["export", "--checkpoint", str(path), "--format", "onnx", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("vitfast: warning:") == 1 and "num_heads=2" in err and "--num-heads" in err
    side = vitfast.export.read_sidecar(out)
    assert "num_heads" in side["source"]["guessed"]
    assert main(["check", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert "num_heads=2" in captured.err and "num_heads" in json.loads(captured.out)["guessed"]


def test_cli_overrides_fix_the_config_and_check_rebuilds_with_them(truth, tmp_path, capsys):
    model, path = truth
    out = tmp_path / "m.onnx"
    assert main(["export", "--checkpoint", str(path), "--format", "onnx", "--out", str(out), *FLAGS]) == 0
    assert "warning" not in capsys.readouterr().err
    side = vitfast.export.read_sidecar(out)
    assert vitfast.ViTConfig.from_dict(side["config"]) == TRUE.replace(fc_norm=False) and side["source"]["guessed"] == {}
    x = vitfast.data.random_images(TRUE, 3, seed=5)
    with torch.no_grad():
        torch.testing.assert_close(vitfast.load_engine(out)(x), model(x), atol=1e-4, rtol=0)
    # check rebuilds the fp32 reference from the recorded overrides: with 2 heads it would fail
    assert main(["check", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["passed"] and result["max_abs_err"] < 1e-4


def test_config_file_and_flags(truth, tmp_path, capsys):
    _, path = truth
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps({"num_heads": 4, "mean": list(TRUE.mean), "std": list(TRUE.std), "crop_pct": 0.5}))
    out = tmp_path / "m.onnx"
    assert main(["export", "--checkpoint", str(path), "--format", "onnx", "--out", str(out), "--config", str(cfg_file),
                 "--crop-pct", "0.875"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "num_heads" not in err and "interpolation='bicubic'" in err  # only what is still guessed
    config = vitfast.load_engine(out).config
    assert (config.num_heads, config.crop_pct, config.mean) == (4, 0.875, TRUE.mean)  # the flag wins over the file


@pytest.mark.parametrize(
    "content, message",
    [("{not json", "is not valid JSON"), ('["a"]', "must hold a JSON object"), ('{"num_head": 4}', "did you mean 'num_heads'")],
)
def test_bad_config_file_is_one_line(truth, tmp_path, capsys, content, message):
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(content)
    code = main(["export", "--checkpoint", str(truth[1]), "--format", "onnx", "--out", str(tmp_path / "m.onnx"), "--config", str(cfg_file)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "m.onnx").exists()


def test_num_classes_override_that_does_not_fit_the_head_is_named(truth, tmp_path, capsys):
    code = main(["inspect", "--checkpoint", str(truth[1]), "--image", str(tmp_path / "none.png"), "--num-classes", "7"])
    assert code == 2  # the image is checked first; a real one below
    from PIL import Image

    Image.new("RGB", (40, 30)).save(tmp_path / "img.png")
    code = main(["inspect", "--checkpoint", str(truth[1]), "--image", str(tmp_path / "img.png"), "--num-classes", "7",
                 "--num-heads", "4", "--out", str(tmp_path / "figs")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "has a 5-class classifier; num_classes=7 would need a new, untrained one. Pass num_classes=0" in err


def test_clip_state_dict_guesses_eps_activation_and_clip_preprocessing_and_flags_fix_them(tmp_path, capsys):
    """A CLIP image tower's weights (norm_pre, no patch bias) say it is one, not its LayerNorm eps or
    GELU form: both are guessed as timm's CLIP defaults, loudly, and --act-layer / --norm-eps fix them."""
    true = vitfast.ViTConfig(img_size=32, patch_size=8, embed_dim=128, depth=2, num_heads=2, num_classes=5, pre_norm=True,
                             act_layer="quick_gelu", norm_eps=1e-6, mean=vitfast.config.OPENAI_CLIP_MEAN,
                             std=vitfast.config.OPENAI_CLIP_STD)  # fmt: skip
    torch.manual_seed(0)
    model = vitfast.create_model(true)
    path = tmp_path / "clip.pth"
    torch.save(model.state_dict(), path)
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"act_layer='gelu' .*quick_gelu"):
        guessed = vitfast.load_checkpoint(path)
    c = guessed.config
    assert (c.pre_norm, c.norm_eps, c.act_layer, c.mean) == (True, 1e-5, "gelu", true.mean)
    assert {"norm_eps", "act_layer", "mean", "std"} <= set(guessed.config_guesses)
    out = tmp_path / "clip.onnx"
    assert main(["export", "--checkpoint", str(path), "--format", "onnx", "--out", str(out), "--act-layer", "quick_gelu",
                 "--norm-eps", "1e-6"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "act_layer" not in err and "norm_eps" not in err  # set by the flags, so no longer guessed
    x = vitfast.data.random_images(true, 3, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(vitfast.load_engine(out)(x), model(x), atol=1e-4, rtol=0)
    with pytest.raises(SystemExit) as exit_info:  # argparse's own usage error
        main(["export", "--checkpoint", str(path), "--format", "onnx", "--out", str(tmp_path / "x.onnx"), "--act-layer", "relu"])
    assert exit_info.value.code == 2 and "invalid choice: 'relu'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["vit_giant_patch14_dinov2", "vit_giant_patch14_reg4_dinov2", "vit_large_patch14_reg4_dinov2"])
def test_dinov2_architecture_is_read_off_the_shapes(name):
    """The giant's SwiGLU (fc1 twice as wide as fc2's input) and its 24 heads (from the registered model of
    its shapes) come back from the tensor shapes alone; the large one's GELU MLP stays a GELU MLP."""
    from vitfast.convert import infer_timm_config

    truth = vitfast.get_config(name)
    with torch.device("meta"):  # shapes only: the giant's 1.1B parameters are never allocated
        sd = vitfast.create_model(truth).state_dict()
    cfg, guesses = infer_timm_config(sd)
    arch = ("embed_dim", "depth", "num_heads", "mlp_layer", "act_layer", "mlp_hidden", "reg_tokens", "no_embed_class",
            "global_pool", "img_size")  # fmt: skip
    assert {k: getattr(cfg, k) for k in arch} == {k: getattr(truth, k) for k in arch}
    assert cfg.init_values is not None  # layer scale present (its values are the loaded gammas)
    assert name in guesses["num_heads"] or name.replace("_reg4", "") in guesses["num_heads"]


def test_a_given_head_count_is_used_where_the_shapes_cannot_tell_it(tmp_path):
    """A bare HF state dict 96 wide (no registered model, not a multiple of 64) loads with --num-heads /
    overrides; this used to fail asking for the very flag that was given."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=96, num_hidden_layers=2, num_attention_heads=4, intermediate_size=384,
        num_labels=3)).eval()  # fmt: skip
    torch.save(hf.state_dict(), tmp_path / "w.pth")
    with pytest.raises(vitfast.CheckpointError, match="--num-heads N"):
        vitfast.load_checkpoint(tmp_path / "w.pth")
    loaded = vitfast.load_checkpoint(tmp_path / "w.pth", overrides={"num_heads": 4})
    assert "num_heads" not in loaded.config_guesses and loaded.config.num_heads == 4
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), hf(pixel_values=x).logits, atol=1e-5, rtol=0)


def test_a_given_config_is_used_where_the_shapes_cannot_tell_the_grid(tmp_path):
    """A bare timm state dict with a non-square patch grid (4x5) loads with config= (it used to fail
    asking for config=, the shapes being read first)."""
    cfg = vitfast.ViTConfig(img_size=(32, 40), patch_size=8, embed_dim=96, depth=2, num_heads=4, num_classes=3)
    model = vitfast.create_model(cfg).eval()
    torch.save(model.state_dict(), tmp_path / "w.pth")
    with pytest.raises(vitfast.CheckpointError, match="cannot infer the patch grid.*--config FILE.json"):
        vitfast.load_checkpoint(tmp_path / "w.pth", overrides={"num_heads": 4})
    loaded = vitfast.load_checkpoint(tmp_path / "w.pth", config=cfg)
    assert loaded.config_guesses == {}
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)


def test_image_size_the_weights_cannot_tell_is_reported_when_a_registered_twin_sees_more_pixels(tmp_path, monkeypatch):
    """SigLIP so400m/14 at 384 px has 27x27 patches, like the 378 px one: the weights cannot tell them
    apart, and timm resizes images to 384 for the one, 378 for the other. A state dict is read at 378 px
    and says so, naming the twin; --img-size 384 settles it (and it is then no longer a guess)."""
    from vitfast import registry
    from vitfast.convert import infer_timm_config

    with torch.device("meta"):
        sd = vitfast.create_model("vit_so400m_patch14_siglip_384").state_dict()
    cfg, guesses = infer_timm_config(sd)
    assert cfg.img_size == 378 and "vit_so400m_patch14_siglip_384" in guesses["img_size"] and "--img-size 384" in guesses["img_size"]
    with torch.device("meta"):
        sd = vitfast.create_model("vit_so400m_patch14_siglip_224").state_dict()
    assert "img_size" not in infer_timm_config(sd)[1]  # 16 patches of 14 are 224 px: nothing unseen, nothing to say
    # the whole load, on a registered twin small enough to build: 4x4 patches of 8 px, at 32 or 36 px
    monkeypatch.setitem(registry._REGISTRY, "tiny_twin_36", dict(img_size=36, patch_size=8, embed_dim=64, depth=2, num_heads=4))
    torch.save(vitfast.create_model(vitfast.ViTConfig(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)).state_dict(),
               tmp_path / "w.pth")  # fmt: skip
    with pytest.warns(vitfast.GuessedConfigWarning, match="img_size=32 .*tiny_twin_36.*--img-size 36"):
        vitfast.load_checkpoint(tmp_path / "w.pth")
    sized = vitfast.load_checkpoint(tmp_path / "w.pth", img_size=36)
    assert sized.config.img_size == 36 and "img_size" not in sized.config_guesses


def test_a_grid_read_without_its_class_token_is_reported_unless_a_registered_twin_does_so(tmp_path):
    """4x6 patches plus an embedded class token make a pos_embed of 25 = 5x5: the shapes read as a 5x5 grid
    without the class token (as DeiT-III stores it). Where no registered model of those shapes does that,
    it is a guess and said; a DeiT-III state dict is not."""
    from vitfast.convert import infer_timm_config

    with torch.device("meta"):
        odd = vitfast.create_model(vitfast.ViTConfig(img_size=(32, 48), patch_size=8, embed_dim=128, depth=2, num_heads=2))
        deit3 = vitfast.create_model("deit3_small_patch16_224")
    cfg, guesses = infer_timm_config(odd.state_dict())
    assert (cfg.grid_size, cfg.no_embed_class) == ((5, 5), True) and "--config FILE.json" in guesses["no_embed_class"]
    cfg, guesses = infer_timm_config(deit3.state_dict())
    assert cfg.no_embed_class and "no_embed_class" not in guesses


def test_every_registered_architecture_is_read_back_off_its_shapes():
    """A bare state dict of any registered model gives back its architecture: widths, depth, MLP kind, tokens,
    pooling, the norms present (none after the blocks for RADIO / InternViT-300M) and their kind (AIMv2's RMSNorm),
    qkv and projection biases, layer scale, positions (DINOv3's rotary ones once it is said they are: its weights
    cannot); and its head count, taken from the registered model of its shapes; where two registered models of the same
    shapes differ in heads (ViT-B/16 gap has 16, SigLIP-B/16 gap 12), the guess names the other's flag."""
    from vitfast.convert import timm_config, timm_layout

    arch = ("embed_dim", "depth", "num_heads", "mlp_hidden", "mlp_layer", "class_token", "distilled", "reg_tokens", "no_embed_class",
            "global_pool", "use_fc_norm", "final_norm", "pre_norm", "qkv_bias", "hybrid_layers", "representation_size",
            "num_classes", "grid_size", "patch_size", "norm_layer", "embed_norm", "proj_bias", "abs_pos_embed", "rope", "rope_base", "rope_ref_grid", "rope_grid_indexing", "scale_attn_norm", "scale_mlp_norm")  # fmt: skip
    wrong = {}
    for name in vitfast.list_models():
        truth = vitfast.get_config(name)
        with torch.device("meta"):
            sd = vitfast.create_model(truth).state_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sd, family = timm_layout(sd, name, rope=truth.rope)
            cfg, guesses = timm_config(sd, family)
        got, want = ({k: getattr(c, k) for k in arch} | {"layer_scale": c.init_values is not None} for c in (cfg, truth))
        if got["num_heads"] != want["num_heads"] and f"--num-heads {want['num_heads']} " in guesses["num_heads"]:
            got["num_heads"] = want["num_heads"]
        if got != want:
            wrong[name] = {k: (got[k], want[k]) for k in got if got[k] != want[k]}
    assert not wrong


def test_an_eva02_saved_in_vitfast_names_takes_its_rotary_positions_from_the_registered_eva02_and_says_so(tmp_path):
    """vitfast's names hold nothing eva.py-specific: an EVA-02's bare state dict in them looks like a ViT with learned
    positions only. The registered model of its shapes has rotary ones too, so they are taken from it, said loudly (a
    plain ViT of those shapes would answer something else, silently)."""
    truth = vitfast.get_config("eva02_tiny_patch14_336", img_size=56, num_classes=5)  # its 12 blocks: matched by shapes
    source = randomize(vitfast.create_model(truth))
    torch.save(source.state_dict(), tmp_path / "w.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"rope='axial' \(rotary positions are not stored in weights; eva02_tiny_patch14_"):
        loaded = vitfast.load_checkpoint(tmp_path / "w.pth")
    assert (loaded.config.rope, loaded.config.rope_ref_grid, loaded.config.rope_base) == ("axial", (16, 16), 10000.0)
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))
    with pytest.warns(vitfast.GuessedConfigWarning):  # what the guess says to pass if it has none: the rotary settings go too
        plain = vitfast.load_checkpoint(tmp_path / "w.pth", overrides={"rope": None})
    assert (plain.config.rope, plain.config.rope_ref_grid, plain.config.rope_theta, plain.rope) == (None, None, None, None)


def test_a_rope_vit_with_learned_positions_in_vitfast_names_says_it_could_be_one_and_loads_as_one_when_told(tmp_path):
    """Naver's RoPE-ViT with learned positions (_ape) has DeiT-III's shapes, and vitfast's names hold nothing rotary: read
    as the plain ViT the registered model of its shapes is, the load says that a RoPE-ViT has them too and how to say it
    is one; {"rope": "axial"} then gives Naver's whole rotary form (base 100, x's frequencies first), read off the keys."""
    truth = vitfast.get_config("vit_small_patch16_rope_ape_224", img_size=48, num_classes=5)  # its 12 blocks: matched by shapes
    source = randomize(vitfast.create_model(truth))
    torch.save(source.state_dict(), tmp_path / "w.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"rope=None \(.*none assumed.*vit_small_patch16_rope_ape_224, of the same shapes, has them"):
        plain = vitfast.load_checkpoint(tmp_path / "w.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"rope_theta=100.0, rope_ref_grid=None, rope_grid_indexing='xy' \(.*vit_small_patch16_rope_ape_224's assumed: axial, base 100, .*x's"):
        told = vitfast.load_checkpoint(tmp_path / "w.pth", overrides={"rope": "axial"})
    assert (told.config.rope_base, told.config.rope_grid_indexing, told.config.rope_ref_grid) == (100.0, "xy", None)
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(told(x), source(x))
        assert (plain(x) - source(x)).abs().max() > 1e-3


def test_an_sbb_rope_vit_in_vitfast_names_needs_its_rotary_positions_named_and_then_takes_its_family_s(tmp_path):
    """No learned positions and nothing rotary in vitfast's names: the load stops and says which fields to pass; with
    {"rope": "axial"}, the keys (registers, no class token, layer scale, a GELU MLP) say timm's sbb RoPE ViT, whose
    reference grid and base it then takes, said, with the image size (rotary positions fit any)."""
    truth = vitfast.get_config("vit_medium_patch16_rope_reg1_gap_256", num_classes=5)
    source = randomize(vitfast.create_model(truth))
    torch.save(source.state_dict(), tmp_path / "w.pth")
    with pytest.raises(vitfast.CheckpointError, match=r'no learned position embeddings.*\{"rope": "axial"\}'):
        vitfast.load_checkpoint(tmp_path / "w.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"img_size=256 .*rope_theta=None, rope_ref_grid=\[16, 16\], rope_grid_indexing='ij' \(.*16x16 grid, y's"):
        loaded = vitfast.load_checkpoint(tmp_path / "w.pth", overrides={"rope": "axial"})
    assert (loaded.config.rope_base, loaded.config.rope_ref_grid, loaded.config.reg_tokens) == (10000.0, (16, 16), 1)
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        assert torch.equal(loaded(x), source(x))


def test_dropping_rotary_positions_by_override_drops_all_their_settings(tmp_path):
    """overrides={"rope": None} on a model with every rotary setting set (a PE core's offset, axis order, grid and base)
    loads it without rotary positions, not with settings that no longer mean anything (which the config refuses)."""
    cfg = vitfast.get_config("vit_pe_core_tiny_patch16_384", img_size=32, depth=1)
    source = vitfast.create_model(cfg.replace(rope_theta=50.0))
    vitfast.save_checkpoint(source, tmp_path / "pe.safetensors")
    plain = vitfast.load_checkpoint(tmp_path / "pe.safetensors", overrides={"rope": None})
    settings, defaults = ("rope", *vitfast.config.ROPE_SETTINGS), vitfast.ViTConfig()
    assert plain.rope is None
    assert [getattr(plain.config, k) for k in settings] == [getattr(defaults, k) for k in settings]


def test_the_crop_mode_a_state_dict_cannot_state_is_said_to_be_assumed():
    """timm preprocesses some models by squashing the image (vit_medium_patch16_gap_384, the CLIP 336/384 px towers): a bare
    state dict cannot say so, and the centre crop assumed for it is reported beside the other preprocessing guesses."""
    from vitfast.convert import infer_timm_config

    names = [n for n in vitfast.list_models() if vitfast.get_config(n).crop_mode == "squash" and not vitfast.get_config(n).rope]
    assert names
    for name in names:
        with torch.device("meta"):
            sd = vitfast.create_model(name).state_dict()
        cfg, guesses = infer_timm_config(sd)
        assert cfg.crop_mode == "center" and "crop_mode" in guesses, name


def test_a_siglip_tower_takes_its_gelu_form_from_the_registered_tower_of_its_shapes_and_says_so(tmp_path, monkeypatch):
    """timm builds some SigLIP towers with the tanh GELU and others of the same shapes with erf, attention-pooled ("map")
    and gap alike; the weights cannot tell. A bare state dict takes the form of the registered tower of its shapes and
    patch size, and says it is a guess: the gap towers used to load with erf GELU, silently."""
    from vitfast import registry
    from vitfast.convert import infer_timm_config

    for name in (n for n in vitfast.list_models() if "siglip" in n):
        with torch.device("meta"):
            sd = vitfast.create_model(name).state_dict()
        cfg, guesses = infer_timm_config(sd)
        assert cfg.act_layer == vitfast.get_config(name).act_layer and "act_layer" in guesses, name
    # the whole load, on a registered tanh gap tower small enough to build: the same outputs
    twin = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, class_token=False, global_pool="avg", fc_norm=False,
                num_classes=0, act_layer="gelu_tanh")  # fmt: skip
    monkeypatch.setitem(registry._REGISTRY, "vit_tiny_patch8_siglip_gap_32", twin)
    torch.manual_seed(0)
    model = randomize(vitfast.create_model("vit_tiny_patch8_siglip_gap_32")).eval()
    torch.save(model.state_dict(), tmp_path / "w.pth")
    with pytest.warns(vitfast.GuessedConfigWarning, match=r"act_layer='gelu_tanh' \(.*vit_tiny_patch8_siglip_gap_32"):
        loaded = vitfast.load_checkpoint(tmp_path / "w.pth")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_a_pre_norm_tower_with_an_attention_pool_and_no_final_norm_is_refused(tmp_path):
    """A pre-norm tower is read as a Perception Encoder by what follows its blocks (an attention pool and a final norm: core;
    nothing: spatial), as its rotary positions do not show in its keys; a pool without a final norm is neither, so it is
    refused, not guessed."""
    cfg = vitfast.get_config("vit_pe_core_tiny_patch16_384", img_size=32, depth=1, final_norm=False)
    torch.save(vitfast.create_model(cfg).state_dict(), tmp_path / "w.pth")
    with pytest.raises(vitfast.CheckpointError, match="attention pool without a final norm"):
        vitfast.load_checkpoint(tmp_path / "w.pth")
